"""Leases for RQ 3's ``SpawnWorker``, whose horse is a new interpreter, not a fork.

A forked horse inherits what fences it: its lease (in the lock manager's memory), the
worker's lifeline (:mod:`rq_emq.run.lifeline`), and the local lease deadline in memory
shared with the worker. A horse started with ``posix_spawn`` inherits none of it, only the
environment. So the worker hands it over there, just before the spawn:

- ``RQ_EMQ_HORSE_LEASE``: the lease token of the job (the horse's start and outcome are
  then fenced, as a forked horse's are);
- ``RQ_EMQ_HORSE_DEADLINE``: a small file (in ``/dev/shm``) that the worker, its watchdog
  and each horse map, holding the local lease deadline the horse ends itself at;
- ``RQ_EMQ_HORSE_LIFELINE_FD``: the number of the lifeline's read end, which the spawn inherits
  (the horse arms it: the kernel ends its group once the worker and its watchdog are both
  gone; it ends at once if they are gone already);
- ``RQ_EMQ_HORSE_GRANT``: the take's attempt and fencing token (``<attempt>:<token>``),
  which the job reads through ``rq_emq.current_lease()``;
- ``RQ_EMQ_HORSE_CONFIG``: the settings module of ``rq worker -c`` ("" for none), whose
  ``RQ_EMQ_*`` settings the horse reads as its worker did (:mod:`rq_emq.run.startup`).

The horse rebuilds its lease from those in :meth:`SpawnLeaseMixin.main_work_horse`, before
RQ's code runs the job. Nothing of it is written to Redis.
"""

from __future__ import annotations

import os
from typing import Any

from rq.job import Job
from rq.queue import Queue

from .. import compat
from ..fence import fencing
from ..hold.held import Lease
from ..keys import QueueKeys
from ..recover.registries import given_queue_class
from ..settings import job_max_attempts
from .dequeue import META_MAX_ATTEMPTS
from .horse_fence import HorseDeadline
from .lifeline import ENV_LIFELINE
from .startup import ENV_CONFIG, settings_module_name
from .worker import LeaseWorker

ENV_LEASE = "RQ_EMQ_HORSE_LEASE"
ENV_DEADLINE = "RQ_EMQ_HORSE_DEADLINE"
ENV_GRANT = "RQ_EMQ_HORSE_GRANT"


class SpawnLeaseMixin:
    """Put before :class:`rq_emq.LeaseWorker` in a ``SpawnWorker`` lease worker
    (:func:`rq_emq.lease_worker` does)."""

    _spawn_parts = True  # what a SpawnWorker class needs (rq_emq.run.worker_check)
    _horse_tells_its_end = False  # a spawned horse has no copy of the worker's pipe
    _forks_ahead = False  # nor of its memory: each is spawned once its job is taken
    _record_rides_in_start = False  # nor of the worker's memory: the record is written first

    _horse_deadline: HorseDeadline | None
    _lifeline_fd: int

    def _new_run_deadline(self) -> HorseDeadline:
        return HorseDeadline.shared_file()

    def fork_work_horse(self, job: Job, queue: Queue) -> None:
        me: Any = self
        if self._horse_deadline is None:
            self._horse_deadline = self._new_run_deadline()
        lease = me.lock_manager.get(job.id) if me.lock_manager is not None else None
        lifeline = me._lifeline_for_horses()
        handed = {
            ENV_LEASE: lease.token if lease is not None else "",
            ENV_DEADLINE: self._horse_deadline.path or "",
            ENV_LIFELINE: str(lifeline.read_fd) if lifeline is not None else "",
            ENV_GRANT: f"{lease.attempt}:{lease.fencing_token}" if lease is not None else "",
            ENV_CONFIG: settings_module_name() or "",
        }
        os.environ.update(handed)  # RQ's SpawnWorker hands the horse this process's environment
        try:
            super().fork_work_horse(job, queue)  # type: ignore[misc]
        finally:
            for name in handed:
                os.environ.pop(name, None)

    def _dump_worker_config(self) -> bytes:
        """RQ pickles the worker's classes for the horse by name: a queue class composed
        with the lease registries (``--queue-class``) exists only in this process, so the
        horse gets the user's own (its keys, all the horse needs, are the same)."""
        me: Any = self
        composed = me.queue_class
        me.queue_class = given_queue_class(composed)
        try:
            return bytes(super()._dump_worker_config())  # type: ignore[misc]
        finally:
            me.queue_class = composed

    def main_work_horse(self, job: Job, queue: Queue) -> None:
        """In the spawned horse: the lease, the lifeline and the deadline, from the worker."""
        if ENV_LEASE in os.environ:
            path = os.environ.get(ENV_DEADLINE)
            self._horse_deadline = HorseDeadline(path) if path else None
            self._lifeline_fd = int(os.environ.get(ENV_LIFELINE) or -1)
            self._adopt_lease(job, queue, os.environ.get(ENV_LEASE, ""))
        super().main_work_horse(job, queue)  # type: ignore[misc]

    def _adopt_lease(self, job: Job, queue: Queue, token: str) -> None:
        me: Any = self
        if not token:
            return
        layout = QueueKeys.named(queue.name, type(queue), me.job_class)
        lease = Lease(layout.queue, job.id, token, layout=layout)
        attempt, _, fencing_token = os.environ.get(ENV_GRANT, "").partition(":")
        lease.attempt = int(attempt) if attempt.isdigit() else 0
        lease.fencing_token = int(fencing_token) if fencing_token.isdigit() else 0
        wanted = job.meta.get(META_MAX_ATTEMPTS)
        lease.max_attempts = job_max_attempts(wanted) if wanted is not None else None
        # RQ hands the spawned horse its execution (re-fetched by id): the start's HSET then
        # names the pinned started entry, as a forked horse's does
        lease.execution = getattr(me, "execution", None)
        fencing.prepare(me.connection)
        # never started: it only holds the lease that fences this horse's writes, as the
        # copy of the worker's lock manager does in a forked horse
        manager = me._new_lock_manager(me.connection)
        manager.add(lease)
        me.lock_manager = manager

    def teardown(self) -> None:
        super().teardown()  # type: ignore[misc]
        me: Any = self
        if self._horse_deadline is not None and not me.is_horse:
            self._horse_deadline.remove()
            # a worker may work() again (RQ's own tests do): a new file, and a watchdog on it
            self._horse_deadline = None
            me._watchdog = None


_SpawnWorker = compat.spawn_worker_class()
if _SpawnWorker is not None:

    class SpawnLeaseWorker(SpawnLeaseMixin, LeaseWorker, _SpawnWorker):  # type: ignore[misc,valid-type]
        """RQ's ``SpawnWorker`` (RQ 3) with leases: ``rq worker -w rq_emq.SpawnLeaseWorker``."""
