"""The fence: a job's outcome is written only by the worker that still holds its lease.

RQ finishes a job (success, failure, ``Retry``, stop) by queueing its writes in one
MULTI/EXEC pipeline. While :func:`fenced` is active, such a pipeline does not send those
writes unchecked. When a read of the job hash under a WATCH of it shows the lease held
and untouched (RQ's success path reads right after its own WATCH; a run's start reads
first), they go as RQ's MULTI/EXEC with the lease's release appended, the WATCH making
read and write one transaction (:mod:`rq_emq.fence.watched_commit`). Otherwise they are
packed, unchanged, into one EVALSHA of ``finish_job`` that checks the lease owner against
the evidence, runs them and releases the lease, atomically. RQ's semantics are kept to
the command, and a worker that lost its lease writes nothing at all. A WATCH that RQ set
(dependents) still guards the transaction either way: the EVALSHA is sent inside
MULTI/EXEC on the watched connection.

Only a transaction that writes is the outcome: RQ reads inside transactions too (RQ 3
fetches a job's dependents with a MULTI/EXEC of ``HGETALL`` commands before its outcome), and
such a read passes through unfenced. Once a fenced transaction has failed (a connection
blip), no later transaction of the block may stand in for it: each raises the same error,
and the block's owner retries the whole finish.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cache
from typing import Any

from redis import Redis
from redis.client import Pipeline
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoPermissionError, ResponseError, WatchError
from redis.exceptions import TimeoutError as RedisTimeoutError

from .. import compat, malformed, scripts
from ..keys import RQ_PREFIX, QueueKeys
from . import watched_commit
from .packing import (
    MAX_PACKED_ARGS,
    command_name,
    merge_replies,
    pack,
    reads_only,
    resp2_callbacks,
    split,
    start_record,
    text,
)
from .watched_commit import WatchedCommitMixin, pool_connection

logger = logging.getLogger("rq_emq.lease")

# Commands Lua cannot run inside a script; a batch holding one is committed the slow way.
_NOT_IN_SCRIPTS = frozenset({"EVAL", "EVALSHA", "EVAL_RO", "EVALSHA_RO", "SCRIPT", "FCALL", "MULTI", "EXEC"})


class LeaseLost(Exception):
    """A finish was refused because the worker no longer holds the job's lease."""

    def __init__(self, queue: str, job_id: str) -> None:
        super().__init__(f"lease on job {job_id} (queue {queue}) is lost; its outcome was not written")
        self.queue = queue
        self.job_id = job_id


@dataclass(frozen=True)
class Fence:
    """What proves ownership of one in-flight job: its queue, id and lease token."""

    queue: str
    job_id: str
    token: str
    #: The stats counter an outcome written under this fence counts in.
    counter: str = "finished"
    #: The job's own max attempts, recorded by the first guarded write ("" for none).
    max_attempts: str = ""
    #: A guarded write that changes the job's RQ status (the run's start) records it as
    #: the lease's own (``emq_status``); the worker's execution record does not need to.
    records_status: bool = True
    #: Where the job and its queue live; None: RQ's default layout for ``queue``.
    layout: QueueKeys | None = None
    #: The run's pinned started-registry entry (``<job_id>:<execution_id>``), recorded on
    #: the job hash with the run's start ("" when this process does not know it).
    started_entry: str = ""

    @property
    def job_key(self) -> str:
        return self.keys[0]

    @property
    def keys(self) -> list[str]:
        q = self.layout if self.layout is not None else QueueKeys(self.queue)
        return [q.job(self.job_id), q.lock(self.job_id), q.leases, q.stalled, q.stats, q.rq_queue]

    def release(self, client: Redis) -> bool:
        """Release the lease without writing anything else; False when it was not ours."""
        args = [self.job_id, self.token, RQ_PREFIX, self.counter, 0]
        reply = scripts.load("finish_job")(client, self.keys, args)
        malformed.report(reply[-1])
        return bool(reply and int(reply[0]) == 1)

    def lost(self, what: str = "outcome discarded (fenced finish)") -> LeaseLost:
        logger.warning(
            "job %s on queue %s: lease lost, %s",
            self.job_id,
            self.queue,
            what,
            extra={"job_id": self.job_id, "queue": self.queue},
        )
        return LeaseLost(self.queue, self.job_id)

    def ended(self, status: str) -> LeaseLost:
        logger.warning(
            "job %s on queue %s: RQ ended it while it was leased (status %s); left as RQ put it, "
            "this worker's writes discarded",
            self.job_id,
            self.queue,
            status or "unknown",
            extra={"job_id": self.job_id, "queue": self.queue},
        )
        return LeaseLost(self.queue, self.job_id)


class FencedSession:
    """One fenced block: its first writing transaction is checked (and, for a finish,
    releases the lease); later ones follow it. What happened is kept here, because RQ's
    code may swallow what the fence raised (RQ 3's ``handle_job_failure`` logs and goes on)."""

    def __init__(self, fence: Fence, release: bool, on_commit: Callable[[], None] | None = None) -> None:
        self.fence = fence
        self.release = release
        #: Called the moment a releasing commit is known to have landed (RQ's code after it,
        #: such as enqueuing dependents, is bookkeeping, no longer a run of the job).
        self.on_commit = on_commit
        self.committed = False
        self.refused = False
        #: The job's status when the refusal was because RQ or an operator changed it.
        self.ended_status: str | None = None
        #: The error that failed the fenced transaction (a blip); later ones raise it too.
        self.error: BaseException | None = None
        #: Exceptions the fence raised into RQ's code in this block.
        self.raised: list[BaseException] = []
        #: Refuse the whole transaction, writing nothing, when MULTI would refuse one of its
        #: commands as it is queued (unknown, wrong arity, ACL), as EXEC aborts then: a
        #: job's own pipeline, whose commands are anyone's. RQ's own commands are RQ's: not
        #: looked at (one command less per write).
        self.check_queued = False
        #: Where a writing transaction is held back instead of sent (None: sent): the
        #: worker's execution record, which rides in the run's start (``ahead``).
        self.hold_back: list[Any] | None = None
        #: Commands an earlier block held back, sent ahead of this block's transaction in
        #: its one script call; their replies are not this transaction's.
        self.ahead: list[Any] = []

    def mark_committed(self) -> None:
        self.committed = True
        if self.release and self.on_commit is not None:
            self.on_commit()

    def refuse(self, ended_status: str | None = None) -> LeaseLost:
        self.refused = True
        self.ended_status = ended_status
        if ended_status is not None:
            return self._raise(self.fence.ended(ended_status))
        if self.release:
            return self._raise(self.fence.lost())
        return self._raise(self.fence.lost("its bookkeeping discarded (guarded write)"))

    def _raise(self, error: LeaseLost) -> LeaseLost:
        self.raised.append(error)
        return error


class FencedPipelineMixin(WatchedCommitMixin):
    """Turns a transaction's queued commands into a watched commit (watched_commit.py) or
    one fenced script call, and sends RQ's ``WATCH`` with the read that follows it (RQ's
    finish watches a job's dependents key, then reads it), the job hash's WATCH and lease
    read riding with them: one round trip for all."""

    _emq_session: FencedSession
    #: Keys to WATCH, not sent yet: they go ahead of the next command sent at once.
    _emq_watch: tuple[Any, ...] | None = None
    #: The lease's fields as read right after a WATCH of the job hash that still holds
    #: (no EXEC or reset since): what a watched finish commits on (watched_commit.py).
    _emq_lease_read: list[Any] | None = None

    def watch(self, *names: Any) -> Any:
        pipe: Any = self
        if pipe.explicit_transaction or pipe.watching:
            return super().watch(*names)  # type: ignore[misc]
        self._emq_watch = names
        pipe.watching = True  # redis-py sends what follows at once, until MULTI
        return True

    def immediate_execute_command(self, *args: Any, **options: Any) -> Any:
        names, self._emq_watch = self._emq_watch, None
        if names is None:
            return super().immediate_execute_command(*args, **options)  # type: ignore[misc]
        return self._watch_with(names, args, options)

    def _watch_with(self, names: tuple[Any, ...], args: tuple[Any, ...], options: dict[str, Any]) -> Any:
        """The WATCH and the command after it in one send; RQ's error as redis-py gives it
        (a connection lost while watching: WatchError, which RQ's loop retries)."""
        pipe: Any = self
        if pipe.connection is None:
            pipe.connection = pool_connection(pipe.connection_pool)
        conn = pipe.connection
        session = self._emq_session
        fence = session.fence
        # a finish's WATCH takes the job hash too, and its lease is read in the same send
        reads_lease = (
            session.release
            and not session.committed
            and fence.counter == "finished"
            and compat.SUCCESS_LOOP_RETRIES_WHOLE
        )
        keys = (*names, fence.job_key) if reads_lease else names
        sent = [("WATCH", *keys), args]
        if reads_lease:
            sent.append(("HMGET", fence.job_key, *watched_commit.LEASE_FIELDS))
        self._emq_lease_read = None
        try:
            conn.send_packed_command(conn.pack_commands(sent))
            watched: Exception | None = None
            try:
                pipe.parse_response(conn, "WATCH")
            except ResponseError as error:
                watched = error
            try:
                reply = pipe.parse_response(conn, args[0], **options)
            except ResponseError:
                # an error reply leaves the connection in step: the lease's reply follows
                if reads_lease:
                    pipe.parse_response(conn, "HMGET")
                raise
            # (a connection error closed the connection: nothing more is read from it)
            lease = pipe.parse_response(conn, "HMGET") if reads_lease else None
            if watched is None and isinstance(lease, list):
                self._emq_lease_read = lease
        except (RedisConnectionError, RedisTimeoutError) as error:
            conn.disconnect()
            pipe.reset()
            raise WatchError(f"A {type(error).__name__} occurred while watching one or more keys") from error
        except ResponseError:
            raise  # both replies read: the connection is as redis-py would leave it
        except BaseException:
            conn.disconnect()  # a reply may be left unread
            pipe.reset()
            raise
        if watched is not None:
            raise watched
        return reply

    def reset(self) -> None:
        self._emq_watch = None
        self._emq_lease_read = None
        super().reset()  # type: ignore[misc]

    def execute(self, raise_on_error: bool = True) -> list[Any]:
        pipe: Any = self
        names, self._emq_watch = self._emq_watch, None
        if names is not None:  # nothing read since the WATCH: it goes alone, as before
            super().immediate_execute_command("WATCH", *names)  # type: ignore[misc]
        commands = list(pipe.command_stack)
        session = self._emq_session
        if not pipe.transaction or not commands or session.committed or reads_only(commands):
            # reads, and RQ's steps after the outcome (enqueueing dependents), run as they would
            self._emq_lease_read = None  # its EXEC ends every WATCH of the connection
            return super().execute(raise_on_error)  # type: ignore[misc]
        if session.hold_back is not None:
            session.hold_back.extend(commands)
            pipe.reset()
            return [None] * len(commands)
        fence = session.fence
        if session.refused:
            pipe.reset()
            raise session._raise(LeaseLost(fence.queue, fence.job_id))
        if session.error is not None:
            pipe.reset()
            raise session.error
        ahead = session.ahead
        if ahead:
            commands = [*ahead, *commands]
            pipe.command_stack = commands
        try:
            return self._execute_fenced(commands, raise_on_error)[len(ahead) :]
        except (LeaseLost, WatchError):
            raise  # a WATCH that fired wrote nothing: RQ's loop retries the same block
        except Exception as error:
            session.error = error
            session.raised.append(error)
            raise

    def _execute_fenced(self, commands: list[Any], raise_on_error: bool) -> list[Any]:
        pipe: Any = self
        session = self._emq_session
        fence = session.fence
        lease, self._emq_lease_read = self._emq_lease_read, None
        if (
            lease is not None
            and session.release
            and pipe.watching
            and watched_commit.held(lease, fence.token)
            and watched_commit.keeps_job(commands, fence.job_key)
        ):
            release = watched_commit.release_commands(fence.keys, fence.job_id, fence.token, fence.counter)
            replies = self._execute_watched([(args, options) for args, options in commands], release)
            if replies is None:
                raise WatchError("Watched variable changed.")  # as redis-py's own EXEC: RQ's loop retries
            return self._raise_first(commands, replies, raise_on_error)
        pieces = [split(args) for args, _ in commands]
        if any(command_name(args) in _NOT_IN_SCRIPTS for args, _ in commands) or any(
            len(words) > MAX_PACKED_ARGS for parts, _ in pieces for words in parts
        ):
            return self._execute_checked(commands, raise_on_error)
        script, keys = scripts.load("finish_job" if session.release else "guard_job_write"), fence.keys
        if session.release:
            packed: list[Any] = [fence.job_id, fence.token, RQ_PREFIX, fence.counter]
        else:
            record = start_record(fence, commands, pieces)
            # under a WATCH of RQ's own, an aborted EXEC must reach RQ: the script keeps it so
            kept = watched_commit.keeps_job(commands, fence.job_key) and not pipe.watching
            if record[1] == "0" and not session.check_queued and kept:
                replies = self._guard_watched(commands, pieces, record[0])
                if replies is not None:
                    return self._raise_first(commands, merge_replies(pieces, replies), raise_on_error)
            packed = [fence.job_id, fence.token, RQ_PREFIX, *record]
            packed.append("1" if session.check_queued else "0")
        packed.extend(pack(pieces))
        watching = bool(pipe.watching)
        for attempt in (1, 2):
            pipe.command_stack = []
            pipe.pipeline_execute_command("EVALSHA", script.sha, len(keys), *keys, *packed)
            (reply,) = self._send_script(watching)
            if not scripts.is_noscript(reply) or attempt == 2:
                break
            script.load(Redis(connection_pool=pipe.connection_pool))
            if watching:
                # The WATCH was spent by that EXEC; RQ's retry loop starts over.
                raise WatchError(f"{script.name} script was not loaded; retry")
        if isinstance(reply, Exception):
            raise reply
        malformed.report(reply[-1])
        outcome = int(reply[0])
        if outcome == 3:
            raise self._refused_at_queue(commands, pieces, int(reply[1]), text(reply[2]))
        if outcome == 2:
            raise session.refuse(ended_status=text(reply[1]))
        if outcome != 1:
            raise session.refuse()
        session.mark_committed()
        replies = merge_replies(pieces, list(reply[1]))
        return self._apply_callbacks(commands, replies, raise_on_error)

    def _refused_at_queue(
        self, commands: list[Any], pieces: list[tuple[list[list[Any]], str]], part: int, error: str
    ) -> ResponseError:
        """The error MULTI gave the command refused as it was queued (the script's packed
        ``part``, 1-based), annotated as redis-py annotates it; EXEC aborted, nothing written."""
        pipe: Any = self
        pipe.reset()
        # the command whose packed parts (a long variadic command is split) hold ``part``
        ends = [len(parts) for parts, _ in pieces]
        index = next(i for i in range(len(ends)) if part <= sum(ends[: i + 1]))
        code, _, message = error.partition(" ")
        exception = NoPermissionError(message) if code == "NOPERM" else ResponseError(error)
        pipe.annotate_exception(exception, index + 1, commands[index][0])
        return exception

    def _send_script(self, watching: bool) -> list[Any]:
        """Send the one EVALSHA: inside MULTI/EXEC only when RQ WATCHes a key (its
        dependents check), which the EXEC then guards; otherwise alone, since a script
        is atomic already (MULTI and EXEC would be two more commands for nothing)."""
        pipe: Any = self
        if watching:
            return list(super().execute(raise_on_error=False))  # type: ignore[misc]
        transaction = pipe.transaction
        pipe.transaction = pipe.explicit_transaction = False
        try:
            return list(super().execute(raise_on_error=False))  # type: ignore[misc]
        finally:
            pipe.transaction = transaction

    def _execute_checked(self, commands: list[Any], raise_on_error: bool) -> list[Any]:
        # Scripting commands cannot be nested in our script: check, commit, then release.
        # The check and the commit are not one step; such batches are rare in finish code.
        pipe: Any = self
        session = self._emq_session
        fence = session.fence
        client = Redis(connection_pool=pipe.connection_pool)
        owner = client.hget(fence.job_key, "emq_token")
        if owner is None or (owner.decode() if isinstance(owner, bytes) else owner) != fence.token:
            pipe.reset()
            raise session.refuse()
        result = super().execute(raise_on_error)  # type: ignore[misc]
        session.mark_committed()
        if session.release:
            fence.release(client)
        return list(result)

    def _apply_callbacks(self, commands: list[Any], replies: list[Any], raise_on_error: bool) -> list[Any]:
        # Lua hands back RESP2 shapes whatever the client's protocol, so parse them as RESP2.
        self._raise_first(commands, replies, raise_on_error)
        callbacks = resp2_callbacks()
        data: list[Any] = []
        for (args, options), reply in zip(commands, replies, strict=True):
            if isinstance(reply, ResponseError):
                data.append(reply)
                continue
            options = {k: v for k, v in options.items() if k not in ("keys", "EMPTY_RESPONSE")}
            callback = callbacks.get(command_name(args, words=2)) or callbacks.get(command_name(args))
            data.append(callback(reply, **options) if callback else reply)
        return data


@cache
def fenced_class(base: type) -> type:
    return type(f"Fenced{base.__name__}", (FencedPipelineMixin, base), {})


def prepare(connection: Redis) -> None:
    """Build now what the first fenced finish would build, so that a forked horse, whose
    first finish is its only one, inherits it instead of building it per job."""
    resp2_callbacks()
    pipe = connection.pipeline()
    fenced_class(type(pipe))
    pipe.reset()


@contextmanager
def fenced(
    connection: Redis,
    fence: Fence,
    release: bool = True,
    on_commit: Callable[[], None] | None = None,
    hold_back: list[Any] | None = None,
    ahead: list[Any] | None = None,
) -> Iterator[FencedSession]:
    """Within this block, the first transaction that writes, opened on ``connection``,
    commits only while ``fence`` holds the lease, and (``release``) releases it;
    transactions after a refused or failed one are refused too, and those after a
    committed one run unchanged. With ``hold_back``, writing transactions are not sent but
    appended there (their replies None); ``ahead`` (commands held back so) is sent in the
    first writing transaction's script call, before its own commands."""
    original = connection.pipeline
    session = FencedSession(fence, release, on_commit)
    session.hold_back = hold_back
    session.ahead = list(ahead or ())

    def pipeline(*args: Any, **kwargs: Any) -> Pipeline:
        pipe = original(*args, **kwargs)
        if getattr(pipe, "transaction", False) is True:
            pipe.__class__ = fenced_class(type(pipe))
            pipe._emq_session = session  # type: ignore[attr-defined]
        return pipe

    connection.pipeline = pipeline  # type: ignore[method-assign]
    try:
        yield session
    finally:
        del connection.pipeline
