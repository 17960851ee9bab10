"""What ties a worker's runs to its watchdog, and ends them whole.

A run is a horse and its descendants (``LeaseWorker``, ``SpawnLeaseWorker``) or the worker
process itself (``SimpleLeaseWorker``). The worker tells the memory it shares with its
watchdog (:class:`rq_emq.run.horse_fence.HorseDeadline`) which process the run is and when its
lease deadline falls; the watchdog (:mod:`rq_emq.run.watchdog`) ends it past that, and every
stop the worker makes ends the run's whole tree (:mod:`rq_emq.run.process_tree`).

- :class:`RunGuard` (in ``LeaseMixin``): the shared memory, the watchdog's life, a run's end.
- :class:`HorseRunGuard` (``LeaseWorker``): a horse's pid and deadline, its tree kill.
- :class:`rq_emq.run.simple_run.SimpleRunGuard` (``SimpleLeaseWorker``): the worker as the run.
"""

from __future__ import annotations

import math
import os
import signal
import threading
from collections.abc import Callable
from typing import Any

from .. import reporter
from ..hold.held import Lease
from . import seen_death
from .horse_fence import HorseDeadline
from .job_lease import lease_clock
from .process_tree import end_session, kill_tree
from .watchdog import Watchdog

logger = reporter.PathLogger("rq_emq.lease")  # code the lock manager's threads run


class RunGuard:
    """The shared deadline memory and the watchdog process of one worker."""

    _horse_deadline: HorseDeadline | None = None
    _watchdog: Watchdog | None = None
    #: the run is a horse leading its own process group (else: the worker itself)
    _run_is_horse = True

    def _new_run_deadline(self) -> HorseDeadline:
        return HorseDeadline.in_memfd()  # shared with forked horses and the watchdog

    #: one start of a watchdog at a time: the main thread's (a run begins) and the lock
    #: manager's (one died mid-run) may meet
    _watchdog_starting = threading.Lock()
    #: the dead watchdog whose replacement the host refused (said once)
    _watchdog_refused = 0

    def _start_watchdog(self) -> None:
        """The process that ends a run past its deadline (:mod:`rq_emq.run.watchdog`); with
        ``stop_on_lease_lost`` off runs are never stopped, and none is started."""
        me: Any = self
        if not me.lease_settings.stop_on_lease_lost or not hasattr(signal, "sigtimedwait"):
            return  # never stopped, or not Linux (the horse's thread fences it alone there)
        with self._watchdog_starting:
            if self._horse_deadline is None:
                self._horse_deadline = self._new_run_deadline()
            if self._watchdog is None:
                try:
                    kit = seen_death.recovery_kit(me.connection, me.lease_settings.max_attempts)
                except Exception:  # noqa: BLE001 - whatever it lacks, a dead worker's job waits for the sweep
                    logger.debug("no seen-death hand-back for this worker", exc_info=True)
                    kit = None
                self._watchdog = Watchdog(self._horse_deadline, group=self._run_is_horse, kit=kit)
            if not self._watchdog.alive:  # killed on its own: a new one for the next run
                self._watchdog.start()

    def _replace_dead_watchdog(self) -> None:
        """A watchdog that died while a run goes on (killed on its own: an operator, a
        stray ``pkill python``, the OOM killer) is replaced now, from the lock manager's
        thread, which runs while the job holds the GIL in the horse: waiting for the next
        run would leave this one without its backstop, and a worker frozen or killed next
        would leave a GIL-holding horse running beside its job's next run. The new one
        reads the run's pid and deadline from the shared memory as it starts."""
        watchdog = self._watchdog
        if watchdog is None or not watchdog.pid or watchdog.alive:
            return  # none (not wanted), stopped on purpose, or alive
        dead = watchdog.pid
        try:
            self._start_watchdog()
        except OSError as error:  # no process to be had now (EAGAIN, ENOMEM): the next tick tries again
            if self._watchdog_refused != dead:  # said once per dead watchdog, not per tick
                self._watchdog_refused = dead
                logger.error("the watchdog (pid %d) died and none could be started: %s", dead, error)
            return
        logger.warning("the watchdog (pid %d) died; started a new one (pid %d)", dead, watchdog.pid)

    def _stop_watchdog(self) -> None:
        if self._watchdog is not None:
            self._watchdog.stop()

    def _run_ended(self) -> None:
        """The run's process is gone: nothing for the watchdog to end or hand back any more."""
        if self._horse_deadline is not None:
            self._horse_deadline.clear()
            self._horse_deadline.hold_lease("")

    def _lease_taken(self, lease: Lease) -> None:
        """A take: the lease the watchdog hands back should this worker die holding it."""
        if self._horse_deadline is not None and self._watchdog is not None:
            self._horse_deadline.hold_lease(seen_death.lease_text(lease))

    def _run_deadline(self, lease: Lease) -> float:
        """When the watchdog ends this lease's run (monotonic): its local deadline."""
        return math.inf if lease.settled else lease.valid_until

    # -- what the running job reads (rq_emq.current_lease()) -------------------------------
    _stop_told = False

    def _held_until(self, lease: Lease) -> float:
        """The run's local lease deadline, as the process running the job sees it (here:
        the worker itself, whose lock manager keeps ``lease``)."""
        return lease_clock(lease)

    def _stop_asked(self, lease: Lease) -> bool:
        return self._stop_told

    def _report_to(self, lease: Lease) -> Callable[[str], None]:
        """Where the running job's reports go: here, the lease its lock manager renews."""
        return lease.post_report

    def _tell_run_stopping(self) -> None:
        """The worker was asked to stop while a run may go on (a warm shutdown)."""
        self._stop_told = True
        if self._horse_deadline is not None:
            self._horse_deadline.request_stop()


class HorseRunGuard:
    """Put before ``LeaseMixin``: a horse's part in the guard."""

    _horse_deadline: HorseDeadline | None
    _watchdog: Watchdog | None
    _watched = False  # the horse's worker runs a watchdog (copied into the horse by the fork)

    def _end_dead_run(self, horse_pid: Any) -> None:
        """After a dead horse's group (recover/horse_crash.py): its session, which it leads
        (process_tree.lead_own_session). A child of the job that leads a process group of
        its own is out of the group's reach but still in the session; it worked on for
        2.3 s beside the job's next run."""
        if isinstance(horse_pid, int) and horse_pid > 0:
            end_session(horse_pid)

    def _held_until(self, lease: Lease) -> float:
        """In the horse: the deadline its worker writes after each renewal (the horse's
        copy of the lease is never renewed)."""
        if self._horse_deadline is None:
            return lease_clock(lease)
        return self._horse_deadline.get()

    def _stop_asked(self, lease: Lease) -> bool:
        return self._horse_deadline is not None and self._horse_deadline.stopping

    def _report_to(self, lease: Lease) -> Callable[[str], None]:
        """In the horse: the memory its worker reads before each renewal."""
        if self._horse_deadline is None:
            return lease.post_report
        return self._horse_deadline.post_report

    def _horse_forking(self, deadline: float) -> None:
        """In the worker, before the fork: the run's deadline, its pid not known yet."""
        me: Any = self
        if self._watchdog is not None:
            me._start_watchdog()
        self._watched = self._watchdog is not None and self._watchdog.alive
        if self._horse_deadline is not None:
            self._horse_deadline.reset(deadline)

    def _horse_forked(self) -> None:
        """In the worker, after the fork: the run's pid. The watchdog is not poked from
        here: the horse pokes it as it starts (``HorseDeadline.run_started_here``, which a
        horse of a watched worker always runs), and a second wake of the watchdog per job
        cost it some 0.1 ms of CPU for nothing it did not know."""
        me: Any = self
        if self._horse_deadline is not None:
            self._horse_deadline.pid = me.horse_pid

    def _run_ended(self) -> None:
        deadline = self._horse_deadline
        if deadline is not None and deadline.pid and not deadline.settled:
            # a horse that ended with no outcome (killed from outside: the OOM killer) may
            # leave children in its group; the group's id is never reused while one lives
            try:
                os.killpg(deadline.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        super()._run_ended()  # type: ignore[misc]

    def kill_horse(self, sig: signal.Signals = signal.SIGKILL) -> None:
        """With SIGKILL (every stop: ours, RQ's stop command, a cold stop) the horse's
        whole tree, its own sessions included, instead of RQ's ``killpg``; other signals
        as RQ sends them."""
        me: Any = self
        if sig != signal.SIGKILL:
            super().kill_horse(sig)  # type: ignore[misc]
            return
        # the pid read once: RQ's own kill reads it again, and a horse reaped meanwhile by
        # the main thread (pid 0) made it killpg(getpgid(0)), the worker's own group (the
        # soak found it: a lease clock stop racing the horse's end)
        pid = me.horse_pid
        if pid:
            kill_tree(pid, group=True)
            me.log.info("Worker %s: killed horse pid %s and its processes", me.name, pid)
