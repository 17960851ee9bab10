"""A ``SimpleLeaseWorker``'s run is the worker process itself, and a stopped run is over
only when that process is.

A job that returned on its own (finished, or failed by its own exception) is over when it
returns, as in stock RQ. Every other end of its run (a cold stop, the lease lost or its
local clock out, a progress timeout, a write of the run refused by the guard) interrupts
the job and ends the process: the job's frame may unwind while threads it started (a
``ThreadPoolExecutor``, a ``Thread`` it joins) work on, and only the process's death,
seen by its watchdog (:mod:`rq_emq.run.watchdog`), which outlives it, proves them gone.
The watchdog then hands the lease back, no attempt counted (a cold stop), or recovers it
as a crash (every other end), fenced by its token (:mod:`rq_emq.run.seen_death`); it ends
the process itself a check interval after that end was due, should no thread of it run.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from rq.job import Job

from .. import reporter
from ..fence.fencing import LeaseLost
from ..fence.job_writes import LeaseJobInterrupted
from ..hold.held import Lease
from . import stand_in
from .horse_fence import HorseDeadline
from .process_tree import kill_tree, tree
from .watchdog import Watchdog

logger = reporter.PathLogger("rq_emq.lease")  # code the lock manager's threads run


@dataclasses.dataclass
class SimpleStop:
    """A stop of a ``SimpleLeaseWorker``'s run that is not its job returning: the run is
    over only when this process is, so the process ends with it."""

    run: int  #: the run's serial in this process (one job id may run here twice in a row)
    job_id: str
    why: str  #: what stopped it, for the one line that says so
    code: int  #: the process's exit status
    #: set once the job's frame has unwound: the process ends then, not a delay later
    unwound: threading.Event = dataclasses.field(default_factory=threading.Event)


#: One end per process: a second stop that reaches it waits here for the exit.
_ENDING = threading.Lock()


class SimpleRunGuard:
    """Put before ``LeaseMixin``: a ``SimpleLeaseWorker``'s run is the worker process."""

    _horse_deadline: HorseDeadline | None
    _watchdog: Watchdog | None
    _run_is_horse = False
    _watched_job_id: str | None = None
    _running_job_id: str | None
    #: Counts this process's runs: a stop is for one run, not for its job id
    _run_serial = 0
    #: The stop that ends this process, once one came
    _stop: SimpleStop | None = None

    def _watch_run(self, job: Job) -> None:
        """The watchdog ends this process (and its descendants) one check interval after
        the self-kill's moment, even if no thread of it can run at all."""
        me: Any = self
        if self._watchdog is not None:
            me._start_watchdog()  # again, if it was killed on its own
        lease = me.lock_manager.get(job.id) if me.lock_manager is not None else None
        self._watched_job_id = job.id
        self._run_serial += 1
        if self._horse_deadline is not None and lease is not None:
            self._horse_deadline.reset(me._run_deadline(lease), pid=os.getpid())
            self._stand_in_for(lease, job)
            if self._watchdog is not None and self._horse_deadline.start_run(os.getpid()):
                self._watchdog.poke()

    def _stand_in_for(self, lease: Lease, job: Job) -> None:
        """The renewal part of the lease the watchdog holds: it renews in this process's
        place while the job keeps this process's threads from running (the GIL held in C
        code): :mod:`rq_emq.run.stand_in`."""
        deadline = self._horse_deadline
        held = deadline.held_lease() if deadline is not None else None
        if deadline is None or not held:
            return
        me: Any = self
        after_s = self._self_kill_delay_s() + me.lease_settings.lease_check_interval_s
        part = stand_in.renewal_part(lease, me.lease_settings, after_s, getattr(job, "timeout", None))
        deadline.hold_lease(json.dumps({**json.loads(held), "renew": part}))

    def _stand_in_renewed(self, lease: Lease) -> float | None:
        """When the watchdog last renewed ``lease`` in this process's place (the lock
        manager adopts it: ``LockManager.outside_renewal``)."""
        deadline = self._horse_deadline
        if deadline is None or lease.job_id != self._watched_job_id:
            return None
        return deadline.stand_in_renewed or None

    def _new_lock_manager(self, client: Any) -> Any:
        manager = super()._new_lock_manager(client)  # type: ignore[misc]
        manager.outside_renewal = self._stand_in_renewed
        return manager

    def _stopping_this_run(self) -> SimpleStop | None:
        stop = self._stop
        return stop if stop is not None and stop.run == self._run_serial else None

    def _stop_run(self, job_id: str, why: str, code: int, hand_back: bool, cause: str = "") -> bool:
        """Stop the run of ``job_id`` for good (``why``: what stopped it): this process
        ends once the job's frame has unwound, or half the self-kill's delay after the
        stop, whichever comes first. False when the job's code has ended already (it
        returned on its own, or never started): nothing is stopped then. ``hand_back``: the
        watchdog hands the job back (a cold stop), else it recovers it as a crash, with
        ``cause`` as the crash's cause when given (the job's record, its failure reason)."""
        if self._stopping_this_run() is not None:
            return True  # an earlier stop ends the process already
        stop = SimpleStop(self._run_serial, job_id, why, code)
        # written before the running job is read, and the main thread clears the running
        # job before it reads the stop (handle_execution_ended): one of the two sees the
        # other, so a stop is never missed by both
        self._stop = stop
        if self._running_job_id != job_id:
            return False
        delay = self._self_kill_delay_s()
        deadline = self._horse_deadline
        if deadline is not None:
            held = deadline.held_lease()
            if held:
                # a stopped run is no run to renew: the watchdog stands in no more (and the
                # rewrite forgets its renewals, so the lowered deadline below is the run's)
                text = {name: value for name, value in json.loads(held).items() if name != "renew"}
                deadline.hold_lease(json.dumps({**text, "cause": cause} if cause else text))
            if hand_back:
                deadline.hand_back_on_death()
            me: Any = self
            check_s = me.lease_settings.lease_check_interval_s
            # the backstop: the watchdog, asleep until the lease's deadline, is told now
            deadline.set(min(deadline.get(), time.monotonic() + delay + check_s))
            if self._watchdog is not None:
                self._watchdog.poke()
        ender = threading.Thread(
            target=self._end_in_time, args=(stop, delay), name="rq-emq-run-end", daemon=True
        )
        ender.start()
        return True

    def _end_in_time(self, stop: SimpleStop, delay: float) -> None:
        """Half the self-kill's delay for the job's code to give way (its ``finally``
        blocks), the other half for the process's end."""
        stop.unwound.wait(delay / 2)
        self._end_process(stop)

    def handle_execution_ended(self, job: Job, *args: Any, **kwargs: Any) -> Any:
        # the job's own code has ended. A run it ended by a refused write of its own (the
        # job is not this lease's any more) is stopped, not returned (unless runs are never
        # stopped: stop_on_lease_lost off).
        error = sys.exc_info()[1]
        me: Any = self
        refused = isinstance(error, LeaseLost | LeaseJobInterrupted) and me.lease_settings.stop_on_lease_lost
        if refused and self._running_job_id == job.id:
            self._stop_run(
                job.id,
                "stopped, a write of its run refused (the job is not its lease's)",
                code=1,
                hand_back=False,
            )
        self._running_job_id = None  # before the stop is read: see _stop_run
        stop = self._stopping_this_run()
        if stop is not None:
            stop.unwound.set()
            self._end_process(stop)
        # a job that returned: what follows is the outcome's fenced writes
        self._watched_job_id = None
        if self._horse_deadline is not None:
            self._horse_deadline.clear()
        return super().handle_execution_ended(job, *args, **kwargs)  # type: ignore[misc]

    def _self_kill_delay_s(self) -> float:
        settings: Any = getattr(self, "lease_settings")  # noqa: B009
        return float(settings.lease_margin_ms + settings.renew_interval_ms) / 2000.0

    def _run_deadline(self, lease: Lease) -> float:
        # one check interval after the self-kill's moment: a worker whose threads run ends
        # itself first, with the log line that names the job
        me: Any = self
        check_s = me.lease_settings.lease_check_interval_s
        return float(super()._run_deadline(lease)) + self._self_kill_delay_s() + check_s  # type: ignore[misc]

    def _on_lease_renewed(self, lease: Lease) -> None:
        if self._horse_deadline is not None and lease.job_id == self._watched_job_id:
            if self._stopping_this_run() is None:  # a stopped run's end is due, renewed or not
                self._horse_deadline.set(self._run_deadline(lease))

    def _outcome_committed(self) -> None:
        super()._outcome_committed()  # type: ignore[misc]
        if self._horse_deadline is not None:
            self._horse_deadline.settle()

    def _end_process(self, stop: SimpleStop) -> None:
        """The end of a stopped run: this process's death in RQ, the lines still queued,
        one line naming the job and why, its descendants (the job's own processes), then
        ``os._exit``, which ends every thread of the job. Each step that may wait is
        bounded: the watchdog ends the process a check interval after the end was due."""
        with _ENDING:
            if threading.current_thread() is threading.main_thread():
                for sig in (signal.SIGINT, signal.SIGTERM):  # a cold stop now would cut this short
                    signal.signal(sig, signal.SIG_IGN)
            me: Any = self
            budget = self._self_kill_delay_s() / 4
            _within(me.register_death, budget)  # `rq info` lists it no more (else its key expires)
            logger.critical(
                "job %s: %s; ending the worker process, the only proof that the run is over",
                stop.job_id,
                stop.why,
                extra={"job_id": stop.job_id},
            )
            reporter.flush(budget)
            logging.shutdown()
            spare = frozenset({self._watchdog.pid}) if self._watchdog is not None else frozenset()
            for pid in tree(os.getpid()) - spare - {os.getpid()}:
                kill_tree(pid, spare=spare)
            os._exit(stop.code)


def _within(call: Callable[[], Any], timeout: float) -> None:
    """``call()`` on a thread of its own, waited for ``timeout`` seconds at most (Redis
    away: the process ends all the same)."""

    def run() -> None:
        try:
            call()
        except Exception:  # noqa: BLE001 - bookkeeping on the way out; the exit matters
            logger.debug("could not register the worker's death", exc_info=True)

    thread = threading.Thread(target=run, name="rq-emq-death", daemon=True)
    thread.start()
    thread.join(timeout)
