"""The soak run: a private redis-server (AOF, fsync always), the fleet of real workers,
the producer, the chaos and the watchers (:class:`Soak` puts them together), then a drain
with every fault healed, and the evidence the checks read (Redis state, the side-effect
log, faults), saved beside the run's files.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry as RedisRetry

from rq_emq.keys import QueueKeys
from rq_emq.operate.inspection import redis_now_ms

from . import effects, lifecycle
from .chaos import Chaos
from .fleet import QUEUE, Fleet
from .jobs import read_failure_callbacks, read_runs
from .model import Evidence, save
from .producer import Producer
from .selffence import read_stops
from .straycopies import read_drops
from .watchers import Watchers


class Soak(Producer, Chaos, Watchers):
    def drained(self) -> tuple[bool, int]:
        """Whether every job settled (and no failure awaits its Result); how many settled."""
        pipe = self.client.pipeline(transaction=False)
        ids = list(self.jobs)
        for job_id in ids:
            pipe.hget(f"rq:job:{job_id}", "status")
        raw = pipe.execute()
        outbox = self.client.zcard(QueueKeys(QUEUE).outbox)
        # a job canceled or deleted while it ran is settled for the producer at once, but
        # the run begun before may go on (and longer on a loaded host): its lease is
        # released when that run ends, which the checks then expect
        leased = {v.decode() for v in self.client.zrange(QueueKeys(QUEUE).leases, 0, -1)}
        status = {j: (s.decode() if s is not None else None) for j, s in zip(ids, raw, strict=True)}
        settled = sum(
            1
            for j in ids
            if (j in self.lost_by_redis and status[j] is None)  # lost with Redis, not resubmitted
            or lifecycle.settled(self.jobs[j], status[j], [status.get(p) for p in self.jobs[j].parents])
            and not (self.jobs[j].kind in ("cancel", "delete") and j in leased)
        )
        return settled == len(ids) and outbox == 0, settled

    def run(self) -> Evidence:
        cfg = self.config
        started = time.monotonic()
        self.start_redis()
        env = cfg.env() if cfg.worker == "lease" else {}
        logs = self.dir / "workers"
        logs.mkdir(parents=True, exist_ok=True)
        self.fleet = self.make_fleet(env, logs)
        drained_in = None
        notes: list[str] = getattr(self, "notes", [])
        try:
            self.fleet.start()
            self._producing.set()
            threads = [
                self.thread(self.produce, "soak-producer"),
                self.thread(self.supervise, "soak-supervisor"),
                self.thread(self.watch_requeues, "soak-requeues"),
                self.thread(self.sample_queue, "soak-queue-sampler"),
            ]
            chaos = self.thread(self.chaos, "soak-chaos")
            if self.fleet.neighbours:
                threads.append(self.thread(self.stock_actors, "soak-stock-actors"))
            chaos.join()
            self._producing.clear()
            threads[0].join()
            for timer in self._timers:  # heal every cut, resume every stop, now
                timer.cancel()
            for f in self.faults:
                if f.ended is None:
                    # the slot by its position: a fault whose injection failed half-way may
                    # have outlived its worker's generation (respawned under another name)
                    position = f.slot.rsplit("-", 1)[0]
                    slot = next(s for s in self.fleet.slots if s.name.rsplit("-", 1)[0] == position)
                    self.release(slot, f, f.horse_pids)
            drain_start = last_progress = time.monotonic()
            # stop early once nothing moves for long enough to recover and run any job
            patience = max(10.0, 3 * cfg.bound_s + 2.2 * cfg.lease_ms / 1000)
            drain = cfg.drain
            if cfg.worker == "stock":
                # give stock cleanup its chance: a dead worker's job falls due in RQ's
                # started registry 60 s (the heartbeat TTL's floor) + 1 s after its last beat
                patience, drain = 75.0, max(drain, 120.0)
            settled = -1
            while time.monotonic() - drain_start < drain:
                done, count = self.redis_call(self.drained)
                if done:
                    drained_in = time.monotonic() - drain_start
                    break
                if count != settled:
                    settled, last_progress = count, time.monotonic()
                elif time.monotonic() - last_progress > patience:
                    notes.append(f"drain stopped: no job settled in {patience:.0f}s")
                    break
                time.sleep(0.25)
            time.sleep(0.5)  # let the watcher see the last requeues
        finally:
            self._stop.set()
            self.fleet.stop_all()
        try:
            evidence = self.collect(drained_in, notes)
        finally:
            self.stop_redis()
        evidence.wall = time.monotonic() - started
        with open(self.dir / "faults.jsonl", "w") as out:
            for fault in self.faults:
                out.write(json.dumps(asdict(fault), default=repr) + "\n")
        save(evidence, self.dir / "evidence.json")
        with open(self.dir / "jobs.jsonl", "w") as out:
            for job_id, planned in self.jobs.items():
                out.write(json.dumps({**asdict(planned), **evidence.final[job_id]}) + "\n")
        return evidence

    def start_redis(self) -> None:
        self.server.start()
        # no retries inside redis-py (8.x resends a command ten times by default): a push
        # whose reply a restart lost would land twice; redis_call and enqueue's "was it
        # enqueued?" check are the soak's one careful retry
        self.client = redis.Redis.from_url(self.server.url, retry=RedisRetry(NoBackoff(), 0))

    def stop_redis(self) -> None:
        self.server.stop()

    def make_fleet(self, env: dict[str, str], logs: Path) -> Fleet:
        cfg = self.config
        neighbours = cfg.stock_neighbours if cfg.worker == "lease" else 0
        url, port = self.server.url, self.server.port
        lease = cfg.worker == "lease"
        simple, debug = (cfg.simple_workers, cfg.debug_workers) if lease else (0, 0)
        proxied = cfg.workers // 2
        return Fleet(
            cfg.worker,
            cfg.workers,
            url,
            port,
            env,
            logs,
            proxied,
            neighbours,
            simple=simple,
            debug=debug,
        )

    def collect(self, drained_in: float | None, notes: list[str]) -> Evidence:
        from rq.job import Job

        q = QueueKeys(QUEUE)
        final: dict[str, dict[str, Any]] = {}
        for job_id in self.jobs:
            raw = self.client.hgetall(f"rq:job:{job_id}")
            state = {k.decode(): v.decode(errors="replace") for k, v in raw.items() if k.decode() != "data"}
            reason = ""
            if state.get("status") == "failed":
                try:
                    result = Job.fetch(job_id, connection=self.client).latest_result()
                    reason = (result.exc_string or "") if result is not None else ""
                except Exception as error:  # noqa: BLE001
                    reason = f"(unreadable result: {error!r})"
            final[job_id] = {
                "status": state.get("status"),
                "attempts": state.get("emq_attempts"),
                "max_attempts": state.get("emq_max_attempts"),
                "failure": state.get("emq_failure"),
                "reason": reason,
                # the horse names itself as it starts; a horse killed before that leaves only
                # the take's record of the worker (ours), so a kill_horse can still explain it
                "worker": state.get("worker_name") or state.get("emq_worker"),
                # when RQ ended it (epoch seconds), to tell a fault before its end from one after
                "ended_at": _epoch(state.get("ended_at")),
            }
        registries = {
            "queued": [v.decode() for v in self.client.lrange(q.rq_queue, 0, -1)],
            "finished": [v.decode() for v in self.client.zrange(f"rq:finished:{QUEUE}", 0, -1)],
            "failed": [v.decode() for v in self.client.zrange(q.failed, 0, -1)],
            "leases": [v.decode() for v in self.client.zrange(q.leases, 0, -1)],
            "started": [v.decode().split(":")[0] for v in self.client.zrange(q.started, 0, -1)],
            # RQ's list between a stock worker's BLMOVE and its start (ours never use it), and
            # ours between an idle LeaseWorker's BLMOVE and its claim
            "intermediate": [v.decode() for v in self.client.lrange(q.intermediate, 0, -1)],
            "moving": [v.decode() for v in self.client.lrange(q.moving, 0, -1)],
            # failures at max attempts whose Result waits on a drainer's live claim (the claim
            # outlasts the failure callback's timeout, 90 s by default: a drainer the soak hit
            # mid-drain holds it that long): the zset's score is when the claim lapses
            "outbox_claimed": [
                v.decode() for v in self.client.zrangebyscore(q.outbox, redis_now_ms(self.client) + 1, "+inf")
            ],
        }
        stats = {k.decode(): int(v) for k, v in self.client.hgetall(q.stats).items()}
        deaths = sum(
            log.read_text(errors="replace").count("raised an exception")
            for log in (self.dir / "workers").glob("*.log")
        )
        if deaths:
            notes.append(f"RQ's scheduler quit {deaths} time(s) on a Redis error (RQ restarts it late)")
        pid_of = {
            f"soak-{'s' if slot.kind == 'stock' else 'w'}{slot.index}-{gen}": pid
            for slot in self.fleet.slots
            for gen, pid in enumerate(slot.pids, 1)
        }
        evidence = Evidence(
            self.config,
            self.jobs,
            self.faults,
            self.queue_samples,
            self.queue_violations,
            final,
            registries,
            stats,
            read_runs(self.log),  # type: ignore[arg-type]
            self.fleet.respawns,
            drained_in,
            notes=notes,
            scheduler_deaths=deaths,
            stock_workers=[pid for slot in self.fleet.neighbours for pid in slot.pids],
            rq_info_calls=self.rq_info_calls,
            failure_callbacks=read_failure_callbacks(self.log),
            self_fenced=read_stops(self.dir / "workers", pid_of),
            stray_drops=read_drops(self.dir / "workers", pid_of),
            our_pushes=list(self.our_pushes),
            effects=effects.collect(self.client, [j for j, p in self.jobs.items() if p.kind == "fenced"]),
            conservation_samples=self.conservation_samples,
            conservation=list(self.conservation),
            resubmitted=dict(self.resubmitted),
            lost_by_redis=dict(self.lost_by_redis),
            simple_workers=[pid for slot in self.fleet.slots if slot.simple for pid in slot.pids],
        )
        return evidence


def _epoch(stamp: str | None) -> float | None:
    """RQ's UTC stamp (``2026-12-01T19:35:00.123456Z``) as epoch seconds; None when absent or odd."""
    from datetime import timezone

    from rq.utils import utcparse

    try:
        return utcparse(stamp).replace(tzinfo=timezone.utc).timestamp() if stamp else None
    except ValueError:
        return None
