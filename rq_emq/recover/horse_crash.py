"""A work horse that died without an outcome: recovered by its own worker, at once.

The commonest crash in production is not a dead worker but a dead horse: the OOM killer
picks the process holding the job's memory (SIGKILL), or a C extension segfaults. The
worker lives on and reaps the horse, so it knows the moment the run ended. Stock RQ then
fails the job ("Work-horse terminated unexpectedly"). A lease worker instead treats it
as the stall it is, without waiting for the lease to lapse: ``recover_crashed_job``
returns the job to the front of its queue with the attempt counted, or fails it at max
attempts with a reason naming the cause (through the outbox, so RQ's Result and the
failure callback happen once), in one script fenced by the lease's token.

Only a death the worker did not cause is a crash. RQ's deliberate kills keep RQ's
meaning: ``send_stop_job_command`` (stopped), the job timeout's kill from the worker side,
a cold shutdown (handed back, attempt refunded), our own lease-lost stop (the sweep
decides) all go through ``kill_horse``, which this mixin notes. A horse that dies under a
lease this worker no longer trusts (lost, or past its local deadline: the horse fenced
itself), or that its watchdog or its own fence ended at the deadline (said in the shared
deadline memory: a late renewal may have made the lease trusted again since), is left to
the sweep, and RQ's failure of it is skipped too.
"""

from __future__ import annotations

import json
import logging
import os
import re
import signal
import sys
import time
from dataclasses import dataclass
from typing import Any

from redis import Redis
from rq.job import Job
from rq.queue import Queue
from rq.utils import now, utcformat

from .. import compat, events, malformed, scripts
from ..connection.blips import BLIPS, through_blips
from ..hold.held import Lease
from ..keys import RQ_PREFIX
from .sweep import DEFAULT_FAILURE_TTL

logger = logging.getLogger("rq_emq.lease")

#: What an operator should read into a signal that ended a horse nobody meant to stop.
SIGNAL_NOTES: dict[int, str] = {
    signal.SIGKILL: "the OOM killer sends this",
    signal.SIGSEGV: "a segfault, in C code",
    signal.SIGBUS: "a bad memory access, e.g. a truncated mapped file",
    signal.SIGABRT: "abort(), e.g. a failed assertion in C code",
    signal.SIGILL: "an illegal instruction, e.g. a wheel built for another CPU",
    signal.SIGFPE: "an arithmetic fault in C code",
}


def describe_exit(status: int | None, guess: bool = True) -> str | None:
    """The cause of a horse's end from its wait status, as the failure reason and the log
    say it; None for a clean exit (status 0) or no status. ``guess``: add what an
    operator should read into the signal (:data:`SIGNAL_NOTES`), for a death nobody here
    caused; not where the worker knows who sent it."""
    if not status:
        return None
    if os.WIFSIGNALED(status):
        number = os.WTERMSIG(status)
        try:
            name = signal.Signals(number).name
        except ValueError:
            name = "unknown signal"
        note = SIGNAL_NOTES.get(number) if guess else None
        return f"work horse killed by signal {number} ({name}{'; ' + note if note else ''})"
    if os.WIFEXITED(status):
        return f"work horse exited with status {os.WEXITSTATUS(status)} before writing an outcome"
    return f"work horse ended (wait status {status}) before writing an outcome"


def peak_rss(rusage: Any) -> str:
    """The dead horse's peak resident memory from its ``os.wait4`` rusage, for the log
    (Linux counts ``ru_maxrss`` in KiB, macOS in bytes); "unknown" without one."""
    kib = getattr(rusage, "ru_maxrss", None)
    if not isinstance(kib, int) or kib <= 0:
        return "unknown"
    if sys.platform == "darwin":
        kib //= 1024
    return f"{kib / 1024:.1f} MiB" if kib < 1024 * 1024 else f"{kib / (1024 * 1024):.2f} GiB"


@dataclass
class Crash:
    """One attempt of a job whose horse died without an outcome (``emq_crashes``)."""

    attempt: int
    cause: str
    #: When its worker recovered it, Redis time (ms since the epoch).
    at_ms: int

    @property
    def short(self) -> str:
        """``SIGKILL``, ``exit 1``: the cause in a table cell."""
        for pattern, shown in (
            (r"\(([A-Z][A-Z0-9]+)[;)]", "{}"),
            (r"status (\d+)", "exit {}"),
            (r"signal (\d+)", "signal {}"),
        ):
            found = re.search(pattern, self.cause)
            if found is not None:
                return shown.format(found.group(1))
        return self.cause


def read_crashes(raw: bytes | str | None) -> list[Crash] | None:
    """A job hash's ``emq_crashes`` as the recovery script wrote it; None if unreadable."""
    if raw is None:
        return []
    try:
        entries = json.loads(raw)
        return [Crash(int(attempt), str(cause), int(at)) for attempt, cause, at in entries]
    except (ValueError, TypeError):
        return None


class _CrashHandled(Exception):
    """Raised past RQ's failure of a crashed horse's job: the lease worker recovered it."""


class HorseCrashMixin:
    """Put before :class:`rq_emq.run.worker.LeaseMixin` in a forking lease worker."""

    #: This worker sent its current horse a signal (``kill_horse``): its end is no crash.
    _horse_killed_by_worker: bool = False

    def fork_work_horse(self, job: Job, queue: Queue) -> None:
        self._horse_killed_by_worker = False
        super().fork_work_horse(job, queue)  # type: ignore[misc]

    def kill_horse(self, *args: Any, **kwargs: Any) -> None:
        self._horse_killed_by_worker = True
        super().kill_horse(*args, **kwargs)  # type: ignore[misc]

    def _end_dead_run(self, horse_pid: Any) -> None:
        """What is left of a horse that died without an outcome, ended before its job may
        run again: its process group here, then what the classes after this one end (the
        run guard: the horse's session)."""
        end_orphans(horse_pid)
        after = getattr(super(), "_end_dead_run", None)
        if after is not None:
            after(horse_pid)

    #: The job whose horse this worker watches (RQ's ``monitor_work_horse``).
    _monitored_job_id: str | None = None

    def monitor_work_horse(self, job: Job, queue: Queue, *args: Any) -> None:
        self._monitored_job_id = job.id
        try:
            super().monitor_work_horse(job, queue, *args)  # type: ignore[misc]
        except _CrashHandled:
            pass  # RQ's failure of the job is skipped: it is back in its queue, or failed
        finally:
            self._monitored_job_id = None

    def _misleading_rq_line(self, record: Any) -> bool:
        """RQ's "job failed (Work-horse terminated unexpectedly)" for a horse whose end this
        worker takes over (:meth:`handle_work_horse_killed`): the job is not failed, and
        our line says what became of it (recovered, failed at max attempts, or left to the
        sweep)."""
        me: Any = self
        job_id = self._monitored_job_id
        if (
            job_id is not None
            and compat.RQ_HORSE_DIED_LINE in record.getMessage().lower()
            and not self._horse_killed_by_worker
            and me.lock_manager is not None
            and me.lock_manager.get(job_id) is not None
        ):
            return True
        return bool(super()._misleading_rq_line(record))  # type: ignore[misc]

    def handle_work_horse_killed(self, job: Job, retpid: Any, ret_val: Any, rusage: Any) -> None:
        """RQ calls this (every supported release, same arguments) for a horse that ended
        with no outcome and no stop request, just before it fails the job."""
        super().handle_work_horse_killed(job, retpid, ret_val, rusage)  # type: ignore[misc]
        me: Any = self
        lease = me.lock_manager.get(job.id) if me.lock_manager is not None else None
        cause = describe_exit(ret_val)
        if cause is None or lease is None or self._horse_killed_by_worker:
            return  # RQ's own meaning
        me._end_dead_run(retpid)
        deadline = getattr(me, "_horse_deadline", None)
        # the run's end at its deadline is read from who ended it, not from the lease as
        # it stands now: a renewal that lands after the kill makes the lease trusted again
        at_deadline = deadline is not None and deadline.ended_at_deadline
        if at_deadline or not _trusted(lease):
            # The horse fenced itself (its local lease clock ran out), or its outcome had
            # landed. RQ would now fail the job with "terminated unexpectedly", and its fence
            # would let that through while the token lives on in Redis (the lease's margin
            # past the local deadline): a job our own fence stopped, failed. The sweep decides.
            # A clock that ran out before the clock thread looked is still said (and its
            # lease_lost emitted) once, as the clock thread would have.
            me.lock_manager.expire_if_due(lease, ended=True)
            trusted_ms = me.lock_manager.lease_ms - me.lock_manager.margin_ms
            why = distrust(lease, trusted_ms, at_deadline=at_deadline)
            lease.lost = True
            logger.warning(
                "job %s: %s after this worker stopped trusting its lease (%s); left to the sweep",
                *(job.id, describe_exit(ret_val, guess=False), why),
                extra={"job_id": job.id, "queue": lease.queue},
            )
            raise _CrashHandled
        self._recover_crashed(job, lease, cause, rusage)
        raise _CrashHandled

    def _recover_crashed(self, job: Job, lease: Lease, cause: str, rusage: Any) -> None:
        me: Any = self
        lease.lost = True  # stop renewing: the run is over whatever the script finds
        extra = {"job_id": job.id, "queue": lease.queue}
        rss = peak_rss(rusage)
        try:
            budget = max(lease.valid_until - time.monotonic(), 0.0)
            default_max = me.lease_settings.max_attempts

            def recover() -> Any:
                return recover_crashed(me.connection, lease, cause, default_max)

            reply = through_blips(recover, job.id, budget, "recover it")
        except BLIPS as error:
            logger.error(
                "job %s: %s (peak RSS %s); Redis unreachable (%s): the sweep recovers it as its lease lapses",
                *(job.id, cause, rss, error),
                extra=extra,
            )
            return
        except Exception:  # never the worker's end: the lease, no longer renewed, is the sweep's
            logger.exception("job %s: %s (peak RSS %s); not recovered", job.id, cause, rss, extra=extra)
            return
        outcome = int(reply[0])
        if outcome == 0:
            state = reply[1].decode() if isinstance(reply[1], bytes) else str(reply[1])
            left = "RQ had ended it; left as RQ put it" if state == "ended" else "its lease was not held"
            logger.warning("job %s: %s (peak RSS %s); %s", job.id, cause, rss, left, extra=extra)
            return
        attempts, max_attempts = int(reply[1]), int(reply[2])
        events.emit("crashed", lease.queue, [job.id], me.name)
        if outcome == 1:
            logger.warning(
                "job %s: %s (peak RSS %s); returned to the front of queue %s (attempt %d of %d)",
                *(job.id, cause, rss, lease.queue, attempts, max_attempts),
                extra=extra,
            )
            return
        reason = reply[3].decode() if isinstance(reply[3], bytes) else str(reply[3])
        logger.warning(
            "job %s: %s (peak RSS %s); failed at max attempts: %s", job.id, cause, rss, reason, extra=extra
        )
        events.emit("failed", lease.queue, [job.id], me.name)
        sweeper = getattr(me, "sweeper", None)
        if sweeper is not None and sweeper.drain:
            try:  # RQ's Result and the failure callback now, not at the next sweep round
                sweeper.drain_outbox(lease.queue)
            except Exception:
                logger.exception("job %s: the outbox drain failed; the sweep retries it", job.id, extra=extra)


def end_orphans(horse_pid: Any) -> None:
    """SIGKILL what is left of a dead horse's process group (RQ makes each horse, forked
    or spawned, a group leader): a subprocess of the job outlives an OOM-killed horse, and
    must not run on while the job runs again. A group id stays reserved while any member
    lives, so this reaches the horse's own children, or nothing. A child that made a group
    of its own is reached through the horse's session (``_end_dead_run``, run/run_guard.py)."""
    if not isinstance(horse_pid, int) or horse_pid <= 0:
        return
    try:
        os.killpg(horse_pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass  # no member left: the usual case


def distrust(lease: Lease, trusted_ms: int, now_m: float | None = None, at_deadline: bool = False) -> str:
    """Why the worker no longer trusted ``lease`` as its horse died, said as what is known.
    A horse past its local deadline was ended by the lease clock (its watchdog's or its
    own fence's SIGKILL), not by the OOM killer; ``trusted_ms`` is how long a renewal is
    trusted (lease - margin), from which the last landed renewal's send time follows."""
    now_m = time.monotonic() if now_m is None else now_m
    if lease.settled:
        return "its outcome had landed"
    if lease.expired and now_m > lease.valid_until:
        age_ms = (now_m - lease.valid_until) * 1000 + trusted_ms
        return (
            "the run passed its local lease deadline, which ended it: no renewal landed within "
            f"{trusted_ms} ms (the last one that did was sent {age_ms:.0f} ms ago)"
        )
    if lease.expired:
        return "its job reported no progress for its progress timeout"
    if at_deadline and not lease.lost:
        return (
            "the run passed its local lease deadline, which ended it (its watchdog or its own "
            "fence); a renewal landed only after"
        )
    return "its lease was lost (a renewal refused it, or the worker handed it back)"


def _trusted(lease: Lease) -> bool:
    """Whether the worker still holds this lease by its own clock. Past the local deadline
    the horse fenced itself (a SIGKILL of its own) and the sweep owns the recovery."""
    return not (lease.lost or lease.settled or lease.expired) and time.monotonic() <= lease.valid_until


def recover_crashed(client: Redis, lease: Lease, cause: str, default_max: int) -> Any:
    """Run ``recover_crashed_job`` for ``lease``'s job (its reply, as the script says, but
    for the malformed keys it names last: they are logged here)."""
    q = lease.keys
    keys = [*q.returning(lease.job_id), q.failed, q.outbox]
    args = [
        lease.job_id,
        lease.token,
        RQ_PREFIX,
        default_max,
        DEFAULT_FAILURE_TTL,
        utcformat(now()),
        cause,
    ]
    reply = scripts.load("recover_crashed_job")(client, keys, args)
    malformed.report(reply[-1])
    return reply[:-1]
