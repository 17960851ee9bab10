"""The soak's watchers, threads that run beside the chaos: the supervisor (respawns dead
workers, records a ``crash`` for an exit no fault caused), the requeue watcher (when a
lapsed job left its dead holder: the recovery bound's clock) and the queue sampler
(atomic snapshots for "never queued twice")."""

from __future__ import annotations

import time
from collections import Counter

import redis

from rq_emq.keys import QueueKeys

from . import conservation
from . import faults as F
from .base import SoakBase
from .faults import Fault
from .fleet import QUEUE

#: What a SimpleLeaseWorker logs as it ends its own process after a stop of its run, and
#: what the soak notes on the exit (soak/outcomes.py: no crash).
ENDED_ITSELF = "ending the worker process, the only proof that the run is over"
ENDED_AFTER_A_STOP = "ended itself after a stop of its run"


class Watchers(SoakBase):
    def supervise(self) -> None:
        """Respawns dead workers; one that exited without a kill from the soak is recorded
        as a ``crash`` (it died of something a fault did to it, e.g. a connection error)."""
        while not self._stop.is_set():
            if self.fleet.any_dead():
                # as a supervisor with a readiness check would: not while Redis loads its
                # AOF after a restart (RQ's CLI exits at once on that, before any worker
                # code runs: a harness effect, not a crash)
                try:  # (the client as it is then: a failover replaces it, soak/sentinel.py)
                    self.redis_call(lambda: self.client.dbsize())
                except redis.RedisError:
                    pass
            for name, pid, code in self.fleet.respawn_dead():
                with self._guard:
                    killed = any(f.worker_pid == pid and f.kind in F.KILLS for f in self.faults)
                    if not killed:
                        # stock RQ quits on a Redis error outside its dequeue (a restart):
                        # recorded, not judged; it excuses what stock RQ then does to its job
                        kind = "stock_exit" if pid in self.fleet.neighbour_pids() else "crash"
                        log = (self.fleet.log_dir / f"{name}.log").read_text(errors="replace")
                        # RQ's CLI exits before any worker code runs when it cannot reach Redis
                        never = "" if "started with PID" in log else "; never started"
                        # a SimpleLeaseWorker ends its process after a stop of its run (the
                        # only proof that the run is over, threads and all)
                        if ENDED_ITSELF in log:
                            never += "; " + ENDED_AFTER_A_STOP
                        crash = Fault(kind, time.time(), name, pid, detail=f"exit status {code}{never}")
                        crash.ended = crash.started
                        self.faults.append(crash)
            time.sleep(0.2)

    def watch_requeues(self) -> None:
        """Sees a lapsed job leave its dead holder: its owner token changes (the sweep removes
        it on recovery; a later take records another), or its lease leaves the queue's lease
        index while the token stands (RQ had put the job elsewhere meanwhile, a web process
        enqueueing it again say, so the sweep drops only the lease and leaves the job as RQ
        put it; a stock worker that then runs it writes no token of ours). Resolution: one
        poll, 20 ms."""
        leases = QueueKeys(QUEUE).leases
        while not self._stop.is_set():
            with self._guard:
                watched = [
                    f
                    for f in self.faults
                    if f.lapse_at and f.token and f.requeued_at is None and not f.detail.endswith("!")
                ]
            if watched:
                try:
                    pipe = self.client.pipeline(transaction=False)
                    for f in watched:
                        pipe.hget(f"rq:job:{f.job_id}", "emq_token")
                        pipe.zscore(leases, f.job_id)
                    replies = pipe.execute()
                except redis.RedisError:
                    replies = []
                seen = time.time()
                for f, token, leased in zip(watched, replies[::2], replies[1::2], strict=False):
                    if token == f.token and leased is not None:
                        continue
                    if token is not None and token == b"done:" + (f.token or b""):
                        f.detail += " finished by its holder (no lapse)!"
                    else:
                        f.requeued_at = seen
            time.sleep(0.02)

    def sample_queue(self) -> None:
        """Atomic snapshots of the queue (and, lease mode, the lease index): a job id twice
        in the queue, or queued while leased, is a job queued twice."""
        q = QueueKeys(QUEUE)
        last_event = "0-0"
        while not self._stop.is_set():
            try:
                pipe = self.client.pipeline(transaction=True)
                pipe.lrange(q.rq_queue, 0, -1).zrange(q.leases, 0, -1)
                queued, leased = pipe.execute()
                last_event = self._read_our_pushes(q.events, last_event)
            except redis.RedisError:
                time.sleep(0.1)
                continue
            self.queue_samples += 1
            self._sample_conservation()
            ids = [v.decode() for v in queued]
            twice = {i for i, n in Counter(ids).items() if n > 1}
            both = set(ids) & {v.decode() for v in leased} if self.config.worker == "lease" else set()
            for job_id in sorted(twice | both):
                what = "twice in the queue" if job_id in twice else "queued while leased"
                self.queue_violations.append(f"{time.time():.3f} {job_id} {what}")
            time.sleep(0.25)

    def _sample_conservation(self) -> None:
        """Each job in exactly one place RQ reads (soak/conservation.py), in one script."""
        try:
            lines = conservation.sample(self.client, QUEUE, list(self.jobs))
        except redis.RedisError:
            return
        self.conservation_samples += 1
        self.conservation += lines

    def _read_our_pushes(self, stream: str, after: str) -> str:
        """Our scripts' pushes of a job to its queue since ``after``, from the queue's event
        stream (a recovery by the sweep, a crashed horse's job put back), as (Redis time in
        seconds, job id) in ``self.our_pushes``: what soak/straycopies.py tells apart from
        a copy RQ's own client pushed. Returns the last entry's id read."""
        for entry_id, fields in self.client.xrange(stream, f"({after}", "+", count=1000):
            after = entry_id.decode()
            if fields.get(b"kind") in (b"recovered", b"crashed"):
                millis = int(after.split("-")[0])
                self.our_pushes.append((millis / 1000, fields.get(b"job", b"").decode()))
        return after
