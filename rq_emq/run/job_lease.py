"""The job's own view of its lease: :func:`current_lease` inside a running job.

A worker fences what RQ writes for a job; a job's own effects (a row written, a card
charged, a file pushed) are its own business. This hands the job what it needs to fence
them too, the pattern of a fencing token:

- ``fencing_token``: an int that goes up on every grant of the job (across attempts,
  workers, recoveries and RQ's ``Retry``), taken in the same script as the lease, so an
  outside store that keeps the highest token it has seen refuses a holder that was
  replaced (``UPDATE ... WHERE fence_token < :token``);
- ``held``: the holder's local lease clock, read without a round trip (in a horse, from
  the memory its worker writes after each renewal);
- ``stopping``: the worker was asked to stop (a warm shutdown) while the job runs;
- ``fenced_pipeline()``: a redis-py pipeline whose ``execute()`` commits its commands in
  one script only while the lease holds (``guard_job_write``), and otherwise writes
  nothing and raises :class:`rq_emq.LeaseLost`, with the fence's packing rules;
- ``report()``: a small JSON record of the job's progress, kept with the lease in Redis
  (``emq_report`` on the job hash, gone with the lease). It costs no round trip: the
  newest report rides on the lock manager's next renewal (from a horse, through the
  memory it shares with its worker), so at most one write per renew interval. A report
  is also progress: a job enqueued with ``meta=rq_emq.progress_timeout(ms)`` that has not
  reported for that long is stopped and recovered, attempt counted.

One leased job runs in a process at a time (a horse, or a ``SimpleLeaseWorker``), so the
current lease is one module global, set around RQ's ``perform_job``.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from redis import Redis
from redis.client import Pipeline

from ..fence.fencing import Fence, FencedPipelineMixin, FencedSession, LeaseLost
from ..hold.held import Lease
from .horse_fence import REPORT_LIMIT_BYTES


class JobLease:
    """The lease of the job running in this process (see the module's docstring)."""

    def __init__(
        self,
        lease: Lease,
        connection: Redis,
        held_until: Callable[[], float],
        stopping: Callable[[], bool],
        post_report: Callable[[str], None] | None = None,
    ) -> None:
        self._lease = lease
        self._connection = connection
        self._held_until = held_until
        self._stopping = stopping
        self._post_report = post_report or lease.post_report
        #: Redis or the local clock told this run its lease is gone (a LeaseLost raised).
        self.loss_seen = False

    @property
    def job_id(self) -> str:
        return self._lease.job_id

    @property
    def queue(self) -> str:
        return self._lease.queue

    @property
    def attempt(self) -> int:
        """This run's attempt: 1 on a first take, one more after each crash or stall
        (a normal end, RQ's ``Retry`` included, starts the count over)."""
        return self._lease.attempt

    @property
    def fencing_token(self) -> int:
        """Strictly greater than the token of every earlier grant of this job."""
        return self._lease.fencing_token

    @property
    def held(self) -> bool:
        """Whether this holder may still trust its lease, by its local lease clock (no
        round trip): false once a renewal found it lost, or its clock ran out."""
        return time.monotonic() < self._held_until()

    @property
    def stopping(self) -> bool:
        """The worker was asked to stop (SIGTERM, a warm shutdown): end early if you can."""
        return self._stopping()

    @property
    def progress_timeout_ms(self) -> int | None:
        """The job's progress timeout (``meta=rq_emq.progress_timeout(ms)``); None: none."""
        return self._lease.progress_timeout_ms

    def report(self, progress: Any = None, **details: Any) -> None:
        """Keep ``{"progress": progress, **details}`` with the lease: ``rq-emq leases``
        shows it, the event hooks get it (``reported``), and it goes when the lease ends.
        No round trip: the newest report rides on the next renewal. Each call is progress
        for the job's progress timeout. ValueError if the record is not JSON (numbers,
        strings, lists, dicts, bools, None) or is over 1024 bytes as JSON."""
        self._post_report(encode_report(progress, details))

    def raise_if_lost(self) -> None:
        """Raise :class:`rq_emq.LeaseLost` once the lease is gone (see :attr:`held`)."""
        if not self.held:
            self.loss_seen = True
            raise LeaseLost(self.queue, self.job_id)

    def fenced_pipeline(self) -> Pipeline:
        """A pipeline on the job's connection whose ``execute()`` commits only while this
        lease still holds in Redis, in one script (``guard_job_write``: the token owns
        the job and nothing but the lease's writes changed it); otherwise it writes
        nothing and raises :class:`rq_emq.LeaseLost`. It may be executed again and again:
        each ``execute()`` is checked on its own. Commands that only read run as sent."""
        pipe: Any = type(self._connection).pipeline(self._connection, transaction=True)
        pipe.__class__ = _job_fenced_class(type(pipe))
        pipe._emq_fence = self._lease.fence
        pipe._emq_job_lease = self
        return pipe  # type: ignore[no-any-return]

    def __repr__(self) -> str:
        return (
            f"JobLease(job_id={self.job_id!r}, attempt={self.attempt}, "
            f"fencing_token={self.fencing_token}, held={self.held}, stopping={self.stopping})"
        )


class _JobFencedPipelineMixin(FencedPipelineMixin):
    """Each ``execute()`` a fenced session of its own, never releasing the lease: the
    outcome fence checks only a block's first transaction, a job's pipeline every one."""

    _emq_fence: Fence
    _emq_job_lease: JobLease

    def execute(self, raise_on_error: bool = True) -> list[Any]:
        self._emq_session = JobWriteSession(self._emq_fence)
        try:
            return super().execute(raise_on_error)
        except LeaseLost:
            self._emq_job_lease.loss_seen = True
            raise


class JobWriteSession(FencedSession):
    """A fenced session for one ``execute()`` of a job's own pipeline."""

    def __init__(self, fence: Fence) -> None:
        super().__init__(fence, release=False)
        # a block MULTI would refuse at queue time writes nothing, as EXEC aborts
        self.check_queued = True

    def refuse(self, ended_status: str | None = None) -> LeaseLost:
        self.refused = True
        self.ended_status = ended_status
        return self._raise(self.fence.lost("the job's fenced pipeline wrote nothing"))


_CLASSES: dict[type, type] = {}


def _job_fenced_class(base: type) -> type:
    if base not in _CLASSES:
        _CLASSES[base] = type(f"JobFenced{base.__name__}", (_JobFencedPipelineMixin, base), {})
    return _CLASSES[base]


def encode_report(progress: Any, details: dict[str, Any]) -> str:
    """A report as the JSON text kept in Redis; ValueError, naming why, if it cannot be."""
    try:
        text = json.dumps({"progress": progress, **details}, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError) as error:
        raise ValueError(f"a lease report must be JSON (numbers, strings, lists, dicts): {error}") from None
    size = len(text.encode())
    if size > REPORT_LIMIT_BYTES:
        raise ValueError(f"a lease report is at most {REPORT_LIMIT_BYTES} bytes as JSON, got {size}")
    return text


_current: JobLease | None = None


def current_lease() -> JobLease | None:
    """The lease of the job running in this process under a lease worker (LeaseWorker,
    SimpleLeaseWorker, SpawnLeaseWorker, a ``lease_worker()`` class); None elsewhere."""
    return _current


@contextmanager
def running(job_lease: JobLease) -> Iterator[JobLease]:
    """``job_lease`` is the current lease for the block (the job's run)."""
    global _current
    previous, _current = _current, job_lease
    try:
        yield job_lease
    finally:
        _current = previous


def lease_clock(lease: Lease) -> float:
    """An in-process holder's local lease deadline (monotonic): -inf once its lease is
    lost or its clock ran out, +inf once its outcome is committed."""
    if lease.lost or lease.expired:
        return -math.inf
    return math.inf if lease.settled else lease.valid_until
