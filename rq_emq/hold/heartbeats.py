"""RQ's worker and execution heartbeats under leases: sent with the lease renewals, in
the lock manager's round trip, and never repeated needlessly.
"""

from __future__ import annotations

import logging
import math
import time
from typing import Any

from redis import Redis
from redis.client import Pipeline
from rq.job import Job

from .. import reporter
from ..settings import LeaseSettings
from .lease import Lease

#: A worker heartbeat sent alone within this many seconds of one with at least its TTL is
#: skipped (see :meth:`HeartbeatMixin.heartbeat`).
HEARTBEAT_REPEAT_S = 1.0


class HeartbeatMixin:
    """The heartbeat half of :class:`rq_emq.run.worker.LeaseMixin`."""

    connection: Redis
    lease_settings: LeaseSettings
    _last_heartbeat: tuple[float, int]
    _starting_run: bool
    #: (monotonic, state) of the last worker state written alone.
    _state_sent: tuple[float, str] = (-math.inf, "")
    #: Monotonic time a job ended at: RQ's loop then beats alone and, a moment later, again
    #: in its suspension check's transaction.
    _job_ended_at: float = -math.inf
    #: RQ's run of a job is under way (``execute_job``): the state it writes alone as the
    #: run ends ("idle") is held back for the transaction RQ's loop sends next.
    _holding_state = False
    #: The state held back, not sent yet; and the one queued in the suspension check's
    #: transaction, not known to have landed yet.
    _state_pending: str | None = None
    _state_riding: str | None = None
    #: RQ's `rq suspend` check runs (its transaction carries the held-back state).
    _checking_suspension = False
    #: The suspension check's transaction carries a beat (none within a second of the last).
    _beat_riding = False

    #: RQ's logger of this worker (RQ's ``__init__`` sets ``self.log``), read through :attr:`log`.
    _rq_log: Any = logging.getLogger("rq.worker")

    @property
    def log(self) -> Any:
        """RQ's logger of this worker; on the lock manager's threads, its
        :class:`rq_emq.reporter.PathLogger`: RQ's methods they run (the worker heartbeat
        that rides with each renewal, which logs a DEBUG line; a horse's kill) hand their
        lines to the reporter thread instead of calling a handler."""
        if reporter.on_renewal_thread():
            return reporter.path_logger(self._rq_log)
        return self._rq_log

    @log.setter
    def log(self, value: Any) -> None:
        self._rq_log = value

    def heartbeat(self, timeout: int | None = None, pipeline: Pipeline | None = None) -> None:
        """RQ's worker heartbeat. RQ's loop sends one on its own three times per job (before
        and after the take, after the job): its three commands share one round trip, and
        one that would repeat, within a second, a heartbeat with at least its TTL is skipped
        (the worker key's expiry moves by less than that second; its TTL is minutes).

        The one RQ sends as a run starts (``prepare_job_execution``, three commands in the
        start's transaction) is left out: the worker key's TTL is minutes when the job is
        taken (RQ's loop beats right before and after the take), and from the take on the
        lock manager beats with every renewal while the lease is held, as it does for the
        rest of the run."""
        if pipeline is not None:
            if self._checking_suspension and self._beat_lately(timeout):
                # a backlog's suspension checks, one a job: the worker key's expiry would move
                # by less than a second on a TTL of minutes (three commands a job, saved)
                pass
            elif not self._starting_run:
                super().heartbeat(timeout, pipeline=pipeline)  # type: ignore[misc]
                self._beat_riding = self._checking_suspension
            if self._checking_suspension and self._state_pending is not None:
                # the state RQ wrote as the last job ended rides in this transaction
                super().set_state(self._state_pending, pipeline=pipeline)  # type: ignore[misc]
                self._state_riding, self._state_pending = self._state_pending, None
            return
        me: Any = self
        if time.monotonic() - self._job_ended_at < HEARTBEAT_REPEAT_S:
            # RQ's loop beats right after a job and then again, in the same breath, in its
            # `rq suspend` check's transaction (is_suspended): the first is left to the second
            self._job_ended_at = -math.inf
            return
        ttl = timeout or me.worker_ttl + 60  # RQ's default
        if self._beat_lately(ttl):
            return
        with self.connection.pipeline(transaction=False) as pipe:
            super().heartbeat(ttl, pipeline=pipe)  # type: ignore[misc]
            pipe.execute()
        self._last_heartbeat = (time.monotonic(), ttl)

    def _beat_lately(self, timeout: int | None) -> bool:
        """A beat with at least this TTL (None: RQ's default) was sent within the last
        :data:`HEARTBEAT_REPEAT_S`."""
        me: Any = self
        sent_at, sent_ttl = self._last_heartbeat
        return time.monotonic() - sent_at < HEARTBEAT_REPEAT_S and (timeout or me.worker_ttl + 60) <= sent_ttl

    def job_ended(self) -> None:
        """A job's run just ended (RQ's loop beats next, then checks for suspension)."""
        self._job_ended_at = time.monotonic()

    def suspension_checked(self, landed: bool = True) -> None:
        """RQ's suspension check ran: unless a stop cut it short or a beat had gone within
        a second, it beat (the default TTL) in its transaction, which the wait's own beat
        then need not repeat; so did
        the state held back as the last job ended. ``landed``: its transaction went
        through (else a blip failed it, and a held-back state is held again)."""
        me: Any = self
        self._job_ended_at = -math.inf
        riding, self._state_riding = self._state_riding, None
        if riding is not None:
            if landed:
                self._state_sent = (time.monotonic(), riding)
            elif self._state_pending is None:
                self._state_pending = riding
        beat, self._beat_riding = self._beat_riding, False
        if beat and landed and not me._stop_requested:
            self._last_heartbeat = (time.monotonic(), me.worker_ttl + 60)

    def send_held_state(self) -> None:
        """A state still held back goes alone (the worker stops before RQ's loop sent it)."""
        state, self._state_pending = self._state_pending, None
        if state is not None:
            self.set_state(state)

    def heartbeat_after_take(self) -> None:
        """RQ's beat right after a take. Skipped while the worker key's TTL from the last
        beat outlasts the lock manager's first ticks by a minute: from the take on, the lock
        manager beats with every renewal (a no-op job ends first, and RQ's loop beats again
        as the next wait begins). In a fleet this is the beat that is never "within a
        second" of the last one: the woken worker has usually been idle for seconds."""
        sent_at, sent_ttl = self._last_heartbeat
        left = sent_ttl - (time.monotonic() - sent_at)
        if left > 60 + 2 * self.lease_settings.renew_interval_ms / 1000.0:
            return
        self.heartbeat()

    def hold_state(self, state: str) -> None:
        """RQ's state, held back for the transaction or pipeline sent next (its suspension
        check, or the take that carries it)."""
        me: Any = self
        me._state = state
        self._state_pending = state

    def set_state(self, state: str, pipeline: Pipeline | None = None) -> None:
        """RQ's worker state. RQ's loop writes "idle" twice in a row after each job (after
        the job, then as its wait begins): the first rides in the transaction of RQ's
        `rq suspend` check, sent right after it; a write alone of the state this worker
        wrote less than a second ago, nothing else in between, is skipped."""
        me: Any = self
        if pipeline is None and self._holding_state:
            # RQ's "idle" as a run ends: sent in the transaction its loop sends next (its
            # `rq suspend` check, at once), not in a round trip of its own
            self.hold_state(state)
            return
        self._state_pending = None  # a state written since replaces one held back
        sent_at, sent_state = self._state_sent
        if pipeline is None and state == sent_state and time.monotonic() - sent_at < HEARTBEAT_REPEAT_S:
            me._state = state  # RQ's own record of it, as its set_state keeps it
            return
        super().set_state(state, pipeline=pipeline)  # type: ignore[misc]
        # a state written in a transaction may not land: the next one alone is sent
        self._state_sent = (time.monotonic(), state) if pipeline is None else (-math.inf, "")

    def get_heartbeat_ttl(self, job: Job, *args: Any, **kwargs: Any) -> int:
        """Seconds RQ's started-registry entry stays valid: the lease plus a grace that lets
        our sweep act before stock cleanup would; the lock manager refreshes it every tick."""
        settings = self.lease_settings
        return math.ceil((settings.lease_ms + settings.registry_grace_ms) / 1000)

    def maintain_heartbeats(self, *args: Any, **kwargs: Any) -> None:
        """Nothing to do: the lock manager's tick sends these with the lease renewals."""

    def _tick_heartbeats(self, pipe: Pipeline, leases: list[Lease]) -> None:
        if not leases:
            return
        me: Any = self
        me.heartbeat(me.job_monitoring_interval + 60, pipeline=pipe)

    def _heartbeat_execution(self, lease: Lease, pipe: Pipeline) -> None:
        """RQ's execution heartbeat for one lease's run (the lock manager applies it only
        while the lease is held: a late tick must not re-create what a recovery removed)."""
        if lease.execution is not None and lease.job is not None:
            ttl = self.get_heartbeat_ttl(lease.job)
            lease.execution.heartbeat(lease.job.started_job_registry, ttl, pipeline=pipe)
