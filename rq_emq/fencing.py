"""The fence: a job's outcome is written only by the worker that still holds its lease.

RQ finishes a job (success, failure, ``Retry``, stop) by queueing its writes in one
MULTI/EXEC pipeline. While :func:`fenced` is active, such a pipeline does not send those
writes as they are: it packs them, unchanged, into one EVALSHA of ``finish_job`` that
checks the lease owner, runs them and releases the lease, atomically. RQ's semantics are
kept to the command, and a worker that lost its lease writes nothing at all. A WATCH
that RQ set (dependents) still guards the transaction, since the EVALSHA is sent inside
MULTI/EXEC on the watched connection.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cache
from typing import Any

from redis import Redis
from redis.client import Pipeline
from redis.exceptions import ResponseError, WatchError

from . import compat, scripts
from .keys import QueueKeys, job_key

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

    @property
    def keys(self) -> list[str]:
        q = QueueKeys(self.queue)
        return [job_key(self.job_id), q.lock(self.job_id), q.leases, q.stalled, q.stats]

    @property
    def guard_keys(self) -> list[str]:
        return [job_key(self.job_id), QueueKeys(self.queue).stats]

    def release(self, client: Redis) -> bool:
        """Release the lease without writing anything else; False when it was not ours."""
        reply = scripts.load("finish_job")(client, self.keys, [self.job_id, self.token, 0])
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


class _Session:
    """One fenced block: its first transaction is checked (and, for a finish, releases the
    lease); later ones follow it."""

    def __init__(self, fence: Fence, release: bool) -> None:
        self.fence = fence
        self.release = release
        self.committed = False
        self.refused = False

    def refuse(self) -> LeaseLost:
        self.refused = True
        if self.release:
            return self.fence.lost()
        return self.fence.lost("its bookkeeping discarded (guarded write)")


class _FencedPipelineMixin:
    """Turns a transaction's queued commands into one fenced ``finish_job`` call."""

    _emq_session: _Session

    def execute(self, raise_on_error: bool = True) -> list[Any]:
        pipe: Any = self
        commands = list(pipe.command_stack)
        session = self._emq_session
        if not pipe.transaction or not commands or session.committed:
            # RQ's steps after the outcome (enqueueing dependents) run as they would
            return super().execute(raise_on_error)  # type: ignore[misc]
        fence = session.fence
        if session.refused:
            pipe.reset()
            raise LeaseLost(fence.queue, fence.job_id)
        if any(_command_name(args) in _NOT_IN_SCRIPTS for args, _ in commands):
            return self._execute_checked(commands, raise_on_error)
        if session.release:
            script, keys = scripts.load("finish_job"), fence.keys
            packed: list[Any] = [fence.job_id, fence.token, len(commands)]
        else:
            script, keys = scripts.load("guard_job_write"), fence.guard_keys
            packed = [fence.token, len(commands)]
        for args, _options in commands:
            words = _split_name(args)
            packed.append(len(words))
            packed.extend(words)
        watching = bool(pipe.watching)
        for attempt in (1, 2):
            pipe.command_stack = []
            pipe.pipeline_execute_command("EVALSHA", script.sha, len(keys), *keys, *packed)
            (reply,) = super().execute(raise_on_error=False)  # type: ignore[misc]
            if not scripts.is_noscript(reply) or attempt == 2:
                break
            script.load(Redis(connection_pool=pipe.connection_pool))
            if watching:
                # The WATCH was spent by that EXEC; RQ's retry loop starts over.
                raise WatchError(f"{script.name} script was not loaded; retry")
        if isinstance(reply, Exception):
            raise reply
        if int(reply[0]) != 1:
            raise session.refuse()
        session.committed = True
        return self._apply_callbacks(commands, list(reply[1]), raise_on_error)

    def _execute_checked(self, commands: list[Any], raise_on_error: bool) -> list[Any]:
        # Scripting commands cannot be nested in our script: check, commit, then release.
        # The check and the commit are not one step; such batches are rare in finish code.
        pipe: Any = self
        session = self._emq_session
        fence = session.fence
        client = Redis(connection_pool=pipe.connection_pool)
        owner = client.hget(job_key(fence.job_id), "emq_token")
        if owner is None or (owner.decode() if isinstance(owner, bytes) else owner) != fence.token:
            pipe.reset()
            raise session.refuse()
        result = super().execute(raise_on_error)  # type: ignore[misc]
        session.committed = True
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
def fenced(connection: Redis, fence: Fence, release: bool = True) -> Iterator[None]:
    """Within this block, the first transaction opened on ``connection`` commits only
    while ``fence`` holds the lease, and (``release``) releases it; transactions after a
    refused one are refused too, and those after a committed one run unchanged."""
    original = connection.pipeline
    session = _Session(fence, release)

    def pipeline(*args: Any, **kwargs: Any) -> Pipeline:
        pipe = original(*args, **kwargs)
        if getattr(pipe, "transaction", False) is True:
            pipe.__class__ = _fenced_class(type(pipe))
            pipe._emq_session = session  # type: ignore[attr-defined]
        return pipe

    connection.pipeline = pipeline  # type: ignore[method-assign]
    try:
        yield
    finally:
        del connection.pipeline
