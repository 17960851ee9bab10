"""Taking a job: RQ's dequeue seam, with RQ's pop replaced by an atomic take under a lease.

Owns the worker's wait loop (``dequeue_job_and_maintain_ttl``), turning a take
(:mod:`rq_emq.intake.take`) into RQ's ``Job`` with its lease recorded, RQ's dequeue log line, a
job whose hash cannot be read (moved to failed, never dropped), and a burst worker's
last sweep before it exits.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time
from typing import Any

from redis import Redis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError
from rq.job import Job
from rq.logutils import blue, green
from rq.queue import Queue
from rq.suspension import WORKERS_SUSPENDED
from rq.utils import now

from .. import compat
from ..connection import failover
from ..fence.fencing import LeaseLost, fenced
from ..hold.held import Lease
from ..hold.lease import LockManager
from ..intake.take import Between, Taken, Taker, WorkersSuspended
from ..keys import QueueKeys
from ..recover.sweep import Sweeper
from ..settings import job_max_attempts, job_progress_timeout

logger = logging.getLogger("rq_emq.lease")

#: ``job.meta`` key a stock ``rq.Queue`` producer sets to give one job its own max attempts.
META_MAX_ATTEMPTS = "emq_max_attempts"
#: ``job.meta`` key that gives one job a progress timeout (``rq_emq.progress_timeout``).
META_PROGRESS_TIMEOUT = "emq_progress_timeout_ms"


class DequeueMixin:
    """The take half of :class:`rq_emq.run.worker.LeaseMixin`."""

    connection: Redis
    lock_manager: LockManager | None
    sweeper: Sweeper | None
    _taker: Taker | None
    _burst: bool
    _suspension_owed: bool | None

    def _start_leasing(self) -> None:
        raise NotImplementedError

    def _recover_before_exit(self) -> bool:
        """A burst worker about to exit sweeps its queues first, and when a job stands
        marked stalled it waits the grace and sweeps again, so that deployments running
        only burst workers (cron, batch) recover crashed workers' jobs too. True when a
        job went back to a queue."""
        sweeper = self.sweeper
        if sweeper is None:
            return False
        me: Any = self
        waited = False
        for _ in range(2):
            # the sweeper's own thread may have put the job back a moment before (its
            # first round at start): a job waiting in a queue is one to take, either way
            if any(report.requeued for report in sweeper.sweep_now()) or sweeper.jobs_waiting():
                return True
            if not sweeper.marks_standing():
                # the mark waited on went meanwhile: most likely this worker's own sweeper
                # thread recovered the job in its round: look again (bounded: the next call
                # finds no mark and returns False)
                return waited
            waited = True
            deadline = time.monotonic() + sweeper.grace_ms / 1000.0 + 0.01
            while time.monotonic() < deadline and not me._stop_requested:
                time.sleep(min(0.05, max(deadline - time.monotonic(), 0)))
            if me._stop_requested:
                return False
        return False

    # -- take ----------------------------------------------------------------------------
    def dequeue_job_and_maintain_ttl(
        self, timeout: int | None, max_idle_time: int | None = None
    ) -> tuple[Job, Queue] | None:
        """RQ's wait loop, with RQ's dequeue replaced by an atomic take under a lease."""
        me: Any = self
        qnames = ",".join(q.name for q in me._ordered_queues)
        if self._suspension_owed is not None:
            me.hold_state(compat.WorkerStatus.IDLE)  # it rides with the take's check
        else:
            # outside RQ's retry below: a blip here (a CLIENT KILL, a restart) ended `rq worker`
            # (found by the soak); the state is written again on the next loop
            me._riding_out_blips(lambda: me.set_state(compat.WorkerStatus.IDLE))
        me.procline("Listening on " + qnames)
        wait_time = 1.0
        idle_since = now()
        result: tuple[Job, Queue] | None = None
        while True:
            try:
                me.heartbeat()
                if me.should_run_maintenance_tasks:
                    me.run_maintenance_tasks()
                wait = timeout
                if timeout is not None and max_idle_time is not None:
                    idle_left = max_idle_time - (now() - idle_since).total_seconds()
                    if idle_left <= 0:
                        break
                    wait = min(timeout, math.ceil(idle_left))
                result = self._take(wait)
                if result is None and me._stop_requested:
                    # RQ's stop handler raises StopRequested into whatever the main thread
                    # runs; one that landed in a handler of ours (a wait's cleanup) is read
                    # from RQ's flag, or the worker would wait on for the next job
                    raise compat.StopRequested()
                if result is None and timeout is None and self._burst and self._recover_before_exit():
                    continue  # a crashed worker's job is back in a queue: take it
                if result is not None or timeout is None:
                    break
            except (RedisConnectionError, RedisTimeoutError) as error:
                me.log.error(
                    "Worker %s: could not reach Redis: %s; retrying in %ds", me.name, error, wait_time
                )
                failover.pause(me.connection, wait_time)  # a Sentinel switch ends it at once
                wait_time = min(wait_time * me.exponential_backoff_factor, me.max_connection_wait_time)
        if result is not None:
            me.heartbeat_after_take()
        else:
            me.heartbeat()
        return result

    def _take(self, timeout: float | None) -> tuple[Job, Queue] | None:
        me: Any = self
        self._start_leasing()
        assert self._taker is not None and self.lock_manager is not None
        lock_manager = self.lock_manager
        queues: list[Queue] = list(me._ordered_queues)
        leases: dict[str, Lease] = {}
        # each queue's keys as its class and the worker's job class build them (RQ's take
        # uses the worker's job class too: `rq worker-pool` builds its queues without it)
        layouts = [QueueKeys.named(q.name, type(q), me.job_class) for q in queues]

        def record(taken: Taken) -> None:
            layout = layouts[taken.queue_index]
            lease = Lease(layout.queue, taken.job_id, taken.token, layout=layout)
            lease.attempt, lease.fencing_token = taken.attempts, taken.fencing_token
            lease.valid_until = lock_manager.deadline(taken.sent_at or time.monotonic())
            lock_manager.add(lease)
            leases[taken.token] = lease
            me._lease_taken(lease)

        while True:  # an unreadable job is moved to failed; the worker takes the next one
            try:
                taken = self._taker.take(layouts, timeout, record, self._owed_check())
            except WorkersSuspended:
                me.check_suspension_now(self._burst)  # RQ's wait while suspended (or the end of a burst)
                if me._stop_requested:  # a stop ended that wait: RQ's loop takes nothing then
                    return None
                continue
            if taken is None:
                return None
            queue = queues[taken.queue_index]
            lease = leases[taken.token]
            job = self._job_from(taken, queue, lease)
            if job is not None:
                break
        lease.job = job
        me.reorder_queues(reference_queue=queue)
        self._log_take(job, queue, taken.attempts)
        return job, queue

    def _owed_check(self) -> Between | None:
        """RQ's `rq suspend` check, when its work loop left it to this take: what its
        transaction carried (RQ's worker heartbeat, the state held back) rides in the
        pop's round trip instead, and the pop refuses while the workers are suspended."""
        burst = self._suspension_owed
        if burst is None:
            return None
        me: Any = self

        def queue(pipe: Any) -> None:
            me._checking_suspension = True
            try:
                me.heartbeat(pipeline=pipe)
            finally:
                me._checking_suspension = False

        def sent(landed: bool) -> None:
            if landed:
                self._suspension_owed = None
            me.suspension_checked(landed=landed)

        def alone() -> None:
            me.check_suspension_now(burst)
            if me._stop_requested:  # a stop ended RQ's wait for a resume: no wait for a job now
                raise compat.StopRequested()

        return Between(WORKERS_SUSPENDED, queue, sent, alone)

    def _log_take(self, job: Job, queue: Queue, attempt: int) -> None:
        """RQ's dequeue line (``<queue>: <description> (<id>)``, the description left out
        under ``--disable-job-desc-logging``), with the attempt appended."""
        me: Any = self
        extra = {"job_id": job.id, "queue": queue.name}
        prefix, names = ("Worker %s: ", [me.name]) if compat.WORKER_NAMED_IN_LOGS else ("", [])
        if me.log_job_description:
            me.log.info(
                prefix + "%s: %s (%s), attempt %d",
                *names,
                green(queue.name),
                blue(job.description or ""),
                job.id,
                attempt,
                extra=extra,
            )
        else:
            line = prefix + "%s: %s, attempt %d"
            me.log.info(line, *names, green(queue.name), job.id, attempt, extra=extra)

    def _job_from(self, taken: Taken, queue: Queue, lease: Lease) -> Job | None:
        """Build the Job from the hash the take returned; a malformed one goes to failed.
        The job's own max attempts (its meta) rides along with its guarded start."""
        me: Any = self
        job = me.job_class(taken.job_id, connection=self.connection, serializer=me.serializer)
        try:
            job.restore(taken.raw)
            wanted = job.meta.get(META_MAX_ATTEMPTS)
            progress = job.meta.get(META_PROGRESS_TIMEOUT)
        except Exception as error:
            self._fail_unreadable(queue, lease, error)
            return None
        if progress is not None:
            lease.progress_timeout_ms = job_progress_timeout(progress)
            if lease.progress_timeout_ms is None:
                _ignored(
                    job,
                    queue,
                    META_PROGRESS_TIMEOUT,
                    progress,
                    "of ms from 1 to a week",
                    "no progress timeout",
                )
            else:
                lease.progress_timeout_ms = self._progress_timeout_held(job, queue, lease.progress_timeout_ms)
        if wanted is not None:
            lease.max_attempts = job_max_attempts(wanted)
            if lease.max_attempts is None:
                _ignored(job, queue, META_MAX_ATTEMPTS, wanted, "from 1 to 1000", "the worker's max_attempts")
        return job

    def _progress_timeout_held(self, job: Job, queue: Queue, asked_ms: int) -> int:
        """The progress timeout the job is held to: what it asked, or the shortest this
        worker can check (:attr:`rq_emq.settings.LeaseSettings.min_progress_timeout_ms`),
        said once per take. Not a failure: the job is fine on a faster-renewing worker."""
        me: Any = self
        floor = int(me.lease_settings.min_progress_timeout_ms)
        if asked_ms >= floor:
            return asked_ms
        logger.warning(
            "job %s on queue %s: its progress timeout (%d ms) is shorter than this worker can check "
            "(2 renew intervals, %d ms); holding it to %d ms",
            *(job.id, queue.name, asked_ms, floor, floor),
            extra={"job_id": job.id, "queue": queue.name},
        )
        return floor

    def _fail_unreadable(self, queue: Queue, lease: Lease, error: Exception) -> None:
        logger.error(
            "job %s on queue %s cannot be read (%s); moved to failed",
            lease.job_id,
            queue.name,
            error,
            extra={"job_id": lease.job_id, "queue": queue.name},
        )
        assert self.lock_manager is not None
        self.lock_manager.remove(lease.job_id)
        try:
            with fenced(self.connection, dataclasses.replace(lease.fence, counter="unreadable")):
                pipe = self.connection.pipeline()
                pipe.zadd(lease.keys.failed, {lease.job_id: now().timestamp() + 365 * 86400})
                pipe.hset(
                    lease.keys.job(lease.job_id),
                    mapping={"status": "failed", "exc_info": f"unreadable job: {error}"},
                )
                pipe.execute()
        except LeaseLost:
            pass


def _ignored(job: Job, queue: Queue, key: str, value: object, rule: str, instead: str) -> None:
    """A job's meta setting that does not read: logged, and the job runs with ``instead``."""
    logger.warning(
        "job %s on queue %s: meta %s=%r is not a whole number %s; it runs with %s",
        *(job.id, queue.name, key, value, rule, instead),
        extra={"job_id": job.id, "queue": queue.name},
    )
