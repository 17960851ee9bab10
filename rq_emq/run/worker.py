"""``LeaseWorker`` and ``SimpleLeaseWorker``: RQ workers whose every in-flight job holds a lease.

Operators switch with ``rq worker -w rq_emq.LeaseWorker`` (forking) or
``-w rq_emq.SimpleLeaseWorker`` (no fork). The overrides sit at RQ's seams and stay thin:

- taking a job is one atomic lease grant (:mod:`rq_emq.intake.take`);
- one lock-manager timer per process renews the leases and sends RQ's worker and
  execution heartbeats in the same round trip (:mod:`rq_emq.hold.lease`), so RQ's started
  registry entry never falls due while the lease lives, and a late tick never re-creates
  an execution record that a recovery removed;
- finishing (success, failure, ``Retry``, stop, timeout) keeps RQ's code and is fenced
  (:mod:`rq_emq.fence.fencing`);
- a lost lease stops the job; a horse dies once its worker and its watchdog are gone
  (:mod:`rq_emq.run.lifeline`); a cold stop hands the job back
  (a ``SimpleLeaseWorker``'s once its process has ended, by its watchdog); a horse that dies
  on its own (OOM kill, segfault) is a stall, recovered at once;
- every stop ends the run whole (:mod:`rq_emq.run.process_tree`), and a watchdog process ends a
  run past its lease deadline whatever the worker and the run do (:mod:`rq_emq.run.watchdog`).

The behaviour both kinds share is :class:`rq_emq.run.lease_mixin.LeaseMixin`; this module
owns what differs between a forking and an in-process worker.
"""

from __future__ import annotations

import _signal
import logging
import math
import signal
import threading
import time
from types import FrameType
from typing import Any

from rq import SimpleWorker, Worker
from rq.exceptions import InvalidJobOperation
from rq.job import Job
from rq.queue import Queue

from .. import compat
from ..fence.job_writes import LeaseJobInterrupted
from ..hold.held import Lease
from ..recover.horse_crash import HorseCrashMixin
from .fork_ahead import ForkAheadMixin
from .horse_end import HorseEnd
from .lease_mixin import LeaseMixin
from .process_tree import become_subreaper, lead_own_session, libc
from .run_guard import HorseRunGuard
from .simple_run import SimpleRunGuard

logger = logging.getLogger("rq_emq.lease")

#: How long a job taken after an idle wait has its start to itself before the worker forks
#: the next horse: a fork beside the new horse's first steps, on 2 CPUs shared with Redis
#: and the producer, put 3-10 ms on the slowest twentieth of idle pick-ups
#: (benchmarks/pickup.py); a job over by then leaves the fork to the next idle wait.
SPARE_AFTER_IDLE_START_S = 0.05


class LeaseWorker(HorseCrashMixin, HorseRunGuard, LeaseMixin, ForkAheadMixin, Worker):
    """A forking RQ worker whose jobs hold lock leases (``rq worker -w rq_emq.LeaseWorker``);
    a horse that dies without an outcome is recovered at once (:mod:`rq_emq.recover.horse_crash`)."""

    _fork_parts = True  # the horse parts a forking class needs (rq_emq.run.worker_check)
    #: RQ's execution record, written before the fork, rides in the horse's start instead:
    #: the horse inherits it held back in memory (one script call and round trip a job less)
    _record_rides_in_start = True

    _horse_job_id: str | None = None
    #: The horse tells its worker its run is over, before its slow exit (rq_emq.run.horse_end);
    #: off where the horse is no fork of this process (SpawnLeaseWorker)
    _horse_tells_its_end = True
    _horse_end: HorseEnd | None = None

    def main_work_horse(self, job: Job, queue: Queue) -> None:
        if self._horse_end is not None:
            self._horse_end.in_horse()
        if self._lender is not None:
            self._lender.adopt()  # the job runs on the connection its worker took it with
        if not self._forked_ahead:  # a horse forked ahead did this as it forked
            # the job's processes stay findable: in this horse's session however they
            # regroup, and its children when their parent exits
            lead_own_session()
            become_subreaper()
            # the kernel ends this horse's group once its worker and watchdog are both gone
            self._arm_lifeline()
        if self._horse_deadline is not None and self.lease_settings.stop_on_lease_lost:
            # the worker may be frozen before it writes the pid and pokes its watchdog
            self._horse_deadline.run_started_here()
            self._horse_deadline.guard(self.lease_settings.lease_check_interval_s)
        super().main_work_horse(job, queue)

    def fork_work_horse(self, job: Job, queue: Queue) -> None:
        self._lifeline_for_horses()
        libc()
        # the horse fences itself on the local lease deadline, which it reads from memory
        # shared with this worker and its watchdog: a frozen or dead worker, or a job
        # holding the GIL, cannot keep it running
        if self._horse_deadline is None:
            self._horse_deadline = self._new_run_deadline()
        lease = self.lock_manager.get(job.id) if self.lock_manager is not None else None
        self._horse_job_id = job.id
        self._horse_forking(lease.valid_until if lease is not None else math.inf)
        if lease is not None:
            lease.report_source = self._horse_deadline.read_report  # the job's reports, from the horse
        if self._lender is not None:
            self._lender.before_fork()
        if self._horse_tells_its_end:
            if self._horse_end is None:
                self._horse_end = HorseEnd()
            self._horse_end.reap_exited()
        # every part's own step before the fork runs (HorseCrashMixin's among them); the
        # horse forked ahead, if one waits, stands in for RQ's fork (ForkAheadMixin)
        super().fork_work_horse(job, queue)
        self._held_back_record_sent(job, landed=True)  # in the horse's memory, for its start
        if self._lender is not None:
            self._lender.lent()  # three connections while the horse runs: it has the work one
        self._horse_forked()

    def _prove_lent_state(self) -> None:
        """In the horse, as RQ's finish of the run begins (the job's code and callbacks
        have ended): every round trip on the lent connection from now on shows its state,
        and only a connection shown as lent is handed back (rq_emq.connection.lent_state)."""
        if self.is_horse and self._lender is not None:
            self._lender.prove_state((self.name,))

    def handle_job_success(self, *args: Any, **kwargs: Any) -> Any:
        self._prove_lent_state()
        return super().handle_job_success(*args, **kwargs)

    def handle_job_failure(self, *args: Any, **kwargs: Any) -> Any:
        self._prove_lent_state()
        return super().handle_job_failure(*args, **kwargs)

    def handle_job_retry(self, *args: Any, **kwargs: Any) -> Any:
        self._prove_lent_state()
        return super().handle_job_retry(*args, **kwargs)  # type: ignore[misc]

    def perform_job(self, job: Job, *args: Any, **kwargs: Any) -> Any:
        done = super().perform_job(job, *args, **kwargs)
        if self.is_horse and self._horse_end is not None:
            # RQ's os._exit(0) is all that follows: the worker may have the connection back
            hand_back = self._lender.hand_back() if self._lender is not None else None
            self._horse_end.tell_done(self.connection, hand_back)
        return done

    perform_job.__signature__ = LeaseMixin.perform_job.__signature__  # type: ignore[attr-defined]

    def wait_for_horse(self) -> Any:
        """The horse's end as it tells it (its run over, its exit still under way: reaped
        later), else its exit as RQ waits for it (a crash, a kill, a failed start)."""
        pid = self.horse_pid
        if pid and self._horse_end is not None and self._horse_end.wait_told(pid):
            return pid, 0, None
        return super().wait_for_horse()

    #: the job being taken waited for in an idle wait (not taken straight after the last)
    _taken_after_idle_wait = False

    def _before_idle_wait(self) -> None:
        self._taken_after_idle_wait = True
        if self._horse_end is not None:
            self._horse_end.reap_exited(block=True)  # no <defunct> horse beside an idle worker
        if not self._spare_expired:
            # the next job's horse, forked while there is time; once one has expired idle,
            # the next job is forked as RQ does (rq_emq.run.fork_ahead)
            self._fork_spare()

    def work(self, *args: Any, **kwargs: Any) -> bool:
        self._working = True
        try:
            return super().work(*args, **kwargs)
        finally:
            self._working = False
            self._end_spare()  # a stop after the take's refusal may leave one

    def teardown(self) -> None:
        self._end_spare()
        super().teardown()
        if self._horse_end is not None and not self.is_horse:
            self._horse_end.reap_exited(block=True)  # the last one's exit, a moment
            self._horse_end.close()

    def _on_lease_lost(self, lease: Lease) -> None:
        # the horse's job reads its lease as gone at once (current_lease().held), also
        # where it runs on (stop_on_lease_lost off: no thread of the horse acts on it)
        if self._horse_deadline is not None and lease.job_id == self._horse_job_id:
            if not self._horse_deadline.settled:
                self._horse_deadline.set(-math.inf)
        super()._on_lease_lost(lease)

    def _on_lease_renewed(self, lease: Lease) -> None:
        if self._horse_deadline is not None and lease.job_id == self._horse_job_id:
            # once the outcome is committed the horse's remaining work (RQ enqueuing the
            # dependents, its bookkeeping) is no run of the job: nothing may recover it
            self._horse_deadline.set(self._run_deadline(lease))

    def monitor_work_horse(self, job: Job, queue: Queue, *args: Any) -> None:
        after_idle, self._taken_after_idle_wait = self._taken_after_idle_wait, False
        try:
            # (a worker that forks no spare does not wait for one)
            end = self._horse_end if after_idle and self._spares_wanted() else None
            if end is None or not end.over_within(SPARE_AFTER_IDLE_START_S):
                self._fork_spare()  # while this horse runs: the next one, waiting for its job
            super().monitor_work_horse(job, queue, *args)
        except InvalidJobOperation:  # RQ < 2.1 trips on a job deleted while it ran
            logger.warning(
                "job %s was deleted while it ran", job.id, extra={"job_id": job.id, "queue": queue.name}
            )
        finally:
            self._spare_expired = False  # the run is over: the next idle wait forks a spare
            # a socket handed back with no lender to take it is closed with the next pair
            if self._lender is not None:
                handed_back = self._horse_end.take_handed_back() if self._horse_end is not None else None
                self._lender.returned(handed_back)

    def _outcome_committed(self) -> None:
        if self.is_horse and self._horse_deadline is not None:
            self._horse_deadline.settle()

    def _stop_lost_job(self, lease: Lease) -> None:
        if self._horse_deadline is not None and self._horse_deadline.settled:
            return  # the horse's outcome has landed; RQ's bookkeeping after it runs on
        if self.horse_pid:
            self.kill_horse(signal.SIGKILL)

    def _stop_running_job(self) -> bool:
        if self.horse_pid:
            self.kill_horse(signal.SIGKILL)
            self.wait_for_horse()
        return True  # the horse is reaped, its whole tree ended


class SimpleLeaseWorker(SimpleRunGuard, LeaseMixin, SimpleWorker):
    """A non-forking RQ worker whose jobs hold lock leases; a thread renews while jobs run.
    A run stopped before its job returned ends the worker process with it
    (:mod:`rq_emq.run.simple_run`)."""

    _in_process_parts = True  # what an in-process class needs (rq_emq.run.worker_check)
    #: RQ's execution record and the run's start are consecutive steps of this thread:
    #: one guarded script call for both (rq_emq.fence.job_writes)
    _record_rides_in_start = True

    #: Delivered to the main thread to interrupt a job whose lease was lost.
    interrupt_signal = signal.SIGUSR1

    def execute_job(self, job: Job, queue: Queue) -> Any:
        # `_signal`, not `signal`: without the enum conversions of a swap and back per job
        previous = _signal.signal(self.interrupt_signal, self._interrupt_lost_job)
        self._interrupt_job_id: str | None = None
        self._interrupt_job = job
        self._watch_run(job)
        try:
            return super().execute_job(job, queue)
        finally:
            _signal.signal(self.interrupt_signal, previous)

    def _stop_lost_job(self, lease: Lease) -> None:
        """Interrupt the job, and end this process once its frame has unwound, or half the
        self-kill's delay later if its code does not give way (it swallows the interrupt,
        or is stuck in C code, where no Python exception lands), exiting 1: its watchdog
        then recovers the lease, fenced by its token (a lease found lost may be running
        elsewhere already: it is left as it is)."""
        why, cause = "stopped, its lease lost", ""
        if lease.expired and time.monotonic() <= lease.valid_until:  # a renewal refused it, in time
            cause = f"no progress for {lease.progress_timeout_ms} ms"
            why = f"stopped, {cause} (its progress timeout)"
        elif lease.expired:
            why = "stopped when its local lease clock ran out"
            cause = "its run passed its local lease deadline (no renewal landed in time)"
        if self._stop_run(lease.job_id, why, code=1, hand_back=False, cause=cause):
            self._interrupt_job_id = lease.job_id
            signal.pthread_kill(threading.main_thread().ident or 0, self.interrupt_signal)

    def _stop_running_job(self) -> bool:
        """The cold stop, in the signal handler, in this very thread: the job is
        interrupted by RQ's ``SystemExit``, raised next, and this process ends, as a stock
        cold stop does (exit status 0), once its frame has unwound or half the self-kill's
        delay later; its watchdog, seeing it gone, hands the job back."""
        job_id = self._running_job_id
        if job_id is None:
            return True  # no code of a job runs (before its start, or writing its outcome)
        return not self._stop_run(job_id, "stopped cold", code=0, hand_back=True)

    def _interrupt_lost_job(self, signum: int, frame: FrameType | None) -> None:
        job_id, self._interrupt_job_id = self._interrupt_job_id, None
        # only the job's own code is interrupted: once it has ended (its outcome is being
        # written, or RQ's bookkeeping runs) the interrupt would hit RQ's code instead
        if job_id is not None and job_id == self._running_job_id:
            # a lost lease is no failure (the sweep decides what becomes of the job, and it
            # may finish elsewhere, as after a failover): RQ's failure path that this
            # exception enters must not run the job's failure callback, as a forking
            # worker's SIGKILLed horse runs none
            compat.drop_failure_callback(self._interrupt_job)
            raise LeaseJobInterrupted(f"job {job_id}: lease lost, job stopped")
