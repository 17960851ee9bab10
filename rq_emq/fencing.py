"""The fence: a job's outcome is written only by the worker that still holds its lease.

RQ finishes a job (success, failure, ``Retry``, stop) by queueing its writes in one
MULTI/EXEC pipeline. While :func:`fenced` is active, such a pipeline does not send those
writes as they are: it packs them, unchanged, into one EVALSHA of ``finish_job`` that
checks the lease owner, runs them and releases the lease, atomically. RQ's semantics are
kept to the command, and a worker that lost its lease writes nothing at all. A WATCH
that RQ set (dependents) still guards the transaction, since the EVALSHA is sent inside
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
from redis.exceptions import ResponseError, WatchError

from . import compat, scripts
from .keys import QueueKeys

logger = logging.getLogger("rq_emq.lease")

# Commands Lua cannot run inside a script; a batch holding one is committed the slow way.
_NOT_IN_SCRIPTS = frozenset({"EVAL", "EVALSHA", "EVAL_RO", "EVALSHA_RO", "SCRIPT", "FCALL", "MULTI", "EXEC"})

# Commands that only read: a transaction of nothing else is not an outcome. Anything not
# listed counts as a write, so an unknown command is fenced rather than let through.
_READ_ONLY = frozenset(
    """GET MGET STRLEN GETRANGE EXISTS TYPE TTL PTTL HGET HGETALL HMGET HEXISTS HLEN HKEYS HVALS
    HSTRLEN SMEMBERS SISMEMBER SMISMEMBER SCARD ZSCORE ZMSCORE ZRANGE ZRANGEBYSCORE ZREVRANGE
    ZREVRANGEBYSCORE ZCARD ZCOUNT ZRANK ZREVRANK LRANGE LLEN LINDEX LPOS XRANGE XREVRANGE XLEN
    SCAN HSCAN SSCAN ZSCAN PING TIME DBSIZE""".split()
)

# A packed command's arguments reach redis.call through Lua's unpack, which fails past
# about 8000 values (after the commands before it ran: a half-run outcome). Longer
# variadic commands are sent as several of at most this many arguments each.
MAX_PACKED_ARGS = 1000

# Variadic commands that split into several of the same: words before the repeated part
# (the name included), the size of one repeated item, and how the replies combine.
_SPLITTABLE: dict[str, tuple[int, int, str]] = {
    "DEL": (1, 1, "sum"),
    "UNLINK": (1, 1, "sum"),
    "SADD": (2, 1, "sum"),
    "SREM": (2, 1, "sum"),
    "ZREM": (2, 1, "sum"),
    "HDEL": (2, 1, "sum"),
    "HSET": (2, 2, "sum"),
    "LPUSH": (2, 1, "last"),
    "RPUSH": (2, 1, "last"),
    "ZADD": (2, 2, "sum"),
}
_ZADD_FLAGS = frozenset({"NX", "XX", "GT", "LT", "CH"})


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

    @property
    def job_key(self) -> str:
        return self.keys[0]

    @property
    def keys(self) -> list[str]:
        q = self.layout if self.layout is not None else QueueKeys(self.queue)
        return [q.job(self.job_id), q.lock(self.job_id), q.leases, q.stalled, q.stats]

    def release(self, client: Redis) -> bool:
        """Release the lease without writing anything else; False when it was not ours."""
        reply = scripts.load("finish_job")(client, self.keys, [self.job_id, self.token, self.counter, 0])
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
        #: The error that failed the fenced transaction (a blip); later ones raise it too.
        self.error: BaseException | None = None
        #: Exceptions the fence raised into RQ's code in this block.
        self.raised: list[BaseException] = []

    def mark_committed(self) -> None:
        self.committed = True
        if self.release and self.on_commit is not None:
            self.on_commit()

    def refuse(self, ended_status: str | None = None) -> LeaseLost:
        self.refused = True
        if ended_status is not None:
            return self._raise(self.fence.ended(ended_status))
        if self.release:
            return self._raise(self.fence.lost())
        return self._raise(self.fence.lost("its bookkeeping discarded (guarded write)"))

    def _raise(self, error: LeaseLost) -> LeaseLost:
        self.raised.append(error)
        return error


class _FencedPipelineMixin:
    """Turns a transaction's queued commands into one fenced ``finish_job`` call."""

    _emq_session: FencedSession

    def execute(self, raise_on_error: bool = True) -> list[Any]:
        pipe: Any = self
        commands = list(pipe.command_stack)
        session = self._emq_session
        if not pipe.transaction or not commands or session.committed or _reads_only(commands):
            # reads, and RQ's steps after the outcome (enqueueing dependents), run as they would
            return super().execute(raise_on_error)  # type: ignore[misc]
        fence = session.fence
        if session.refused:
            pipe.reset()
            raise session._raise(LeaseLost(fence.queue, fence.job_id))
        if session.error is not None:
            pipe.reset()
            raise session.error
        try:
            return self._execute_fenced(commands, raise_on_error)
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
        pieces = [_split(args) for args, _ in commands]
        if any(_command_name(args) in _NOT_IN_SCRIPTS for args, _ in commands) or any(
            len(words) > MAX_PACKED_ARGS for parts, _ in pieces for words in parts
        ):
            return self._execute_checked(commands, raise_on_error)
        script, keys = scripts.load("finish_job" if session.release else "guard_job_write"), fence.keys
        if session.release:
            packed: list[Any] = [fence.job_id, fence.token, fence.counter]
        else:
            packed = [fence.job_id, fence.token, *_start_record(fence, commands, pieces)]
        packed.append(sum(len(parts) for parts, _ in pieces))
        for parts, _ in pieces:
            for words in parts:
                packed.append(len(words))
                packed.extend(words)
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
        outcome = int(reply[0])
        if outcome == 2:
            raise session.refuse(ended_status=_text(reply[1]))
        if outcome != 1:
            raise session.refuse()
        session.mark_committed()
        replies = _merge_replies(pieces, list(reply[1]))
        return self._apply_callbacks(commands, replies, raise_on_error)

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
        callbacks = _resp2_callbacks()
        data: list[Any] = []
        for index, ((args, options), reply) in enumerate(zip(commands, replies, strict=True)):
            if isinstance(reply, ResponseError):
                if raise_on_error:
                    raise type(reply)(
                        f"Command # {index + 1} ({_command_name(args)}) of pipeline caused error: {reply}"
                    )
                data.append(reply)
                continue
            options = {k: v for k, v in options.items() if k not in ("keys", "EMPTY_RESPONSE")}
            callback = callbacks.get(_command_name(args, words=2)) or callbacks.get(_command_name(args))
            data.append(callback(reply, **options) if callback else reply)
        return data


def _reads_only(commands: list[Any]) -> bool:
    return all(_command_name(args) in _READ_ONLY for args, _ in commands)


#: Commands on the job hash that leave its ``status`` field as it was.
_KEEP_FIELDS = frozenset(
    {"PERSIST", "EXPIRE", "PEXPIRE", "EXPIREAT", "PEXPIREAT", "HGET", "HMGET", "HGETALL"}
)


def _start_record(fence: Fence, commands: list[Any], pieces: list[tuple[list[list[Any]], str]]) -> list[str]:
    """``guard_job_write``'s max attempts and status arguments: what it records on the job
    hash with RQ's commands. When RQ's last HSET of the job's status is known here, the
    status it writes (and the job's own max attempts) ride in that very HSET, which
    changes the job hash in the same way as the script's own write after it would, one
    command fewer; else the script records them itself."""
    if not fence.records_status:
        return [fence.max_attempts, "0"]
    status, at = _status_written(fence.keys[0], commands)
    if status is None or at is None or pieces[at][1] != "one":
        return [fence.max_attempts, "1" if status is None else "=" + status]
    extra = ["emq_status", status]
    if fence.max_attempts:
        extra += ["emq_max_attempts", fence.max_attempts]
    pieces[at][0][0].extend(extra)
    return ["", "0"]


def _status_written(key: str, commands: list[Any]) -> tuple[str | None, int | None]:
    """The RQ status ``commands`` leave on the job hash ``key`` and the index of the HSET
    that writes it, when nothing but plain HSETs (and expiry changes, reads) touch the
    hash; else (None, None): the script reads the status back, the only sure answer then."""
    keys = (key, key.encode())  # a pickled job's data need not decode: compare as sent
    status: str | None = None
    at: int | None = None
    for index, (args, _) in enumerate(commands):
        if not any(word in keys for word in args[1:] if isinstance(word, (str, bytes))):
            continue
        name = _command_name(args)
        if name in _KEEP_FIELDS and args[1] in keys:
            continue
        if name != "HSET" or args[1] not in keys or len(args) % 2:
            return None, None
        for field, value in zip(args[2::2], args[3::2], strict=True):
            if field in ("status", b"status"):
                status, at = _sent(value), index
    return (status, at) if status is not None else (None, None)


def _sent(value: Any) -> str | None:
    """A command argument as redis-py sends it (RQ's statuses are str enums: their text
    is the value, not what ``str()`` of the member says); None for other types."""
    if isinstance(value, bytes):
        return value.decode()
    if isinstance(value, str):
        return value.encode().decode()
    return None


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _split(args: tuple[Any, ...]) -> tuple[list[list[Any]], str]:
    """One queued command as the packed commands that carry it, and how their replies
    combine ("one": a single command)."""
    words = _split_name(args)
    name = _text(words[0]).upper()
    rule = _SPLITTABLE.get(name)
    if rule is None or len(words) <= MAX_PACKED_ARGS:
        return [words], "one"
    head_len, item, combine = rule
    if name == "ZADD":
        while head_len < len(words) and _text(words[head_len]).upper() in _ZADD_FLAGS:
            head_len += 1
    head, body = words[:head_len], words[head_len:]
    step = max(item, (MAX_PACKED_ARGS - head_len) // item * item)
    return [[*head, *body[i : i + step]] for i in range(0, len(body), step)], combine


def _merge_replies(pieces: list[tuple[list[list[Any]], str]], replies: list[Any]) -> list[Any]:
    merged: list[Any] = []
    at = 0
    for parts, combine in pieces:
        mine = replies[at : at + len(parts)]
        at += len(parts)
        errors = [reply for reply in mine if isinstance(reply, ResponseError)]
        if combine == "one":
            merged.append(mine[0])
        elif errors:
            merged.append(errors[0])
        elif combine == "sum":
            merged.append(sum(int(reply) for reply in mine))
        else:
            merged.append(mine[-1])
    return merged


def _command_name(args: tuple[Any, ...], words: int = 1) -> str:
    first = args[0]
    text = first.decode() if isinstance(first, bytes) else str(first)
    return " ".join(text.upper().split()[:words])


@cache
def _resp2_callbacks() -> dict[str, Any]:
    return {name.upper(): callback for name, callback in compat.resp2_callbacks().items()}


def _split_name(args: tuple[Any, ...]) -> list[Any]:
    # redis-py lets a command name carry literal words ("CONFIG GET"); Lua wants them apart.
    first = args[0]
    words: list[Any] = first.split() if isinstance(first, str) else [first]
    return [*words, *args[1:]]


@cache
def _fenced_class(base: type) -> type:
    return type(f"Fenced{base.__name__}", (_FencedPipelineMixin, base), {})


def prepare(connection: Redis) -> None:
    """Build now what the first fenced finish would build, so that a forked horse, whose
    first finish is its only one, inherits it instead of building it per job."""
    _resp2_callbacks()
    pipe = connection.pipeline()
    _fenced_class(type(pipe))
    pipe.reset()


@contextmanager
def fenced(
    connection: Redis, fence: Fence, release: bool = True, on_commit: Callable[[], None] | None = None
) -> Iterator[FencedSession]:
    """Within this block, the first transaction that writes, opened on ``connection``,
    commits only while ``fence`` holds the lease, and (``release``) releases it;
    transactions after a refused or failed one are refused too, and those after a
    committed one run unchanged."""
    original = connection.pipeline
    session = FencedSession(fence, release, on_commit)

    def pipeline(*args: Any, **kwargs: Any) -> Pipeline:
        pipe = original(*args, **kwargs)
        if getattr(pipe, "transaction", False) is True:
            pipe.__class__ = _fenced_class(type(pipe))
            pipe._emq_session = session  # type: ignore[attr-defined]
        return pipe

    connection.pipeline = pipeline  # type: ignore[method-assign]
    try:
        yield session
    finally:
        del connection.pipeline
