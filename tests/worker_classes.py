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


class RecordingQueue(Queue):
    """A user's own queue class: one line in the file named by EMQ_TEST_QUEUE_LOG each time
    a worker takes its maintenance lock, naming the class that served it."""

    def acquire_maintenance_lock(self) -> bool:
        acquired = bool(super().acquire_maintenance_lock())
        with open(os.environ["EMQ_TEST_QUEUE_LOG"], "a") as out:
            out.write(f"maintenance {self.name} {type(self).__name__} {acquired}\n")
        return acquired
