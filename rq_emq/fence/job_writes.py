"""Every write a lease worker makes to a job it leased, checked against its lease.

RQ's own code does the writing; this mixin wraps RQ's seams so that:

- the writes that start a run (the worker's execution record, the horse's "started")
  commit only while the worker still holds the lease, and keep it (``guard_job_write``);
- the outcome (success, failure, ``Retry``, stop, timeout) commits only while the worker
  holds the lease, and releases it in the same step (``finish_job``);
- the holder's direct writes to the job while it runs or finishes it (RQ's
  ``set_status`` of a delayed ``Retry``, an exception handler's ``job.save()``) go through
  the guard too, recorded as the lease's own (:mod:`rq_emq.fence.direct_writes`);
- a job canceled while it ran keeps its cancel, and its run's Result is written as RQ
  writes it;
- each of those steps is tried again through a Redis connection blip for as long as the
  lease could still be alive (:mod:`rq_emq.connection.blips`), which the fence makes safe.

A worker or horse that was frozen or cut off past its lease and wakes after the job was
recovered (and perhaps finished elsewhere) therefore writes nothing to it: a refused start
ends the run before the job is called, a refused outcome is discarded.
"""

from __future__ import annotations

import dataclasses
import inspect
import logging
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, Protocol

from redis import Redis
from rq.defaults import DEFAULT_RESULT_TTL
from rq.job import Job
from rq.queue import Queue
from rq.worker import Worker

from .. import compat
from ..connection.blips import BLIPS, through_blips
from ..settings import LeaseSettings
from .direct_writes import guarding_direct_writes
from .fencing import Fence, FencedSession, LeaseLost, fenced

logger = logging.getLogger("rq_emq.lease")


class HeldLease(Protocol):
    """What the job writes use of a held lease (:class:`rq_emq.hold.lease.Lease`)."""

    queue: str
    execution: Any

    @property
    def fence(self) -> Fence: ...

    def hand_back(self, client: Redis) -> bool: ...


class HeldLeases(Protocol):
    """The leases this process holds, by job id: the lock manager
    (:class:`rq_emq.hold.lease.LockManager`). A protocol, not the class: the lock manager hands
    out fences, so the fence may not import it back."""

    def get(self, job_id: str) -> HeldLease | None: ...


@dataclasses.dataclass
class HeldBackRecord:
    """The worker's execution record of a job, held back to ride in the run's start: one
    guarded script call (and round trip) for both. In a process that runs its jobs itself
    the two are consecutive steps of one thread; a forked horse inherits the record in its
    memory and sends it in its own start (a spawned one does not: it re-reads the job)."""

    job_id: str
    commands: list[Any]
    execution: Any
    #: The executions the worker knew before this one (a refused start forgets it again).
    known: set[str]


class LeaseJobInterrupted(Exception):
    """Raised inside a SimpleLeaseWorker's job when its lease was lost."""


class JobWritesMixin:
    """Guarded starts, fenced finishes, both through connection blips."""

    connection: Redis
    lock_manager: HeldLeases | None
    lease_settings: LeaseSettings
    #: The job whose own code runs now in this process (between its guarded start and its
    #: end): the only time a lost lease may interrupt it in place.
    _running_job_id: str | None = None
    #: RQ's start of a run (``prepare_job_execution``) is under way in this process.
    _starting_run: bool = False
    #: The job whose outcome this process has written (its lease released): RQ's again.
    _settled_job_id: str | None = None
    #: The job's status when this process's last finish was refused because RQ or an
    #: operator had changed the job (``canceled``, ...); None otherwise.
    _refused_as: str | None = None
    #: The job whose outcome this process's last finish discarded (refused by the fence).
    _discarded_job_id: str | None = None
    #: The execution record rides in the run's start (a class that runs its jobs itself, or
    #: forks a horse that inherits the record with the rest of the worker's memory).
    _record_rides_in_start: bool = False
    #: The execution record held back for the run's start, until that lands or is refused.
    _held_back_record: HeldBackRecord | None = None

    @contextmanager
    def _fenced(
        self,
        job: Job,
        release: bool = True,
        records_status: bool = True,
        hold_back: list[Any] | None = None,
    ) -> Iterator[None]:
        """Fence the first writing transaction opened in this block. A refused finish is
        swallowed (logged where refused, one line; nothing written); a refused start is
        raised. A blip that failed the fenced transaction is raised after the block even
        where RQ's code swallowed it (RQ 3's failure handler logs and goes on), so that
        the caller's blip retry writes the outcome instead of dropping it."""
        lease = self.lock_manager.get(job.id) if self.lock_manager is not None else None
        if lease is None or "pipeline" in vars(self.connection):
            yield  # not a job we leased, or already inside a fenced block
            return
        try:
            fence = lease.fence if records_status else dataclasses.replace(lease.fence, records_status=False)
            on_commit = self._settled(job) if release else None
            held = self._held_back_record
            ahead: list[Any] = []
            if held is not None and held.job_id == job.id and not release and records_status:
                ahead = held.commands  # the run's start: the execution record rides in it
                fence = dataclasses.replace(fence, started_entry=f"{job.id}:{held.execution.id}")
            with fenced(
                self.connection, fence, release, on_commit, hold_back=hold_back, ahead=ahead
            ) as session:
                with _hide_swallowed(session, getattr(self, "log", None)):
                    yield
        except LeaseLost:
            if not release:
                raise
            self._refused_as = session.ended_status
            self._discarded_job_id = job.id  # RQ's "Job OK" for it would mislead
            return
        if session.refused and release:
            self._discarded_job_id = job.id  # refused, and RQ's code swallowed it
        if session.error is not None and not session.committed:
            raise session.error
        if session.refused and not release:
            raise LeaseLost(lease.queue, job.id)

    def _settled(self, job: Job) -> Callable[[], None]:
        def committed() -> None:
            self._settled_job_id = job.id
            self._outcome_committed()

        return committed

    def _outcome_committed(self) -> None:
        """The run's outcome has landed: nothing may stop this process for the job's lease
        any more (fork mode tells the horse's fence)."""

    def _through_blips(self, job: Job, step: Callable[[], Any], what: str) -> Any:
        return through_blips(step, job.id, self.lease_settings.lease_ms / 1000, what)

    def _guarded(self, job: Job, step: Callable[[], Any], what: str, records_status: bool = True) -> Any:
        def guarded() -> Any:
            with self._fenced(job, release=False, records_status=records_status):
                return step()

        return self._through_blips(job, guarded, what)

    def _finish(self, job: Job, finish: Callable[[], Any]) -> Any:
        def fenced_finish() -> Any:
            self._refused_as = None
            with self._fenced(job):
                return finish()

        # the worker's own finish of a job whose horse died runs outside perform_job:
        # its direct writes (a delayed Retry's set_status) are the holder's too
        self._settled_job_id = None
        with self._guarding_direct_writes(job):
            try:
                return self._through_blips(job, fenced_finish, "write its outcome")
            except BLIPS:
                # Redis stayed away for a whole lease (a failover): the lease lapses and the
                # sweep decides. RQ's perform_job takes this error for the job's failure and
                # would run its failure callback, for a job that may well have succeeded
                compat.drop_failure_callback(job)
                raise

    def _record_canceled_run(self, job: Job, exc_string: str | None = None) -> None:
        """A job canceled while it ran: RQ lets the run go on and record it, so its
        Result is written as RQ's finish writes it. The rest of that finish is not (its
        status, registries, a Retry): the cancel ended the job's future, and it stands."""
        if self._refused_as != "canceled":
            return
        self._refused_as = None
        if exc_string is None:
            ttl = job.get_result_ttl(int(getattr(self, "default_result_ttl", DEFAULT_RESULT_TTL)))
            if ttl != 0:
                compat.record_result(job, ttl, return_value=job._result)
        else:
            compat.record_result(job, compat.failure_ttl(job), exc_string=exc_string)

    # -- the run ---------------------------------------------------------------------------
    def perform_job(self, job: Job, *args: Any, **kwargs: Any) -> Any:
        """RQ's run of the job, with the holder's direct writes to it guarded
        (:mod:`rq_emq.fence.direct_writes`) until its outcome has landed."""
        parent: Any = super()
        self._settled_job_id = None
        self._discarded_job_id = None
        with self._guarding_direct_writes(job):
            return parent.perform_job(job, *args, **kwargs)

    @contextmanager
    def _guarding_direct_writes(self, job: Job) -> Iterator[None]:
        def current() -> Fence | None:
            lease = self.lock_manager.get(job.id) if self.lock_manager is not None else None
            return None if lease is None or self._settled_job_id == job.id else lease.fence

        def send(write: Callable[[], Any]) -> Any:
            return self._through_blips(job, write, "write to its job")

        with guarding_direct_writes([job.connection, self.connection], job.key, current, send):
            yield

    # callers that look (RQ 3 passes an execution, RQ 2 does not) see RQ's own signature
    perform_job.__signature__ = inspect.signature(Worker.perform_job)  # type: ignore[attr-defined]

    # -- start ---------------------------------------------------------------------------
    def prepare_execution(self, job: Job) -> Any:
        """The worker's execution record (started registry, worker busy), guarded; the
        lock manager heartbeats the execution from then on. RQ registers the execution on
        the worker before its transaction runs: a refused or retried try forgets it again,
        so no stale execution is later cleaned up in place of a live one."""
        parent: Any = super()
        known = compat.execution_ids(self)

        def record() -> Any:
            try:
                return parent.prepare_execution(job)
            except BaseException:
                compat.forget_executions(self, known)
                raise

        lease = self.lock_manager.get(job.id) if self.lock_manager else None
        if self._record_rides_in_start and lease is not None:
            held_back: list[Any] = []
            with self._fenced(job, release=False, records_status=False, hold_back=held_back):
                execution = record()  # sends nothing: held back for the run's start
            if held_back:
                self._held_back_record = HeldBackRecord(job.id, held_back, execution, known)
                return execution
        else:
            # RQ's execution record leaves the job's status alone: nothing to record as ours
            execution = self._guarded(job, record, "record its execution", records_status=False)
        if lease is not None:
            lease.execution = execution
        return execution

    def _held_back_record_sent(self, job: Job, landed: bool) -> None:
        """The run's start that carried the held-back execution record landed (the lock
        manager heartbeats the execution from then on) or did not (forgotten again). A
        forking worker says landed as its horse forks: the horse sends the record in its
        start, and a start it finds refused leaves the lease lost, whose ticks write nothing."""
        held, self._held_back_record = self._held_back_record, None
        if held is None or held.job_id != job.id:
            return
        if not landed:
            compat.forget_executions(self, held.known)
            return
        lease = self.lock_manager.get(job.id) if self.lock_manager else None
        if lease is not None:
            lease.execution = held.execution

    def prepare_job_execution(self, job: Job, *args: Any, **kwargs: Any) -> Any:
        """The horse's first writes (status started, heartbeats), guarded: a horse that
        wakes after its job was recovered ends here, before the job is called."""
        parent: Any = super()
        me: Any = self
        if self.lock_manager is not None and self.lock_manager.get(job.id) is not None:
            # A leased job is in no intermediate list by now (pop_job never puts it there,
            # claim_job takes it out with the lease): RQ's LREM would be a command for nothing.
            args, kwargs = (), {"remove_from_intermediate_queue": False}
        try:
            # its worker heartbeat is left to the lock manager; the job's own stamp is in
            # RQ's start of the job (prepare_for_execution) already
            self._starting_run = True
            try:
                with stamps_locally(job):
                    started = self._guarded(
                        job, lambda: parent.prepare_job_execution(job, *args, **kwargs), "prepare its run"
                    )
            finally:
                self._starting_run = False
            self._held_back_record_sent(job, landed=True)
            self._running_job_id = job.id
            return started
        except LeaseLost:
            self._held_back_record_sent(job, landed=False)
            reason = "lease lost before it started"
        except BLIPS:
            self._held_back_record_sent(job, landed=False)
            # Redis stayed out of reach for a whole lease before the job began: it did not
            # run, so it is not failed. Hand it back if Redis is back, else the sweep will.
            reason = "Redis unreachable as it started; handed back"
            self._hand_back_unstarted(job)
        if me.is_horse:
            os._exit(0)  # nothing of this run written; the worker's own finish is fenced too
        # the job never ran: RQ's failure path, which this error enters, must not run its
        # failure callback (the sweep decides, and the job may well finish elsewhere)
        compat.drop_failure_callback(job)
        raise LeaseJobInterrupted(f"job {job.id}: {reason}")

    def _hand_back_unstarted(self, job: Job) -> None:
        lease = self.lock_manager.get(job.id) if self.lock_manager is not None else None
        if lease is None:
            return
        try:
            if lease.hand_back(self.connection):
                logger.warning(
                    "job %s handed back to the front of queue %s: Redis was out of reach as it started",
                    job.id,
                    lease.queue,
                    extra={"job_id": job.id, "queue": lease.queue},
                )
        except BLIPS:
            pass  # still out of reach: the lease lapses and the sweep recovers the job

    def handle_execution_ended(self, job: Job, *args: Any, **kwargs: Any) -> Any:
        """RQ stamps the job's end with a heartbeat before finishing it (idempotent). The
        stamp is bookkeeping, not the outcome: if Redis stays out of reach for its whole
        budget, the run goes on to write its outcome (fenced, with a budget of its own)
        rather than fail a job whose code succeeded with the ConnectionError (seen in the
        long soak)."""
        self._running_job_id = None
        parent: Any = super()

        def ended() -> Any:
            # the stamp rides in the outcome's own save of the job (RQ's finish writes the
            # whole hash, last_heartbeat included): one command fewer, and none unfenced
            with stamps_locally(job):
                return parent.handle_execution_ended(job, *args, **kwargs)

        try:
            return self._through_blips(job, ended, "record its end")
        except BLIPS as error:
            logger.warning(
                "job %s: could not record its end (%s); writing its outcome",
                job.id,
                error,
                extra={"job_id": job.id},
            )
            return None

    # -- finish --------------------------------------------------------------------------
    def handle_job_success(self, job: Job, queue: Queue, *args: Any, **kwargs: Any) -> Any:
        parent: Any = super()
        done = self._finish(job, lambda: parent.handle_job_success(job, queue, *args, **kwargs))
        self._record_canceled_run(job)
        return done

    def handle_job_failure(self, job: Job, queue: Queue, *args: Any, **kwargs: Any) -> Any:
        parent: Any = super()
        done = self._finish(job, lambda: parent.handle_job_failure(job, queue, *args, **kwargs))
        self._record_canceled_run(job, exc_string=str(kwargs.get("exc_string") or ""))
        return done

    def handle_job_retry(self, job: Job, queue: Queue, *args: Any, **kwargs: Any) -> Any:
        parent: Any = super()
        return self._finish(job, lambda: parent.handle_job_retry(job, queue, *args, **kwargs))


@contextmanager
def stamps_locally(job: Job) -> Iterator[None]:
    """Within the block, ``job.heartbeat`` (RQ 2 and 3: an HSET of ``last_heartbeat`` and
    nothing else) only stamps the Job object; a later write of the job carries it."""

    def stamp(timestamp: Any, *args: Any, **kwargs: Any) -> None:
        job.last_heartbeat = timestamp

    job.heartbeat = stamp  # type: ignore[method-assign]
    try:
        yield
    finally:
        del job.heartbeat


class _SwallowedFilter(logging.Filter):
    """Drops RQ's log records of exceptions the fence raised into RQ's code, which RQ
    swallowed: the fence already said it in one line, or the finish is retried."""

    def __init__(self, session: FencedSession) -> None:
        super().__init__()
        self.session = session

    def filter(self, record: logging.LogRecord) -> bool:
        error = record.exc_info[1] if record.exc_info else None
        return error is None or not any(error is raised for raised in self.session.raised)


@contextmanager
def _hide_swallowed(session: FencedSession, log: Any) -> Iterator[None]:
    if not isinstance(log, logging.Logger):
        yield
        return
    filter_ = _SwallowedFilter(session)
    log.addFilter(filter_)
    try:
        yield
    finally:
        log.removeFilter(filter_)
