"""The soak run: a private redis-server (AOF, fsync always), a fleet of real workers, a
producer, the chaos that hits workers and Redis while jobs flow, then a drain with every
fault healed, and the evidence the checks read (Redis state, the side-effect log, faults).
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any, TypeVar

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry as RedisRetry
from rq import Callback, Queue, Retry

from rq_emq.keys import QueueKeys
from rq_emq.testing import RedisServer

from . import faults as F
from . import lifecycle
from .faults import Fault
from .fleet import QUEUE, RQ_BIN, Fleet, Slot
from .jobs import on_failure, read_failure_callbacks, read_runs, work
from .model import Config, Evidence, Planned, save
from .selffence import read_stops

T = TypeVar("T")


class Soak:
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

    # -- producer --------------------------------------------------------------------------
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
        # limit), one in twenty holds the GIL in C code for all of its time
        roll = rng.random()
        body = "child" if roll < 0.1 else "gil" if roll < 0.15 else "sleep"
        return Planned(str(uuid.uuid4()), round(seconds, 3), outcome, retries, fragile, body=body)

    def enqueue(self, job: Planned) -> None:
        def once() -> None:
            if self.client.exists(f"rq:job:{job.job_id}"):
                return  # a reply lost in a restart: the job was enqueued
            # the client as it is now: a failover replaces it (soak/sentinel.py)
            Queue(QUEUE, connection=self.client).enqueue(
                work,
                args=(self.log, job.seconds, job.outcome, job.retries, job.body),
                job_id=job.job_id,
                job_timeout=120,
                retry=Retry(max=job.retries) if job.retries else None,
                meta={"emq_max_attempts": job.max_attempts} if job.max_attempts else None,
                on_failure=Callback(on_failure),
            )

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

    def produce(self) -> None:
        interval = 1.0 / self.config.rate
        next_at = time.monotonic()
        while self._producing.is_set():
            plain = self.plan()
            if self.job_rng.random() < lifecycle.SHARE:
                self.enqueue_unit(lifecycle.plan_unit(self.job_rng, plain, self.config.lease_ms / 1000))
            else:
                self.enqueue(plain)
            next_at += interval
            time.sleep(max(0.0, next_at - time.monotonic()))

    # -- chaos -----------------------------------------------------------------------------
    def scheduler_pids(self) -> set[int]:
        """Pids of RQ's scheduler processes (``--with-scheduler`` forks one beside the horse):
        no horse, so never a fault's victim. Remembered: a dead scheduler's hash expires."""
        try:
            for key in self.client.scan_iter("rq:scheduler:*"):
                pid = self.client.hget(key, "pid")
                if pid is not None and pid.isdigit():
                    self._schedulers.add(int(pid))
        except redis.RedisError:
            pass
        return self._schedulers

    def busy_victims(self) -> list[tuple[Slot, list[int]]]:
        out = []
        schedulers = self.scheduler_pids()
        for slot in self.fleet.slots:
            if slot in self.fleet.neighbours:
                continue  # a stock neighbour is only frozen (stock_actors), never a victim
            if slot.alive() and not slot.faulted and slot.pid is not None:
                horses = [p for p in F.horses(slot.pid) if p not in schedulers]
                if horses:
                    out.append((slot, horses))
        return out

    def held_job(self, slot: Slot, horses: list[int], runs: dict[str, list[Any]] | None = None) -> str | None:
        """The job the slot's horse is running, from the side-effect log."""
        for job_id, job_runs in (read_runs(self.log) if runs is None else runs).items():
            if any(r.pid in horses and r.ended is None for r in job_runs):
                return job_id
        return None

    def lease_of(self, job_id: str) -> tuple[bytes | None, int]:
        q = QueueKeys(QUEUE)
        pipe = self.client.pipeline(transaction=True)
        pipe.hget(f"rq:job:{job_id}", "emq_token").pttl(q.lock(job_id))
        token, pttl = pipe.execute()
        return token, int(pttl)

    def inject(self, kind: str) -> Fault | None:
        cfg, rng, now = self.config, self.chaos_rng, time.time()
        if kind == "restart":
            fault = Fault(kind, now)
            self.record(fault)
            self.server.kill()  # SIGKILL: what survives is what the AOF had fsynced
            time.sleep(rng.uniform(0.1, 0.8) * cfg.grace_s)  # a restart takes a while
            self.server.start()
            fault.ended = time.time()
            fault.detail = f"down {1000 * (fault.ended - now):.0f} ms"
            return fault
        victims = self.busy_victims()
        if kind.startswith("cut") or kind in ("hang", "partition_long"):
            victims = [v for v in victims if v[0].proxy is not None]
        runs = read_runs(self.log)
        held = [(slot, horses, self.held_job(slot, horses, runs)) for slot, horses in victims]
        if kind in F.MID_JOB:  # only a horse inside its job function: a run to overlap with
            held = [v for v in held if v[2] is not None]
        if not held:
            return None
        slot, horses, job_id = rng.choice(held)
        token = None
        if job_id and cfg.worker == "lease":
            token = self.redis_call(lambda: self.lease_of(job_id))[0]
        fault = Fault(kind, time.time(), slot.name, slot.pid, horses, job_id, token)
        self.record(fault)  # before the signal: the supervisor must know this death is no crash
        assert slot.pid is not None
        if kind == "kill_worker":
            F.send(F.signal.SIGKILL, slot.pid)
        elif kind == "kill_group":
            F.send(F.signal.SIGKILL, slot.pid, *horses)
        elif kind in ("kill_horse", "oom_horse"):
            F.send(F.signal.SIGKILL, *horses)
        elif kind == "client_kill":
            if slot.proxy is not None:
                addresses = slot.proxy.upstream_addresses()
            else:
                addresses = F.redis_addresses([slot.pid, *horses], self.server.port)
            killed = self.redis_call(lambda: F.client_kill(self.client, addresses))
            fault.detail = f"{killed} connections"
        elif kind in F.HELD:
            short = kind.endswith("short")
            hold = rng.uniform(0.3, 0.8) * cfg.grace_s if short else rng.uniform(1.3, 2.0) * cfg.bound_s + 0.5
            slot.faulted = True
            if kind == "stop_worker":
                F.send(F.signal.SIGSTOP, slot.pid)  # the worker alone: its horse runs on
            elif kind.startswith("stop"):
                F.send(F.signal.SIGSTOP, slot.pid, *horses)
            else:
                modes = {"hang": ["hang"], "partition_long": ["blackhole"]}.get(kind, ["reset", "blackhole"])
                mode = rng.choice(modes)
                assert slot.proxy is not None
                slot.proxy.cut(mode)
                fault.detail = mode
            fault.detail = f"{fault.detail} {hold:.2f}s".strip()
            self.after(hold, lambda: self.release(slot, fault, horses))
        if kind in F.CRASHING and cfg.worker == "lease" and job_id:
            fault.lapse_at = fault.started  # no lapse to wait for: the bound runs from the kill
        if kind in F.LAPSING and cfg.worker == "lease" and job_id:
            time.sleep(0.02)  # the signal or the cut has taken hold: no renewal gets through now
            pttl = self.redis_call(lambda: self.lease_of(job_id))[1]
            fault.lapse_at = time.time() + max(pttl, 0) / 1000
        return fault

    def record(self, fault: Fault) -> Fault:
        with self._guard:
            self.faults.append(fault)
        return fault

    def release(self, slot: Slot, fault: Fault, horses: list[int]) -> None:
        if fault.kind == "stop_worker":
            F.send(F.signal.SIGCONT, *(p for p in (slot.pid,) if p is not None))
        elif fault.kind.startswith("stop"):
            F.send(F.signal.SIGCONT, *(p for p in (slot.pid, *horses) if p is not None))
        elif slot.proxy is not None:
            slot.proxy.heal()
        fault.ended = time.time()
        slot.faulted = False

    def chaos(self) -> None:
        kinds = [k for k in self.config.kinds if k in F.KINDS and k != "restart"]
        start = time.monotonic()
        end = start + self.config.duration
        scheduled = self.schedule(start, end)
        time.sleep(min(3.0, self.config.duration / 10))
        while time.monotonic() < end and not self._stop.is_set():
            # a scheduled fault not ready yet (Sentinel mode: no replica in sync) waits at
            # the head of the schedule while the drawn ones go on
            if scheduled and time.monotonic() >= scheduled[0][0] and self.ready_for(scheduled[0][1]):
                kind = scheduled.pop(0)[1]
            elif kinds:
                kind = self.chaos_rng.choice(kinds)
            else:
                kind = ""
            if not kind:
                time.sleep(0.2)
                continue
            try:
                fault = self.inject(kind)
            except Exception as error:  # noqa: BLE001 - a failed injection is reported, not fatal
                fault = self.record(Fault(kind, time.time(), detail=f"injection failed: {error!r}"))
                fault.ended = fault.started
            if fault is not None and fault.kind not in F.HELD:
                fault.ended = fault.ended or time.time()
            time.sleep(min(max(self.chaos_rng.expovariate(1 / self.config.fault_every), 0.2), 5.0))

    def ready_for(self, kind: str) -> bool:
        return True

    def schedule(self, start: float, end: float) -> list[tuple[float, str]]:
        """(monotonic time, kind) of the faults that hit every worker at once. Redis
        restarts: a third of the way in, then every 30 s, the last at least 10 s before
        the chaos ends."""
        if "restart" not in self.config.kinds:
            return []
        restarts = [start + self.config.duration / 3]
        while restarts[-1] + 30 < end - 10:
            restarts.append(restarts[-1] + 30)
        return [(at, "restart") for at in restarts]

    def stock_actors(self) -> None:
        """Stock RQ beside the lease fleet, as a mixed fleet has it: a stock worker frozen
        now and then (idle in its own BLMOVE, or mid-job: our sweep must take neither of its
        jobs; the freeze is recorded as ``stop_stock``, which excuses no repeat), and stock
        ``rq info`` (a process that never imported rq_emq: its cleanup must fail no leased
        job). The freeze outlasts our recovery bound, so a sweep that would take the
        neighbour's job has done so before it resumes."""
        cfg, rng = self.config, random.Random(self.config.seed * 104729 + 3)
        end = time.monotonic() + cfg.duration
        while time.monotonic() < end and not self._stop.is_set():
            time.sleep(rng.uniform(1.0, 4.0))
            if rng.random() < 0.4:
                self.rq_info()
                continue
            free = [s for s in self.fleet.neighbours if s.alive() and not s.faulted and s.pid is not None]
            if not free:
                continue
            slot = rng.choice(free)
            assert slot.pid is not None
            horses = [p for p in F.children(slot.pid) if p not in self.scheduler_pids()]
            fault = self.record(
                Fault("stop_stock", time.time(), slot.name, slot.pid, horses, self.held_job(slot, horses))
            )
            slot.faulted = True
            F.send(F.signal.SIGSTOP, slot.pid, *horses)
            hold = rng.uniform(1.2, 1.6) * cfg.bound_s + 0.5
            fault.detail = f"{'mid-job' if horses else 'idle'} {hold:.2f}s"
            self.after(hold, lambda slot=slot, fault=fault, horses=horses: self.release(slot, fault, horses))  # type: ignore[misc]

    def rq_info(self) -> None:
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        try:
            subprocess.run(
                [RQ_BIN, "info", "--url", self.server.url, QUEUE], capture_output=True, timeout=30, env=env
            )
        except subprocess.TimeoutExpired:
            pass
        self.rq_info_calls += 1

    # -- watchers --------------------------------------------------------------------------
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
                        crash = Fault(kind, time.time(), name, pid, detail=f"exit status {code}{never}")
                        crash.ended = crash.started
                        self.faults.append(crash)
            time.sleep(0.2)

    def watch_requeues(self) -> None:
        """Sees a lapsed job leave its dead holder: its owner token changes (the sweep removes
        it on recovery; a later take records another). Resolution: one poll, 20 ms."""
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
                    tokens = pipe.execute()
                except redis.RedisError:
                    tokens = [None] * 0
                seen = time.time()
                for f, token in zip(watched, tokens, strict=False):
                    if token == f.token:
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
        while not self._stop.is_set():
            try:
                pipe = self.client.pipeline(transaction=True)
                pipe.lrange(q.rq_queue, 0, -1).zrange(q.leases, 0, -1)
                queued, leased = pipe.execute()
            except redis.RedisError:
                time.sleep(0.1)
                continue
            self.queue_samples += 1
            ids = [v.decode() for v in queued]
            twice = {i for i, n in Counter(ids).items() if n > 1}
            both = set(ids) & {v.decode() for v in leased} if self.config.worker == "lease" else set()
            for job_id in sorted(twice | both):
                what = "twice in the queue" if job_id in twice else "queued while leased"
                self.queue_violations.append(f"{time.time():.3f} {job_id} {what}")
            time.sleep(0.25)

    # -- the run ---------------------------------------------------------------------------
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
            if lifecycle.settled(self.jobs[j], status[j], [status.get(p) for p in self.jobs[j].parents])
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
        return Fleet(cfg.worker, cfg.workers, url, port, env, logs, cfg.workers // 2, neighbours)

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
        }
        stats = {k.decode(): int(v) for k, v in self.client.hgetall(q.stats).items()}
        deaths = sum(
            log.read_text(errors="replace").count("raised an exception")
            for log in (self.dir / "workers").glob("*.log")
        )
        if deaths:
            notes.append(f"RQ's scheduler quit {deaths} time(s) on a Redis error (RQ restarts it late)")
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
            self_fenced=read_stops(
                self.dir / "workers",
                {
                    f"soak-{'s' if slot.kind == 'stock' else 'w'}{slot.index}-{gen}": pid
                    for slot in self.fleet.slots
                    for gen, pid in enumerate(slot.pids, 1)
                },
            ),
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
