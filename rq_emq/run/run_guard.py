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
import time
from collections.abc import Callable
from typing import Any

from .. import reporter
from ..hold.held import Lease
from . import seen_death
from .horse_fence import HorseDeadline
from .job_lease import lease_clock
from .lifeline import Lifeline, arm
from .process_tree import end_session, kill_tree
from .watchdog import Watchdog

logger = reporter.PathLogger("rq_emq.lease")  # code the lock manager's threads run


class RunGuard:
    """The shared deadline memory and the watchdog process of one worker."""

    _horse_deadline: HorseDeadline | None = None
    _watchdog: Watchdog | None = None
    #: the run is a horse leading its own process group (else: the worker itself)
    _run_is_horse = True
    #: what ends a horse whose worker and watchdog are both gone (:mod:`.lifeline`)
    _lifeline: Lifeline | None = None

    def _lifeline_for_horses(self) -> Lifeline | None:
        """The worker's lifeline, made once: a horse arms its read end as it starts."""
        if self._run_is_horse and self._lifeline is None:
            try:
                self._lifeline = Lifeline()
            except OSError as error:  # no descriptor to be had: the horse's own fence remains
                logger.warning("no lifeline for this worker's horses: %s", error)
        return self._lifeline

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
                # this worker's lifeline now (a worker object's work() may run again, and
                # each run of it makes its own)
                lifeline = self._lifeline_for_horses()
                self._watchdog.lifeline_fd = lifeline.write_fd if lifeline is not None else -1
                self._watchdog.start()
                if self._keeper is None or not self._keeper.is_alive():
                    self._keeper = threading.Thread(
                        target=self._keep_watchdog,
                        args=(self._watchdog,),
                        name="rq-emq-watchdog-keeper",
                        daemon=True,
                    )
                    self._keeper.start()

    _keeper: threading.Thread | None = None

    def _keep_watchdog(self, watchdog: Watchdog) -> None:
        """The keeper thread: waits on the watchdog process (the GIL released) and starts
        a new one the moment it dies on its own (an operator, a stray ``pkill python``,
        the OOM killer). A run is without its backstop for the few milliseconds of a
        start, not until the next renewal or run, and no Redis round trip waits on it."""
        while not watchdog.stopping:
            watchdog.wait()
            if watchdog.stopping:
                return
            if not self._replace_dead_watchdog():
                time.sleep(1.0)  # no process to be had now (EAGAIN, ENOMEM): try again

    def _replace_dead_watchdog(self) -> bool:
        """A new watchdog for one that died; the new one reads the run's pid and deadline
        from the shared memory as it starts. False when none could be started."""
        watchdog = self._watchdog
        if watchdog is None or not watchdog.pid or watchdog.alive:
            return True  # none (not wanted), stopped on purpose, or alive
        dead = watchdog.pid
        try:
            self._start_watchdog()
        except OSError as error:
            if self._watchdog_refused != dead:  # said once per dead watchdog, not per try
                self._watchdog_refused = dead
                logger.error("the watchdog (pid %d) died and none could be started: %s", dead, error)
            return False
        logger.warning("the watchdog (pid %d) died; started a new one (pid %d)", dead, watchdog.pid)
        return True

    def _stop_watchdog(self) -> None:
        if self._watchdog is not None:
            self._watchdog.stop()
        if self._lifeline is not None:  # no horse runs any more: nothing for it to end
            self._lifeline.close()
            self._lifeline = None

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
    #: in a spawned horse: the lifeline's read end its worker handed down (a forked horse
    #: reads it from its copy of the worker's ``_lifeline``)
    _lifeline_fd = -1

    def _arm_lifeline(self) -> None:
        """In a horse (or a spare) leading its process group (:func:`.lifeline.arm`)."""
        me: Any = self
        fd = me._lifeline.read_fd if me._lifeline is not None else self._lifeline_fd
        if fd >= 0:
            arm(fd)

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
