"""Registry and queue classes that let leases, not timeouts, decide about in-flight jobs.

Stock ``StartedJobRegistry.cleanup`` fails (or retries through ``Retry``) every entry of
``rq:wip:<q>`` whose score fell due, and it runs wherever the registry is read: ``rq info``,
django-rq's pages, rq-dashboard, every stock worker's maintenance. This module owns:

- :class:`LeaseStartedJobRegistry`: the same registry, whose cleanup leaves every entry
  whose job holds a lease to the sweep (which recovers it exactly once) and gives all
  other entries, those of stock workers in a mixed fleet, RQ's own handling;
- :class:`LeasedJobRegistry` and :class:`StalledJobRegistry`: read-only views, in RQ's
  registry API, of the lease index and of the jobs a sweep has marked;
- :class:`LeaseQueueMixin`, :class:`LeaseQueue` and :func:`lease_queue_class`: a queue
  class serving those registries, composable with a user's own queue class;
- :func:`patch_stock_started_registry`: the same cleanup for RQ's own registry class,
  which RQ's ``clean_registries()`` and some tools build themselves;
- pinning: the started-registry entry a lease worker writes for a job it holds is scored
  ``+inf`` (RQ's own score for an entry that never expires), so that no process, not even
  one that never imported rq_emq (a stock worker's maintenance, ``rq info``, a dashboard),
  ever finds it due and fails the job, however long the whole lease fleet is down. The
  sweep removes it when it recovers the job; ``rq-emq rollback`` hands such entries back
  to stock handling.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast

from rq.job import Job
from rq.queue import Queue
from rq.registry import StartedJobRegistry
from rq.utils import current_timestamp

from .. import compat, scripts
from ..keys import QUEUE_PREFIX, QueueKeys

if TYPE_CHECKING:
    from redis import Redis

#: Due entries one ``keep_leased_started`` call looks at (bounds each script's run time).
KEEP_BATCH = 500

#: Seconds past the cutoff that a kept entry's score is moved to. A live holder moves it
#: on at every renewal anyway; for a dead holder's job, this is when cleanup looks again
#: (and keeps it again, until the sweep has recovered the job).
KEEP_FOR_S = 60


#: The score of a pinned started-registry entry: RQ's own for "never expires" (ttl -1).
PINNED_SCORE = "+inf"


def _held_by_nobody(job_id: str) -> bool:
    return False


#: Whether this process holds the lease of a job (a lease worker sets it as it starts).
_held_here: Callable[[str], bool] = _held_by_nobody


def pin_started_entries_of(held: Callable[[str], bool]) -> None:
    """From now on, RQ's started-registry entries that this process writes for a job that
    ``held(job_id)`` says it leases are pinned (scored ``+inf``)."""
    global _held_here
    _held_here = held


#: Queue namespaces other than RQ's default that lease queues of this process use, by
#: queue name: RQ's own ``clean_registries()`` builds the started registry from a name
#: alone, and the cleanup must still find those queues' leases.
_NAMESPACES: dict[str, set[str]] = {}


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _lease_layouts(name: str) -> list[QueueKeys]:
    """Every lease index a job of ``rq:wip:<name>`` may be in (RQ names its registries by
    the queue's name only, whatever the queue class's namespace)."""
    return [QueueKeys(name, prefix) for prefix in [QUEUE_PREFIX, *sorted(_NAMESPACES.get(name, ()))]]


class LeaseStartedJobRegistry(StartedJobRegistry):
    """RQ's started registry (``rq:wip:<q>``) whose cleanup never fails nor requeues a job
    that holds a lease; ``count``, ``get_job_ids`` and the rest are RQ's own."""

    def get_expired_job_ids(self, timestamp: float | None = None) -> list[str]:
        """RQ's due entries minus those of leased jobs, which are kept past the cutoff.

        Stock cleanup fails what this returns and then removes the whole due range; the
        kept entries are out of that range by then, so they survive both steps.
        """
        cutoff = timestamp if timestamp is not None else current_timestamp()
        return compat.started_entry_ids(self, self.keep_leased(cutoff))

    def keep_leased(self, cutoff: float) -> list[str]:
        """Move every entry due by ``cutoff`` whose job holds a lease past the cutoff, in one
        script call per :data:`KEEP_BATCH` due entries; returns the others' members. With
        several queue namespaces of this name, one pass per lease index: what a pass keeps
        leaves the due range, so the last pass returns what none of them keeps."""
        script = scripts.load("keep_leased_started")
        keep_until = max(cutoff, current_timestamp()) + KEEP_FOR_S
        left: list[str] = []
        for q in _lease_layouts(self.name):
            left, offset = [], 0
            while True:
                args = [cutoff, keep_until, q.prefix, offset, KEEP_BATCH]
                reply = script(self.connection, [self.key, q.leases], args)
                scanned, others = int(reply[0]), [_text(m) for m in reply[1:]]
                left += others
                if scanned < KEEP_BATCH:
                    break
                offset += len(others)  # kept entries left the due range; the others did not
        return left

    def add_execution(self, execution: Any, pipeline: Any, ttl: int = 0, xx: bool = False) -> Any:
        """RQ's entry for a run, pinned (``+inf``) when this process leases the job: the
        lease, not the entry's score, says whether the run is alive. The entry's member is
        recorded on the job hash (``keys.PINNED_FIELD``) by the run's guarded start, in RQ's own
        HSET of the job (:func:`rq_emq.fence.packing.start_record`)."""
        if not _held_here(execution.job_id):
            return _STOCK_ADD_EXECUTION(self, execution, pipeline=pipeline, ttl=ttl, xx=xx)
        return pipeline.zadd(self.key, {execution.composite_key: PINNED_SCORE}, xx=xx)


class _LeaseStateRegistry:
    """A read-only view, in RQ's registry API, of one of the sweep's sorted sets.

    Nothing here cleans up or moves a job: the sets change only inside the lease scripts.
    """

    def __init__(
        self,
        name: str = "default",
        connection: Redis | None = None,
        job_class: type[Job] | None = None,
        queue: Queue | None = None,
        serializer: Any = None,
    ) -> None:
        if queue is not None:
            name, connection, serializer = queue.name, queue.connection, queue.serializer
        self.name = name
        self.connection = cast("Redis", connection)
        self.job_class = job_class or Job
        self.serializer = serializer
        layout = QueueKeys.of(queue) if queue is not None else QueueKeys(name)
        self.key = self._key(layout)

    @staticmethod
    def _key(keys: QueueKeys) -> str:
        raise NotImplementedError

    def __len__(self) -> int:
        return self.count

    def __contains__(self, item: object) -> bool:
        job_id = item.id if isinstance(item, Job) else item
        return self.connection.zscore(self.key, cast(str, job_id)) is not None

    @property
    def count(self) -> int:
        return self.get_job_count()

    def get_job_count(self, cleanup: bool = True) -> int:
        return int(self.connection.zcard(self.key))

    def get_job_ids(
        self, start: int = 0, end: int = -1, desc: bool = False, cleanup: bool = True
    ) -> list[str]:
        return [_text(m) for m in self.connection.zrange(self.key, start, end, desc=desc)]

    def cleanup(self, *args: Any, **kwargs: Any) -> None:
        """Nothing to clean: the sweep owns this set."""

    def get_queue(self) -> Queue:
        return Queue(self.name, connection=self.connection, serializer=self.serializer)


class LeasedJobRegistry(_LeaseStateRegistry):
    """Jobs in flight under a lease (``emq:{<q>}:leases``, scored by lease deadline in ms)."""

    @staticmethod
    def _key(keys: QueueKeys) -> str:
        return keys.leases


class StalledJobRegistry(_LeaseStateRegistry):
    """Jobs a sweep marked stalled, awaiting recovery (``emq:{<q>}:stalled``, scored by the
    time of the mark in ms); a holder that renews in time leaves it again."""

    @staticmethod
    def _key(keys: QueueKeys) -> str:
        return keys.stalled


class LeaseQueueMixin:
    """Put before a ``Queue`` class: its started registry leaves leased jobs to the sweep,
    and it serves the lease state as registries. Adds no state of its own.

    RQ's own ``clean_registries()``, which ``rq info``, django-rq's statistics page and every
    worker's maintenance run, builds RQ's ``StartedJobRegistry`` itself instead of asking
    the queue: so a process that creates a lease queue gives RQ's class the same cleanup
    (:func:`patch_stock_started_registry`). That is what makes ``--queue-class`` and
    django-rq's ``QUEUE_CLASS`` enough.
    """

    name: str
    connection: Redis
    job_class: type[Job]
    serializer: Any

    @property
    def started_job_registry(self) -> LeaseStartedJobRegistry:
        queue = cast(Queue, self)
        return LeaseStartedJobRegistry(queue=queue, job_class=self.job_class, serializer=self.serializer)

    @property
    def leased_job_registry(self) -> LeasedJobRegistry:
        return LeasedJobRegistry(queue=cast(Queue, self), job_class=self.job_class)

    @property
    def stalled_job_registry(self) -> StalledJobRegistry:
        return StalledJobRegistry(queue=cast(Queue, self), job_class=self.job_class)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        patch_stock_started_registry()
        _remember_namespace(cast(Queue, self))


class LeaseQueue(LeaseQueueMixin, Queue):
    """RQ's ``Queue`` with the lease-aware registries (``--queue-class rq_emq.LeaseQueue``)."""


_composed: dict[type[Queue], type[Queue]] = {}


def lease_queue_class(queue_class: type[Queue]) -> type[Queue]:
    """``queue_class`` itself if it already has the lease registries, else a subclass of it
    that adds them (made once per class, so every worker and tool gets the same one)."""
    if issubclass(queue_class, LeaseQueueMixin):
        return queue_class
    if queue_class is Queue:
        return LeaseQueue
    if queue_class not in _composed:
        name = f"Lease{queue_class.__name__}"
        composed = type(name, (LeaseQueueMixin, queue_class), {"__module__": __name__})
        _composed.setdefault(queue_class, cast("type[Queue]", composed))
    return _composed[queue_class]


def given_queue_class(queue_class: type[Queue]) -> type[Queue]:
    """The class :func:`lease_queue_class` composed ``queue_class`` from (the user's own,
    importable by name), else ``queue_class`` itself."""
    for given, composed in _composed.items():
        if composed is queue_class:
            return given
    return queue_class


_PATCHED = ("keep_leased", "get_expired_job_ids", "add_execution")
_STOCK = {name: StartedJobRegistry.__dict__.get(name) for name in _PATCHED}
_STOCK_ADD_EXECUTION = StartedJobRegistry.add_execution


def patch_stock_started_registry() -> None:
    """Give RQ's own ``StartedJobRegistry`` the lease-aware cleanup, in this process.

    For tools that build RQ's registry class themselves instead of asking the queue;
    creating a lease queue does it too. Entries of jobs without a lease keep RQ's
    handling. Calling it again changes nothing.
    """
    for name in _PATCHED:
        setattr(StartedJobRegistry, name, LeaseStartedJobRegistry.__dict__[name])


def unpatch_stock_started_registry() -> None:
    """Undo :func:`patch_stock_started_registry` (for tests)."""
    for name in _PATCHED:
        if _STOCK[name] is None:
            if name in StartedJobRegistry.__dict__:
                delattr(StartedJobRegistry, name)
        else:
            setattr(StartedJobRegistry, name, _STOCK[name])


def _remember_namespace(queue: Queue) -> None:
    if queue.redis_queue_namespace_prefix != QUEUE_PREFIX:
        _NAMESPACES.setdefault(queue.name, set()).add(queue.redis_queue_namespace_prefix)


def prepare_registries(queues: list[Queue]) -> None:
    """What a lease worker's own process needs of this module for its ``queues``, whatever
    their class: RQ's started registry with the lease-aware cleanup (a second line: a leased
    run's entry is pinned), and the queues' namespaces, where that cleanup looks for leases."""
    patch_stock_started_registry()
    for queue in queues:
        _remember_namespace(queue)


def as_lease_queue(queue: Queue) -> Queue:
    """``queue`` if it has the lease registries, else a copy of it as an instance of
    :func:`lease_queue_class` of its class (same name, connection, job class, options)."""
    if isinstance(queue, LeaseQueueMixin):
        return queue
    leased = copy.copy(queue)
    leased.__class__ = lease_queue_class(type(queue))
    patch_stock_started_registry()
    _remember_namespace(leased)
    return leased


__all__ = [
    "LeaseQueue",
    "LeaseQueueMixin",
    "LeaseStartedJobRegistry",
    "LeasedJobRegistry",
    "StalledJobRegistry",
    "as_lease_queue",
    "lease_queue_class",
    "patch_stock_started_registry",
    "pin_started_entries_of",
    "prepare_registries",
]
