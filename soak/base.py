"""What the soak's threads share: the run's configuration and state (the Redis client,
the fleet, the planned jobs, the fault record, the stop events), and the plumbing they all
use (a Redis call that waits out a restart, timers, daemon threads). The producer
(:mod:`soak.producer`), the chaos (:mod:`soak.chaos`) and the watchers
(:mod:`soak.watchers`) build on it; :mod:`soak.run` puts them together.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import redis

from rq_emq.testing import RedisServer

from .faults import Fault
from .fleet import Fleet
from .model import Config, Planned

T = TypeVar("T")


class SoakBase:
    def __init__(self, config: Config, work_dir: Path) -> None:
        self.config = config
        self.dir = work_dir
        self.log = str(work_dir / "runs.log")
        self.job_rng = random.Random(config.seed)
        self.chaos_rng = random.Random(config.seed * 7919 + 1)
        self.server = RedisServer(appendonly=True)
        self.client: Any = None  # a redis.Redis (its stubs type every reply as a union)
        self.fleet: Fleet
        self.jobs: dict[str, Planned] = {}
        self.faults: list[Fault] = []
        self.queue_violations: list[str] = []
        self.queue_samples = 0
        #: job id -> when Redis lost it (the ``lose_data`` fault's start): resubmitted by the
        #: producer under its id, or lost with Redis (a lifecycle unit's)
        self.resubmitted: dict[str, float] = {}
        self.lost_by_redis: dict[str, float] = {}
        #: held by the producer around each enqueue, and by a ``lose_data`` fault from the
        #: kill to the end of the resubmission: no enqueue straddles the loss
        self.enqueue_guard = threading.Lock()
        #: conservation samples' lines (soak/conservation.py): jobs not in exactly one place
        self.conservation: list[str] = []
        self.conservation_samples = 0
        #: (Redis time s, job id) of each push of a job by our scripts (soak/watchers.py)
        self.our_pushes: list[tuple[float, str]] = []
        self._guard = threading.Lock()
        self._producing = threading.Event()
        self._stop = threading.Event()
        self._timers: list[threading.Timer] = []
        self._schedulers: set[int] = set()
        self.rq_info_calls = 0
        #: cleared while a failover moves the master: the soak's own writes (enqueue,
        #: cancel) wait, so none lands on a master about to discard it
        self.writable = threading.Event()
        self.writable.set()

    # -- plumbing --------------------------------------------------------------------------
    def redis_call(self, fn: Callable[[], T], patience: float = 20.0) -> T:
        """Run ``fn`` against Redis, waiting out a restart."""
        deadline = time.monotonic() + patience
        self.writable.wait(patience)  # not while a failover moves the master (soak/sentinel.py)
        while True:
            try:
                return fn()
            except (redis.ConnectionError, redis.TimeoutError, redis.BusyLoadingError):
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)

    def after(self, seconds: float, fn: Callable[[], None]) -> None:
        timer = threading.Timer(seconds, fn)
        timer.daemon = True
        self._timers.append(timer)
        timer.start()

    def thread(self, fn: Callable[[], None], name: str) -> threading.Thread:
        t = threading.Thread(target=fn, name=name, daemon=True)
        t.start()
        return t

    def resubmit_after_loss(self, at: float) -> tuple[int, int]:
        """The producer's part after Redis lost its data at ``at`` (soak/producer.py):
        (jobs resubmitted, jobs lost)."""
        raise NotImplementedError

    def record(self, fault: Fault) -> Fault:
        with self._guard:
            self.faults.append(fault)
        return fault
