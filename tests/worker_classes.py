"""Worker classes for tests that need a worker to be slow at one exact step."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from rq import Queue
from rq.job import Job

from rq_emq import LeaseWorker


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
            if pipe.transaction and pipe.command_stack and not blipped:
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
