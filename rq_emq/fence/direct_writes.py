"""The holder's own direct writes to the job it leased, through the guard.

RQ and the code it calls write to a running job outside any transaction: RQ 2 and 3's
delayed ``Retry`` sets the status ``scheduled`` with a bare HSET before it queues the
rest of the retry; an exception handler (``rq worker --exception-handler``) may call
``job.save()``; a job may call ``job.save_meta()``. Each is the holder's own write, but
sent as it is it would look, to the in-flight rule (lua/lib/lease.lua ``untouched``),
like RQ or an operator changing the job, and the fenced outcome after it would be
discarded as "RQ ended it".

While a lease worker runs a job it leased, every write command that names the job's hash
sent directly on the job's (and the worker's) client goes through ``guard_job_write``
instead: it lands only while the lease is the holder's, and what it leaves on the job is
recorded as the lease's own. This is the one seam for all of them (redis-py sends every
command of a client through ``execute_command``), so no RQ call needs a patch of its own.
Commands queued on a pipeline are not touched here: a transaction is fenced as a whole
(:mod:`rq_emq.fence.fencing`). Once the run's outcome has landed the job is RQ's again, and
writes after it (RQ 2 and 3 call exception handlers before the outcome; a handler of a
subclass may run later) pass through as they would under stock RQ.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from redis import Redis

from .fencing import Fence, FencedSession, fenced_class
from .packing import READ_ONLY, command_name, text

#: Writes that change no field of the job, only its expiry: nothing the in-flight rule
#: reads, and no outcome. They pass through as before (RQ 2's start PERSISTs the job on
#: its own, once a job: guarded, that cost two commands a job for nothing).
EXPIRY_ONLY = frozenset({"PERSIST", "EXPIRE", "PEXPIRE", "EXPIREAT", "PEXPIREAT"})


def writes_to(key: str | bytes, args: tuple[Any, ...]) -> bool:
    """Whether the command ``args`` is a write whose first key is ``key`` (RQ 2.0's
    ``job.key`` is bytes, later ones' str) that changes a field of it."""
    if len(args) < 2 or command_name(args) in READ_ONLY or command_name(args) in EXPIRY_ONLY:
        return False
    return isinstance(args[1], (str, bytes)) and text(args[1]) == text(key)


def guarded_command(connection: Redis, fence: Fence, args: tuple[Any, ...], options: dict[str, Any]) -> Any:
    """Send one command through ``guard_job_write`` under ``fence``; its reply, parsed as
    redis-py would. Raises LeaseLost (nothing written) when the lease is not the holder's."""
    # the class's own pipeline(): a fenced block of the finish may have replaced the
    # instance's, and this write is not that block's outcome
    pipe: Any = type(connection).pipeline(connection)
    base: Any = type(pipe)
    pipe.__class__ = fenced_class(base)
    pipe._emq_session = FencedSession(fence, release=False)
    try:
        pipe.execute_command(*args, **options)
        return pipe.execute()[0]
    finally:
        pipe.reset()


@contextmanager
def guarding_direct_writes(
    clients: list[Redis],
    key: str | bytes,
    current: Callable[[], Fence | None],
    send: Callable[[Callable[[], Any]], Any],
) -> Iterator[None]:
    """Within the block, writes to ``key`` sent directly on any of ``clients`` go through
    the guard while ``current()`` names the fence that holds the job (None: pass through).
    ``send`` runs each guarded write (the caller's retry through connection blips)."""
    patched: list[Redis] = []
    for client in clients:
        if any(client is other for other in patched) or "execute_command" in vars(client):
            continue
        original = client.execute_command

        def execute_command(
            *args: Any, _client: Redis = client, _original: Any = original, **options: Any
        ) -> Any:
            fence = current()
            if fence is None or not writes_to(key, args):
                return _original(*args, **options)
            return send(lambda: guarded_command(_client, fence, args, options))

        client.execute_command = execute_command  # type: ignore[method-assign]
        patched.append(client)
    try:
        yield
    finally:
        for client in patched:
            del client.execute_command
