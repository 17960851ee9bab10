"""``LeaseMixin``: the lease behaviour both worker kinds share, put before RQ's worker class.

It composes the rooms at RQ's seams: the take (:class:`rq_emq.run.dequeue.DequeueMixin`),
the lock manager and RQ's heartbeats (:mod:`rq_emq.hold`), the fenced job writes
(:mod:`rq_emq.fence.job_writes`), the run guard and its watchdog
(:mod:`rq_emq.run.run_guard`) and the sweeper (:mod:`rq_emq.recover.sweep`): starting them
with the worker, and on every stop ending the run whole and handing back what it still
holds. The worker classes themselves are in :mod:`rq_emq.run.worker`.
"""

from __future__ import annotations

import logging
import math
import os
import signal
import threading
from collections.abc import Callable
from types import FrameType
from typing import Any

from redis import Redis
from redis.client import Pipeline
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError
from rq.job import Job
from rq.queue import Queue

from .. import compat, events, reporter, scripts
from ..connection import budget, failover
from ..connection.blips import BLIPS, wait_for_redis
from ..fence import fencing
from ..fence.fencing import LeaseLost
from ..fence.job_writes import JobWritesMixin, LeaseJobInterrupted
from ..hold.heartbeats import HeartbeatMixin
from ..hold.held import Lease
from ..hold.lease import LockManager
from ..intake import watch
from ..intake.take import Taker
from ..keys import QueueKeys, sweeper_election_key, sweeper_line_key
from ..recover.registries import pin_started_entries_of, prepare_registries
from ..recover.sweep import Sweeper
from ..settings import LeaseSettings
from . import logs
from .dequeue import DequeueMixin
from .job_lease import JobLease, current_lease, running
from .run_guard import RunGuard
from .startup import check_redis, worker_settings
from .worker_check import check_worker_class

logger = reporter.PathLogger("rq_emq.lease")  # code the lock manager's threads run


class LeaseMixin(DequeueMixin, HeartbeatMixin, JobWritesMixin, RunGuard):
    """The lease behaviour shared by both worker kinds (put before the RQ worker class)."""

    _is_lease_worker = True  # rq_emq.run.worker_check tells lease classes from RQ's by it

    # Settings as class attributes; None means "environment variable, else default".
    lease_ms: int | None = None
    renew_interval_ms: int | None = None
    sweep_interval_ms: int | None = None
    sweep_batch: int | None = None
    max_attempts: int | None = None
    stop_on_lease_lost: bool | None = None
    idle_poll_ms: int | None = None
    event_hooks: str | None = None

    connection: Redis
    name: str
    queues: list[Queue]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        names = LeaseSettings.names()
        overrides = {name: kwargs.pop(name) for name in names if name in kwargs}
        defaults = {name: getattr(type(self), name, None) for name in names}
        self.lease_settings = worker_settings(overrides, defaults)
        check_worker_class(self)
        super().__init__(*args, **kwargs)
        # the queue class it was given (--queue-class) stays as given, as in RQ's workers: a
        # leased run's started entry is pinned, so no queue class is needed to keep stock
        # cleanup off it; this process's stock registries get the lease-aware cleanup too
        me: Any = self
        prepare_registries(me.queues)
        compat.schedule_in_the_callers_transaction()
        self.lock_manager: LockManager | None = None
        self.sweeper: Sweeper | None = None
        self._taker: Taker | None = None
        self._last_heartbeat: tuple[float, int] = (-math.inf, 0)  # (monotonic, TTL) of the last sent alone
        self._burst = False
        #: RQ's work loop runs (its suspension check then rides with the take after it).
        self._in_work_loop = False
        #: RQ's suspension check is owed by the next take (its ``burst``); None: it is not.
        self._suspension_owed: bool | None = None

    # -- lifecycle ---------------------------------------------------------------------
    def work(self, *args: Any, **kwargs: Any) -> bool:
        self._burst = bool(kwargs.get("burst", args[0] if args else False))
        self._in_work_loop = True
        try:
            return bool(super().work(*args, **kwargs))  # type: ignore[misc]
        finally:
            self._in_work_loop = False

    def _start_scheduler(self, *args: Any, **kwargs: Any) -> None:
        """RQ's scheduler start (``--with-scheduler``), right after the worker registered: a
        Redis restart at that moment ended the worker (the soak found it); it waits for
        Redis and tries again, as the rest of the loop does."""
        parent: Any = super()
        self._riding_out_blips(lambda: parent._start_scheduler(*args, **kwargs), until_done=True)
        scheduler: Any = getattr(self, "scheduler", None)
        if scheduler is not None:
            # RQ's scheduler locks (``--with-scheduler``) go through a pool of RQ's own, in
            # this process: without the watch it stayed on a demoted master until the
            # demotion broke it (found by the Sentinel soak)
            failover.watch(scheduler.connection)

    def bootstrap(self, *args: Any, **kwargs: Any) -> None:
        self._set_up_logging(*compat.bootstrap_log_options(args, kwargs))
        check_redis(self.connection)  # before RQ registers the worker: a refusal leaves no trace
        self._start_watchdog()  # forked before RQ's and our threads start
        try:
            super().bootstrap(*args, **kwargs)  # type: ignore[misc]
        except BLIPS as error:
            self._finish_rq_bootstrap(error)
        self._riding_out_blips(self._start_leasing, until_done=True)
        settings = self.lease_settings
        me: Any = self
        assert self.lock_manager is not None
        self.sweeper = Sweeper(
            self.lock_manager.client,
            [q.name for q in self.queues],
            settings,
            name=f"rq-emq-sweeper:{self.name}",
            job_class=me.job_class,
            serializer=me.serializer,
            elect=True,  # one sweeper per queue set across the fleet; the others stand by
            queue_class=me.queue_class,
        )
        self._riding_out_blips(self.sweeper.record_job_prefix, until_done=True)
        self.sweeper.start()

    _rq_lines: logs.RqLines | None = None

    def _set_up_logging(self, logging_level: Any, date_format: str, log_format: str) -> None:
        """Our lines through a handler that follows RQ's logging options and names this
        worker (:mod:`rq_emq.run.logs`), and RQ's lines that would mislead about a job this
        worker handled dropped (:meth:`_misleading_rq_line`), whoever handles them."""
        logs.setup(self.name, logging_level, date_format, log_format, self.lease_settings.log_format)
        if self._rq_lines is None:
            self._rq_lines = logs.RqLines(self._misleading_rq_line)
            self._rq_logger().addFilter(self._rq_lines)

    def _rq_logger(self) -> logging.Logger:
        me: Any = self
        log = getattr(me, "log", None)
        return log if isinstance(log, logging.Logger) else logging.getLogger("rq.worker")

    #: The job whose outcome this process's fence discarded (its lease was lost) and whose
    #: run traceback of a lease stop is told in one line of ours, until the next run.
    _discarded_job_id: str | None = None
    _quiet_traceback_of: str | None = None

    def _misleading_rq_line(self, record: logging.LogRecord) -> bool:
        """RQ's lines that say the wrong thing about a job this worker handled: "Job OK"
        and "result is kept" for an outcome the fence discarded (the fence's line says so),
        the traceback of a run a lost lease interrupted (one line of ours says it)."""
        text = record.getMessage().lower()
        if self._discarded_job_id is not None and any(line in text for line in compat.RQ_SUCCESS_LINES):
            return True
        job_id = self._quiet_traceback_of
        return job_id is not None and compat.RQ_JOB_RAISED_LINE in text and job_id.lower() in text

    def handle_exception(self, job: Job, *exc_info: Any) -> Any:
        """RQ's, which logs the job's traceback and runs the exception handlers; for a run
        a lost lease ended (interrupted, or a fenced write refused) the traceback is one
        line of ours instead: the job did not fail, the sweep decides what becomes of it."""
        error = exc_info[1] if len(exc_info) > 1 else None
        if not isinstance(error, LeaseJobInterrupted | LeaseLost):
            return super().handle_exception(job, *exc_info)  # type: ignore[misc]
        self._quiet_traceback_of = job.id
        try:
            return super().handle_exception(job, *exc_info)  # type: ignore[misc]
        finally:
            self._quiet_traceback_of = None
            logger.warning(
                "job %s on queue %s: run stopped, its lease is no longer this worker's (%s); "
                "the sweep recovers it, attempt counted",
                job.id,
                job.origin,
                error,
                extra={"job_id": job.id, "queue": job.origin},
            )

    def _finish_rq_bootstrap(self, error: Exception) -> None:
        """Redis went away after the startup check, within RQ's bootstrap (its birth,
        pubsub and state writes): found by a restart test, where it ended `rq worker`. Wait
        for Redis and do what is missing; each step is safe to repeat."""
        me: Any = self
        while True:
            me.log.error("Worker %s: could not reach Redis as it started: %s; waiting for it", me.name, error)
            wait_for_redis(self.connection, stop=lambda: bool(me._stop_requested))
            try:
                if not self.connection.exists(me.key):  # a restarted Redis forgot the birth
                    me.register_birth()
                if getattr(me, "pubsub_thread", None) is None:
                    me.subscribe()
                me.set_state(compat.WorkerStatus.STARTED)
                return
            except BLIPS as again:
                error = again

    def _before_idle_wait(self) -> None:
        """The take found no job and waits: a moment for what need not come sooner."""

    def _start_leasing(self) -> None:
        """What a take needs: the scripts, a taker and a running lock manager. Done by
        ``bootstrap``, or on first use when a tool calls RQ's methods without ``work()``."""
        if self._taker is not None and self.lock_manager is not None:
            return
        # work every horse would otherwise repeat per job, done once before any fork
        compat.resolve_driver_info_once(self.connection.connection_pool)
        compat.resolve_server_version_once(self.connection)
        fencing.prepare(self.connection)
        scripts.load_all(self.connection)
        settings = self.lease_settings
        self._taker = Taker(self.connection, self.name, settings)
        self._taker.before_wait = self._before_idle_wait
        self._taker.stop_requested = self._told_to_stop
        control = budget.control_client(self.connection, settings.redis_timeout_s)
        self.lock_manager = self._new_lock_manager(control)
        self._lender = budget.WorkConnectionLender(self.connection, control)
        line = self._pubsub_line
        if line is not None and line.client_id is not None:
            me: Any = self
            layouts = [QueueKeys.named(q.name, type(q), me.job_class) for q in self.queues]
            self._taker.watch = watch.QueueSetWatch(
                self.connection, control, self.name, layouts, settings.lease_ms, line
            )
            self._taker.watch.stop_requested = self._told_to_stop
        self.lock_manager.start()
        # a Sentinel failover breaks these connections at once, and they reconnect to the
        # master Sentinel names now (not to the old one, writable until its demotion)
        failover.watch(self.connection)
        failover.watch(self.lock_manager.client)
        manager = self.lock_manager
        # RQ's started-registry entries of our leased runs never fall due (registries.py)
        pin_started_entries_of(lambda job_id: manager.get(job_id) is not None)

    def _new_lock_manager(self, client: Redis) -> LockManager:
        settings = self.lease_settings
        return LockManager(
            client,
            settings.lease_ms,
            settings.renew_interval_ms,
            on_lost=self._on_lease_lost,
            on_tick=self._on_tick,
            name=f"rq-emq-lock-manager:{self.name}",
            lease_writes=self._heartbeat_execution,
            margin_ms=settings.lease_margin_ms,
            check_interval_s=settings.lease_check_interval_s,
            on_expired=self._on_lease_expired,
            on_renewed=self._on_lease_renewed,
        )

    def _on_tick(self, pipe: Pipeline, leases: list[Lease]) -> None:
        """Each renewal tick, in the lock manager's thread: the idle watch is kept, and RQ's
        heartbeats ride with the renewal (RQ's log line about it goes to the reporter
        thread: ``HeartbeatMixin.log``)."""
        idle_watch = self._taker.watch if self._taker is not None else None
        if idle_watch is not None:
            try:
                idle_watch.keep()
            except Exception as error:  # never in the way of the renewal; taken again after
                if idle_watch.watching:
                    logger.info("the idle watch is given up for a moment: %s", error)
                idle_watch.lost()
        self._tick_heartbeats(pipe, leases)

    def teardown(self) -> None:
        if not self.is_horse:  # type: ignore[attr-defined]
            # a stop between the take and the job's start: nothing ran, hand it back now
            self._hand_back_leases(unstarted_only=True)
            try:  # RQ's "idle" of the last run, if its loop did not send it (max jobs reached)
                self.send_held_state()
            except BLIPS:
                pass  # Redis is away: the worker's key expires on its own
            for timer in (self.sweeper, self.lock_manager):
                if timer is not None:
                    timer.stop()
            if self._taker is not None:
                self._taker.close()
            self._stop_watchdog()
            if self._rq_lines is not None:
                self._rq_logger().removeFilter(self._rq_lines)
                self._rq_lines = None
            # the hooks' and the reporter's threads are daemons: a short, bounded chance for
            # the events and log lines still queued (a pool member ends with os._exit, which
            # runs no atexit handler)
            events.drain_at_exit()
            reporter.drain_at_exit()
        super().teardown()  # type: ignore[misc]

    _lender: budget.WorkConnectionLender | None = None

    _pubsub_line: watch.PubsubLine | None = None
    #: Several queues are waited on with the set's idle watch (one connection); False: with
    #: a connection per queue (:mod:`rq_emq.intake.wake`), as where Redis refuses the watch.
    _watch_idle = True

    def subscribe(self) -> None:
        """RQ's, with more on the same connection (:mod:`rq_emq.connection.budget`): the
        sweeper election's line, where a standby hears the sweeper's call, and on several
        queues the invalidations that wake the set's idle watcher (:mod:`rq_emq.intake.watch`)."""
        me: Any = self
        layout = QueueKeys.named("", me.queue_class, me.job_class)
        names = [q.name for q in self.queues]
        election = sweeper_election_key(names, layout.queue_prefix, layout.job_prefix)
        channels = {sweeper_line_key(election): self._line_called}
        line = None
        if len(set(names)) > 1 and self._watch_idle:
            resp3 = watch.can_watch(self.connection)
            if resp3 is not None:
                line = watch.PubsubLine(self._queue_written, resp3, self._pubsub_reconnected)
                channels.update(line.channels())
        with budget.subscribing_also(self.connection, channels, line.name_it if line else None):
            super().subscribe()  # type: ignore[misc]
        self._pubsub_line = line

    def _line_called(self, message: Any) -> None:
        election = self.sweeper.election if self.sweeper is not None else None
        if election is not None:
            election.heard()

    def _queue_written(self, message: Any) -> None:
        taker_watch = self._taker.watch if self._taker is not None else None
        if taker_watch is not None:
            taker_watch.heard(message)

    def _pubsub_reconnected(self) -> None:
        taker_watch = self._taker.watch if self._taker is not None else None
        if taker_watch is not None:
            taker_watch.lost()

    def unsubscribe(self) -> None:
        """RQ's, with its pubsub thread told to stop before the UNSUBSCRIBE whose reply
        wakes it. In RQ's order (2.1 on) the thread takes that reply and goes back to its
        60 s wait before it is told, so every worker exit waited out RQ's 1 s join (with
        redis-py 8.2, whose stop() joins, the whole 60 s). Ours is told without a wait."""
        thread = getattr(self, "pubsub_thread", None)
        if thread is not None:
            compat.ask_pubsub_thread_to_stop(thread)
        try:
            super().unsubscribe()  # type: ignore[misc]
        except (RedisConnectionError, RedisTimeoutError) as error:
            # The thread, told to stop, closes the pubsub's connection as its last step: a
            # reply it was already reading (the SUBSCRIBE's, late on a loaded host) lets it
            # do so while the UNSUBSCRIBE goes out. The subscription ends with the
            # connection either way; the rest of the stop must not be skipped for it.
            logging.getLogger("rq.worker").debug("pubsub closed as it unsubscribed: %s", error)
            if thread is not None:
                thread.join(timeout=1)
            pubsub = getattr(self, "pubsub", None)
            if pubsub is not None:
                pubsub.close()

    def check_for_suspension(self, burst: bool) -> None:
        """RQ's `rq suspend` check, run by its work loop before each take: there it rides
        with the take that follows, in the pop's round trip, the pop refusing while the
        workers are suspended (rq_emq.run.dequeue); called elsewhere, it runs at once."""
        if self._in_work_loop:
            self._suspension_owed = burst
            return
        self.check_suspension_now(burst)

    def check_suspension_now(self, burst: bool) -> None:
        """RQ's check in its own transaction (RQ's worker heartbeat and the state held back
        ride in it): while suspended it waits, or in burst ends the worker."""
        self._suspension_owed = None
        parent: Any = super()
        landed: list[bool] = []

        def check() -> None:
            parent.check_for_suspension(burst)
            landed.append(True)

        self._checking_suspension = True
        try:
            self._riding_out_blips(check)
        finally:
            self._checking_suspension = False
        self.suspension_checked(landed=bool(landed))

    def run_maintenance_tasks(self) -> None:
        """RQ's registry maintenance, run by its work loop between takes."""
        parent: Any = super()
        self._riding_out_blips(parent.run_maintenance_tasks)

    def _riding_out_blips(self, step: Callable[[], Any], until_done: bool = False) -> None:
        """A step of RQ's work loop outside its dequeue: a Redis blip there (a restart, a
        reset) ended `rq worker` (found by the soak). A LeaseWorker waits for Redis and
        goes on, as RQ's own dequeue does; the step runs again on the next loop (or, with
        ``until_done``, at once, until it succeeds or a stop is requested)."""
        me: Any = self
        while True:
            try:
                step()
                return
            except BLIPS as error:
                me.log.error("Worker %s: could not reach Redis: %s; waiting for it", me.name, error)
                wait_for_redis(self.connection, stop=lambda: bool(me._stop_requested))
                if not until_done or me._stop_requested:
                    return

    # -- run -----------------------------------------------------------------------------
    def perform_job(self, job: Job, *args: Any, **kwargs: Any) -> Any:
        """RQ's run of the job (in the horse, or in a ``SimpleLeaseWorker`` itself), with
        its lease as ``rq_emq.current_lease()`` while the job runs."""
        lease = self.lock_manager.get(job.id) if self.lock_manager is not None else None
        if lease is None:
            return super().perform_job(job, *args, **kwargs)
        job_lease = JobLease(
            lease,
            job.connection,
            lambda: self._held_until(lease),
            lambda: self._stop_asked(lease),
            self._report_to(lease),
        )
        with running(job_lease):
            return super().perform_job(job, *args, **kwargs)

    perform_job.__signature__ = JobWritesMixin.perform_job.__signature__  # type: ignore[attr-defined]

    def handle_execution_ended(self, job: Job, *args: Any, **kwargs: Any) -> Any:
        """RQ calls this as the job's code has ended, before its success or failure path.
        A run whose lease is gone (it raised LeaseLost from a refused fenced write, or its
        clock ran out while it ran on) did not fail as the job: RQ's failure path, whose
        writes the fence refuses, must not run the job's failure callback either, as a
        SIGKILLed horse runs none. The sweep decides what becomes of the job."""
        lease = current_lease()
        if lease is not None and lease.job_id == job.id and (lease.loss_seen or not lease.held):
            compat.drop_failure_callback(job)
        return super().handle_execution_ended(job, *args, **kwargs)  # type: ignore[misc]

    def _told_to_stop(self) -> bool:
        """A warm stop was requested (read by the idle waits: rq_emq.intake.take)."""
        me: Any = self
        return bool(me._stop_requested)

    def request_stop(self, signum: int, frame: FrameType | None) -> None:
        """A warm shutdown: RQ's, and the running job told (``current_lease().stopping``);
        with ``shutdown_timeout_ms`` set, a run still going then is stopped and its job
        handed back (:meth:`_shutdown_timeout_passed`). RQ's own raises StopRequested
        at once when no job runs."""
        self._tell_run_stopping()
        # RQ sets its flag only when a job runs, and else raises StopRequested into whatever
        # the main thread runs; set here too, a raise that a handler caught, or that Python
        # ignored (a stop that lands in an at-fork hook, as a pool member forks), is still read (the
        # idle waits: rq_emq/intake/take.py; the wait loop: rq_emq/run/dequeue.py)
        me: Any = self
        me._stop_requested = True
        super().request_stop(signum, frame)  # type: ignore[misc]
        timeout_ms = self.lease_settings.shutdown_timeout_ms
        if timeout_ms and self._shutdown_timer is None:
            self._shutdown_timer = threading.Timer(timeout_ms / 1000, self._shutdown_timeout_passed)
            self._shutdown_timer.daemon = True
            self._shutdown_timer.start()

    _shutdown_timer: threading.Timer | None = None

    def _shutdown_timeout_passed(self) -> None:
        """The warm stop waited ``shutdown_timeout_ms``: it turns into RQ's cold stop, the
        second stop signal, in the main thread (a Kubernetes pod leaves within its grace
        period instead of being SIGKILLed mid-job). That stop ends the run whole and hands
        its job back to the front of its queue, attempt refunded (:meth:`request_force_stop`)."""
        logger.warning(
            "a job still runs %d ms after the warm stop (shutdown_timeout_ms): stopping it and "
            "handing it back to its queue",
            self.lease_settings.shutdown_timeout_ms,
        )
        os.kill(os.getpid(), signal.SIGTERM)

    def _cancel_shutdown_timeout(self) -> None:
        if self._shutdown_timer is not None:
            self._shutdown_timer.cancel()

    def execute_job(self, job: Job, queue: Queue) -> Any:
        self._holding_state = True
        try:
            return super().execute_job(job, queue)  # type: ignore[misc]
        except LeaseLost:
            # its start was refused before any of its code ran (RQ ended or took the job
            # since the take): the lease, left whole by the refusal, is renewed no more and
            # its lock lapses; the sweep then leaves the job where RQ put it
            return None
        except (RedisConnectionError, RedisTimeoutError) as error:
            # RQ's work loop quits on this; a worker that lost Redis for a moment around a
            # job waits for it instead, as RQ does while it dequeues. Whatever outcome this
            # worker could not write, the lease it no longer renews hands to the sweep.
            logger.error(
                "job %s: Redis unreachable as it ended (%s); waiting for Redis",
                job.id,
                error,
                extra={"job_id": job.id, "queue": queue.name},
            )
            me: Any = self
            wait_for_redis(self.connection, stop=lambda: bool(me._stop_requested))
            return None
        finally:
            self._holding_state = False
            self._held_back_record_sent(job, landed=False)  # a start that never ran
            self._run_ended()
            if self.lock_manager is not None:
                self.lock_manager.remove(job.id)
            self._cancel_shutdown_timeout()  # the job ended in time: the warm stop goes on
            self.job_ended()

    def _on_lease_lost(self, lease: Lease) -> None:
        if self.lease_settings.stop_on_lease_lost:
            logger.warning(
                "job %s on queue %s: stopping it, its lease is lost",
                lease.job_id,
                lease.queue,
                extra={"job_id": lease.job_id, "queue": lease.queue},
            )
            self._stop_lost_job(lease)

    def _on_lease_expired(self, lease: Lease) -> None:
        """The local lease clock ran out: stop the job now, whatever Redis says (or does
        not say), so that it has stopped before the sweep may hand it to someone else.
        With ``stop_on_lease_lost`` off the job runs on (that setting gives up the
        no-overlap guarantee; its outcome is still fenced)."""
        if self.lease_settings.stop_on_lease_lost:
            self._stop_lost_job(lease)

    def _on_lease_renewed(self, lease: Lease) -> None:
        """A renewal moved the lease's local deadline (fork mode tells its horse)."""

    def _stop_lost_job(self, lease: Lease) -> None:
        raise NotImplementedError

    # -- stop now --------------------------------------------------------------------------
    def request_force_stop(self, signum: int, frame: FrameType | None) -> None:
        # a job moves only after the run that had it is over (docs/guarantees.md)
        if not compat.is_repeated_stop_signal(self) and self._stop_running_job():
            self._hand_back_leases()
        super().request_force_stop(signum, frame)  # type: ignore[misc]

    def _stop_running_job(self) -> bool:
        """End the running job's run; True once it is over, so its job may be handed back
        now. Fork mode kills and reaps the horse; in simple mode the job runs in this very
        thread, and it hands its job back itself once its frame has unwound (False)."""
        return True

    def _hand_back_leases(self, unstarted_only: bool = False) -> None:
        if self.lock_manager is None:
            return
        for lease in self.lock_manager.held():
            if unstarted_only and lease.execution is not None:
                continue  # it may be running: its lease lapses and the sweep recovers it
            try:
                returned = lease.hand_back(self.connection)
            except Exception:
                logger.exception("job %s: could not hand it back to queue %s", lease.job_id, lease.queue)
                continue
            # Stop renewing, but keep the lease so RQ's own finish of this job is fenced out.
            lease.lost = True
            if returned:
                logger.warning(
                    "job %s handed back to the front of queue %s (the worker is stopping)",
                    lease.job_id,
                    lease.queue,
                    extra={"job_id": lease.job_id, "queue": lease.queue},
                )
