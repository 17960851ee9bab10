"""The watched commit: a lease holder's start and normal finish as RQ's own MULTI/EXEC.

A fenced write must land only while its worker holds the job's lease. The scripts
(``guard_job_write``, ``finish_job``) check that and run RQ's commands, which they are
handed as arguments: Redis copies each argument into Lua, each command's reply into Lua
and the script's reply back out: a script cost Redis 0.17 M instructions more than RQ's own
transaction of the same commands for a run's start, 0.24 M for its finish (callgrind), where
stock RQ's whole job costs 0.53 M.

So a write whose lease is plainly held goes as a transaction instead. The job hash is
WATCHed and its lease fields read (``LEASE_FIELDS``) in one send: RQ's success path WATCHes
the dependents key and reads it, and the job hash rides with that WATCH, its read with that
read; a run's start sends the WATCH and the read as one round trip of its own. When the
read shows the token ours and RQ's seen fields as the lease recorded them (``held``: the
script's ``untouched``), RQ's commands go in MULTI/EXEC, and for a finish the lease's
release after them (``release_commands``). Any write to the job hash between the read and
the EXEC (a recovery, a cancel, a renewal) aborts the EXEC, writing nothing: RQ's finish loop
runs its block again, and a start is handed to the script at once. Only RQ 3's loop runs a
second pass whole (``compat.SUCCESS_LOOP_RETRIES_WHOLE``): under RQ 2.x a finish keeps the
script.

Every other case keeps the script, which holds the rules for it: a lease lost, or changed
by RQ (the evidence it reads), a job that RQ's commands delete (the tombstone on the lock),
an outbox's completion, a job's own pipeline (MULTI's refusals checked first), and a
write made under a WATCH of RQ's own that the start's read would spend.
"""

from __future__ import annotations

from typing import Any

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError, WatchError
from redis.exceptions import TimeoutError as RedisTimeoutError

from .. import malformed
from ..keys import PINNED_FIELD
from .packing import command_name

#: What the read after the WATCH asks of the job hash: the owner, RQ's seen fields, then
#: the lease's record of them (lua/lib/lease.lua ``lease_fields``, SEEN and RECORDED).
LEASE_FIELDS = (
    "emq_token",
    "status",
    "enqueued_at",
    "started_at",
    "emq_status",
    "emq_enqueued_at",
    "emq_started_at",
)

#: Every field of the lease that a normal end removes from the job hash, as ``finish_job``
#: removes them (lua/lib/lease.lua ``lease_only_fields`` and NOTES, and the crash history).
ENDED_FIELDS = (
    "emq_attempts",
    PINNED_FIELD,
    "emq_status",
    "emq_enqueued_at",
    "emq_started_at",
    "emq_report",
    "emq_progress_at",
    "emq_no_progress",
    "emq_granted_at",
    "emq_crashes",
)

#: RQ's commands that may name the job hash in a transaction that keeps it: they change
#: fields or its expiry, never remove it (an EXPIRE is checked for a positive time).
_KEEPS_JOB = frozenset({"HSET", "HMSET", "HINCRBY", "HINCRBYFLOAT", "EXPIRE", "PEXPIRE", "PERSIST"})


def _text(value: Any) -> str | None:
    if value is None:
        return None
    return value.decode() if isinstance(value, bytes) else str(value)


def held(read: list[Any], token: str) -> bool:
    """Whether the job hash's ``LEASE_FIELDS`` show ``token``'s lease held and untouched
    (lua/lib/lease.lua ``untouched``: a field the lease recorded differs from RQ's)."""
    found = [_text(value) for value in read]
    if len(found) != len(LEASE_FIELDS) or found[0] != token:
        return False
    for seen, recorded in zip(found[1:4], found[4:7], strict=True):
        if recorded is not None and (seen or "") != recorded:
            return False
    return True


def keeps_job(commands: list[Any], job_key: str) -> bool:
    """Whether RQ's ``commands`` leave the job hash in place: each that names it is one of
    ``_KEEPS_JOB`` on it (an expiry in the future). A job they delete (``result_ttl=0``)
    goes to ``finish_job``, which leaves the finish's tombstone on the lock instead."""
    names = (job_key, job_key.encode())
    for args, _ in commands:
        if not any(word in names for word in args[1:] if isinstance(word, (str, bytes))):
            continue
        name = (_text(args[0]) or "").upper()
        if name not in _KEEPS_JOB or args[1] not in names:
            return False
        if name in ("EXPIRE", "PEXPIRE"):
            try:
                if int(args[2]) <= 0:
                    return False
            except (IndexError, TypeError, ValueError):
                return False
    return True


def release_commands(keys: list[str], job_id: str, token: str, counter: str) -> list[tuple[Any, ...]]:
    """The lease's end after RQ's commands, as ``finish_job`` writes it for a holder whose
    job is kept: lock, index entry and stall mark gone, the lease's fields removed, the
    owner ``done:<token>`` (the holder's next renewal reads a normal end), one counted."""
    job_key, lock_key, leases_key, stalled_key, stats_key = keys[:5]
    return [
        ("DEL", lock_key),
        ("ZREM", leases_key, job_id),
        ("ZREM", stalled_key, job_id),
        ("HDEL", job_key, *ENDED_FIELDS),
        ("HSET", job_key, "emq_token", f"done:{token}"),
        ("HINCRBY", stats_key, counter, 1),
    ]


def release_problems(keys: list[str], replies: list[Any]) -> list[str]:
    """Our keys a release's replies show of another type (``finish_job`` names them the
    same way, lib/own_keys.lua), as a script's ``malformed`` reply: {key, what, ...}."""
    what = {
        2: "not a zset: an index of ours, read as empty and replaced by the next write",
        3: "not a zset: an index of ours, read as empty and replaced by the next write",
        4: "not a hash: its counters are not kept",
    }
    found: list[str] = []
    for at, reply in zip((2, 3, 4), (replies[1], replies[2], replies[5]), strict=True):
        if isinstance(reply, ResponseError):
            found += [keys[at], what[at] if "WRONGTYPE" in str(reply) else f"refused: {reply}"]
    return found


def pool_connection(pool: Any) -> Any:
    try:
        return pool.get_connection()
    except TypeError:  # redis-py before 5.3 names the command
        return pool.get_connection("WATCH")


class WatchedCommitMixin:
    """The watched commits of a fenced pipeline (:class:`rq_emq.fence.fencing.FencedPipelineMixin`
    decides when): what they send, and what their replies mean."""

    #: The fenced block's session (rq_emq.fence.fencing.FencedSession, not imported: it
    #: imports this module).
    _emq_session: Any

    def _execute_watched(self, stack: list[Any], ours: list[tuple[Any, ...]]) -> list[Any] | None:
        """``stack`` (RQ's commands), then ``ours``, as one MULTI/EXEC on the connection
        that WATCHes the job hash since a read that showed the lease held (this module's
        docstring); RQ's replies, or None when a write to the job since aborted it
        (nothing written). Problems with our keys go to the log, as a script's would."""
        pipe: Any = self
        session = self._emq_session
        fence = session.fence
        pipe.command_stack = [*stack, *((args, {}) for args in ours)]
        try:
            replies = list(super().execute(raise_on_error=False))  # type: ignore[misc]
        except WatchError as error:
            if not isinstance(error.__context__, (RedisConnectionError, RedisTimeoutError)):
                return None
            # a blip, not a write: what the script's call would raise on the same connection
            # (under RQ's WATCH, a WatchError its loop retries; a start's, the blip itself)
            if session.release:
                raise
            raise error.__context__ from None
        if session.release:  # ours are release_commands: their replies name our keys
            malformed.report(release_problems(fence.keys, replies[len(stack) :]))
        session.mark_committed()
        return replies[: len(stack)]

    def _guard_watched(self, commands: list[Any], pieces: list[Any], max_attempts: str) -> list[Any] | None:
        """A guarded write (the run's start) as one MULTI/EXEC: the job hash WATCHed and the
        lease read in one send, then, when it shows the lease held and untouched, RQ's
        commands (their seen fields already folded in: packing.start_record) and the job's
        own max attempts. One round trip more than ``guard_job_write``, and none of the
        script's copying of every argument into Lua and back. None: the lease was not
        shown held (or the job was written since): the script decides, as before."""
        pipe: Any = self
        fence = self._emq_session.fence
        if pipe.connection is None:
            pipe.connection = pool_connection(pipe.connection_pool)
        conn = pipe.connection
        try:
            read = ("HMGET", fence.job_key, *LEASE_FIELDS)
            conn.send_packed_command(conn.pack_commands([("WATCH", fence.job_key), read]))
            pipe.parse_response(conn, "WATCH")
            lease = pipe.parse_response(conn, "HMGET")
        except BaseException:
            conn.disconnect()
            pipe.reset()
            raise
        pipe.watching = True
        if not held(lease, fence.token):
            pipe.reset()  # UNWATCH: the script reads the evidence itself
            return None
        options = [options for _, options in commands]
        stack = [(words, options[index]) for index, (parts, _) in enumerate(pieces) for words in parts]
        ours = [("HSET", fence.job_key, "emq_max_attempts", max_attempts)] if max_attempts else []
        return self._execute_watched(stack, ours)

    def _raise_first(self, commands: list[Any], replies: list[Any], raise_on_error: bool) -> list[Any]:
        """RQ's replies; with ``raise_on_error``, the first error among them raised, as
        redis-py raises it from a transaction."""
        if raise_on_error:
            for index, ((args, _), reply) in enumerate(zip(commands, replies, strict=True)):
                if isinstance(reply, ResponseError):
                    raise type(reply)(
                        f"Command # {index + 1} ({command_name(args)}) of pipeline caused error: {reply}"
                    )
        return replies
