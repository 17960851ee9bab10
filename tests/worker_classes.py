"""Worker and job classes for tests that need a worker to be slow, or to be interrupted,
at one exact step. Each acts only when its EMQ_TEST_* environment variables are set, so
the same process may also run ordinary jobs."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from rq import Queue, SimpleWorker, Worker
from rq.job import Job
from rq.worker import HerokuWorker, RandomWorker, RoundRobinWorker

from rq_emq import LeaseMixin, LeaseWorker, lease_worker


class SlowStartLeaseWorker(LeaseWorker):
    """A LeaseWorker whose horse, before its first write, leaves its pid in the file named
    by EMQ_TEST_START_MARKER and then sleeps EMQ_TEST_START_DELAY seconds: a horse frozen
    just before it marks its job started."""

    def prepare_job_execution(self, job: Job, *args: Any, **kwargs: Any) -> Any:
        Path(os.environ["EMQ_TEST_START_MARKER"]).write_text(str(os.getpid()))
        time.sleep(float(os.environ["EMQ_TEST_START_DELAY"]))
        return super().prepare_job_execution(job, *args, **kwargs)


class BlipAtFailureLeaseWorker(LeaseWorker):
    """A LeaseWorker whose first attempt to write a failure outcome meets a connection
    error, exactly at RQ's failure transaction (a blip too narrow to aim a proxy cut at)."""

    def handle_job_failure(self, job: Job, queue: Any, *args: Any, **kwargs: Any) -> Any:
        import redis

        original = redis.client.Pipeline.execute
        blipped: list[bool] = []

        def execute(pipe: Any, *a: Any, **kw: Any) -> Any:
            # RQ's transaction, or the fenced script it became (sent without MULTI/EXEC)
            fenced = getattr(pipe, "_emq_session", None) is not None
            if (pipe.transaction or fenced) and pipe.command_stack and not blipped:
                blipped.append(True)
                with open(os.environ["EMQ_TEST_BLIP_MARKER"], "a") as marker:
                    marker.write("blip\n")
                pipe.reset()
                raise redis.exceptions.ConnectionError("a blip as the failure is written")
            return original(pipe, *a, **kw)

        redis.client.Pipeline.execute = execute  # type: ignore[method-assign]
        try:
            return super().handle_job_failure(job, queue, *args, **kwargs)
        finally:
            redis.client.Pipeline.execute = original  # type: ignore[method-assign]


class RecordingQueue(Queue):
    """A user's own queue class: one line in the file named by EMQ_TEST_QUEUE_LOG each time
    a worker takes its maintenance lock, naming the class that served it."""

    def acquire_maintenance_lock(self) -> bool:
        acquired = bool(super().acquire_maintenance_lock())
        with open(os.environ["EMQ_TEST_QUEUE_LOG"], "a") as out:
            out.write(f"maintenance {self.name} {type(self).__name__} {acquired}\n")
        return acquired


class PausingFetchJob(Job):
    """A job class (``rq worker --job-class worker_classes.PausingFetchJob``) that pauses
    right after RQ has read a parent's dependents (``fetch_many``, a MULTI/EXEC of
    ``HGETALL``s) and before RQ writes the parent's outcome. It pauses once, when the ids
    read include EMQ_TEST_PAUSE_FETCH_OF: it leaves its pid in the file named by
    EMQ_TEST_FETCH_MARKER, then sleeps EMQ_TEST_FETCH_DELAY seconds."""

    @classmethod
    def fetch_many(cls, job_ids: Iterable[str], connection: Any, serializer: Any = None) -> list[Job | None]:
        ids = list(job_ids)
        jobs = super().fetch_many(ids, connection, serializer)
        wanted, marker = os.environ.get("EMQ_TEST_PAUSE_FETCH_OF"), os.environ.get("EMQ_TEST_FETCH_MARKER")
        if wanted and marker and wanted in ids and not Path(marker).exists():
            Path(marker).write_text(str(os.getpid()))
            time.sleep(float(os.environ.get("EMQ_TEST_FETCH_DELAY", "30")))
        return jobs


class StealingJob(Job):
    """A job class whose ``restore()`` (the worker builds the job from the hash its take
    returned) gives the lease of a job with ``meta["emq_test_steal"]`` to another owner:
    a lease stolen between the take and the worker's guarded start. Once only (the file
    named by EMQ_TEST_STEAL_MARKER records it), so a recovered job runs normally."""

    def restore(self, raw_data: Any) -> None:
        super().restore(raw_data)
        marker = os.environ.get("EMQ_TEST_STEAL_MARKER")
        if self.meta.get("emq_test_steal") and marker and not Path(marker).exists():
            Path(marker).write_text(self.id)
            self.connection.hset(self.key, "emq_token", "stolen-by-test")


class SelfStoppingLeaseWorker(LeaseWorker):
    """A LeaseWorker that sends itself SIGTERM (a warm stop) right after its first take
    returns a job, before anything else of the worker has seen the job."""

    def bootstrap(self, *args: Any, **kwargs: Any) -> None:
        super().bootstrap(*args, **kwargs)
        taker: Any = self._taker
        pop = taker.pop
        fired: list[bool] = []

        def pop_then_stop(*pop_args: Any, **pop_kwargs: Any) -> Any:
            taken = pop(*pop_args, **pop_kwargs)
            if taken is not None and not fired:
                fired.append(True)
                os.kill(os.getpid(), signal.SIGTERM)
                # the stop lands while the job is taken but not yet recorded by the worker:
                # a handler that is not held back runs during this pause
                time.sleep(0.05)
            return taken

        taker.pop = pop_then_stop


class OldRedisLeaseWorker(LeaseWorker):
    """A LeaseWorker whose Redis says, in INFO, that it is the version EMQ_TEST_REDIS_VERSION."""

    def bootstrap(self, *args: Any, **kwargs: Any) -> None:
        real_info = self.connection.info

        def info(section: str | None = None, *more: Any, **kwargs: Any) -> dict[str, Any]:
            reply = dict(real_info(section, *more, **kwargs))
            reply["redis_version"] = os.environ["EMQ_TEST_REDIS_VERSION"]
            return reply

        self.connection.info = info  # type: ignore[method-assign]
        super().bootstrap(*args, **kwargs)


# -- Other RQ worker classes and namespaces (tests/run/test_worker_options.py) ----------------


class CustomNamespaceJob(Job):
    """A job class whose hashes live under ``custom:job:`` (``rq worker --job-class``)."""

    redis_job_namespace_prefix = "custom:job:"


class CustomNamespaceQueue(Queue):
    """A queue class whose lists live under ``custom:queue:`` (``rq worker --queue-class``)."""

    redis_queue_namespace_prefix = "custom:queue:"


class AuditingWorker(Worker):
    """A user's own forking worker: one line in the file named by EMQ_TEST_AUDIT_LOG per
    job it is about to run, naming the class that ran it."""

    def execute_job(self, job: Job, queue: Queue) -> Any:
        with open(os.environ["EMQ_TEST_AUDIT_LOG"], "a") as out:
            out.write(f"execute {job.id} {type(self).__name__}\n")
        return super().execute_job(job, queue)


class AuditingSimpleWorker(SimpleWorker):
    """A user's own non-forking worker, auditing as :class:`AuditingWorker` does."""

    def execute_job(self, job: Job, queue: Queue) -> Any:
        with open(os.environ["EMQ_TEST_AUDIT_LOG"], "a") as out:
            out.write(f"execute {job.id} {type(self).__name__}\n")
        return super().execute_job(job, queue)


# The documented way: a module-level name for each composed class (``rq worker -w ...``).
LeaseAuditingWorker = lease_worker(AuditingWorker)
LeaseAuditingSimpleWorker = lease_worker(AuditingSimpleWorker)
LeaseHerokuWorker = lease_worker(HerokuWorker)
LeaseRoundRobinWorker = lease_worker(RoundRobinWorker)
LeaseRandomWorker = lease_worker(RandomWorker)


class HandMixedWorker(LeaseMixin, Worker):  # type: ignore[misc]
    """The lease mixin put by hand before a forking class, without LeaseWorker's horse
    parts: refused at startup."""


_SpawnWorker = getattr(__import__("rq.worker", fromlist=["SpawnWorker"]), "SpawnWorker", None)
if _SpawnWorker is not None:  # RQ 3
    LeaseSpawnWorker = lease_worker(_SpawnWorker)


class PerQueueWaitLeaseWorker(LeaseWorker):
    """A LeaseWorker that waits on several queues with a connection per queue (the path of
    a server refusing the idle watch: ``tests/intake/test_fleet_processes.py``)."""

    _watch_idle = False
