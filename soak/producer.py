"""The soak's producer: it plans each job (how long, how it ends, what does its work,
whether it writes a fenced effect: :mod:`soak.effects`) and enqueues it at ``--rate`` per
second, a quarter of its ticks a lifecycle unit instead (:mod:`soak.lifecycle`), whose
cancels and deletes it then carries out."""

from __future__ import annotations

import time
import uuid
from typing import Any

from rq import Callback, Queue, Retry

from . import effects, lifecycle
from .base import SoakBase
from .fleet import QUEUE
from .jobs import on_failure, work
from .model import Planned


def enqueue_planned(client: Any, log: str, job: Planned) -> None:
    """``job`` enqueued under its id as planned (the producer's enqueue; the
    ``enqueue_again`` fault's second way, a web process enqueueing it again under its id)."""
    Queue(QUEUE, connection=client).enqueue(
        work,
        args=(log, job.seconds, job.outcome, job.retries, job.body, job.kind == "fenced"),
        job_id=job.job_id,
        job_timeout=120,
        retry=Retry(max=job.retries) if job.retries else None,
        meta={"emq_max_attempts": job.max_attempts} if job.max_attempts else None,
        on_failure=Callback(on_failure),
    )


class Producer(SoakBase):
    def plan(self) -> Planned:
        rng = self.job_rng
        roll = rng.random()
        if roll < 0.60:
            seconds = rng.uniform(0.01, 0.2)
        elif roll < 0.85:
            seconds = rng.uniform(0.2, 1.0)
        else:  # longer than the lease: renewal must keep these
            seconds = rng.uniform(self.config.lease_ms / 1000 * 1.1, self.config.lease_ms / 1000 * 2.2)
        roll = rng.random()
        outcome, retries = ("raise", 0) if roll < 0.1 else ("flaky", 2) if roll < 0.2 else ("ok", 0)
        if outcome == "ok" and rng.random() < 0.5:
            retries = 1
        # one job in ten may stall only once: the first stall fails it at max attempts
        fragile = 1 if rng.random() < 0.1 else None
        # one in ten works in a child process in its group (issue 21: a stop must end it
        # too; one in a session of its own outlives a horse killed from outside, a stated
        # limit), one in twenty holds the GIL in C code for all of its time, one in ten does
        # its work on threads (a pool, or a thread it joins: issue 46, a stop that unwinds a
        # SimpleLeaseWorker's frame leaves them working)
        roll = rng.random()
        bodies = ((0.1, "child"), (0.15, "gil"), (0.2, "pool"), (0.25, "thread"), (1.0, "sleep"))
        body = next(name for below, name in bodies if roll < below)
        if body in ("pool", "thread"):
            # long enough that a stop or kill lands mid-run, as its threads work on
            seconds = rng.uniform(0.6, 2.2) * self.config.lease_ms / 1000
        # half of them write an effect at the end of their work, plain and fenced (soak/effects.py)
        kind = "fenced" if rng.random() < effects.SHARE else "plain"
        return Planned(str(uuid.uuid4()), round(seconds, 3), outcome, retries, fragile, kind=kind, body=body)

    def enqueue(self, job: Planned) -> None:
        def once() -> None:
            if self.client.exists(f"rq:job:{job.job_id}"):
                return  # a reply lost in a restart: the job was enqueued
            # the client as it is now: a failover replaces it (soak/sentinel.py)
            enqueue_planned(self.client, self.log, job)

        self.redis_call(once)
        self.jobs[job.job_id] = job

    def enqueue_unit(self, jobs: list[Planned]) -> None:
        """A lifecycle unit (soak/lifecycle.py): parents before their dependent; a job to
        cancel or delete gets a thread that does so once it runs."""
        for job in jobs:
            self.redis_call(lambda job=job: lifecycle.enqueue(self.client, QUEUE, self.log, job))  # type: ignore[misc]
            self.jobs[job.job_id] = job
            if job.kind in ("cancel", "delete"):
                self.thread(lambda job=job: self.cancel_or_delete(job), f"soak-{job.kind}")  # type: ignore[misc]

    def cancel_or_delete(self, job: Planned) -> None:
        def running() -> bool:
            # a substring search, not a parse: the log grows by an ``alive`` line per run
            # every TICK_S, and this polls every 50 ms per waiting job
            try:
                with open(self.log) as log:
                    return f"start {job.job_id} " in log.read()
            except FileNotFoundError:
                return False

        lifecycle.wait_to_act(job, running, self._stop)
        if not self._stop.is_set():
            self.redis_call(lambda: lifecycle.act(self.client, job))

    def resubmit_after_loss(self, at: float) -> tuple[int, int]:
        """Every job enqueued before Redis lost its data, as a producer with idempotent ids
        recovers: a plain job enqueued again under its id with its plan; a lifecycle unit's
        job (a cancel's, a dependent's, a scheduled one...) is left lost with Redis."""
        resubmitted, lost = 0, 0
        for job_id, job in list(self.jobs.items()):
            if job.kind in ("plain", "fenced"):
                self.enqueue(job)
                self.resubmitted[job_id] = at
                resubmitted += 1
            else:
                self.lost_by_redis[job_id] = at
                lost += 1
        return resubmitted, lost

    def produce(self) -> None:
        interval = 1.0 / self.config.rate
        next_at = time.monotonic()
        while self._producing.is_set():
            plain = self.plan()
            with self.enqueue_guard:  # not across a loss of Redis' data (lose_data)
                if self.job_rng.random() < lifecycle.SHARE:
                    self.enqueue_unit(lifecycle.plan_unit(self.job_rng, plain, self.config.lease_ms / 1000))
                else:
                    self.enqueue(plain)
            next_at += interval
            time.sleep(max(0.0, next_at - time.monotonic()))
