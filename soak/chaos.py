"""The soak's chaos: the faults drawn (``--fault-every``) and scheduled (Redis restarts)
against busy workers and Redis (:mod:`soak.faults` says what each kind does), their release
(SIGCONT, heal, a cold stop's second SIGTERM, a quick log handler again), and the stock
neighbour's freezes and ``rq info`` calls beside the fleet.

A ``SimpleLeaseWorker`` has no horse: its run is the worker process, so a fault on it lists
the worker as the run's process (``horse_pids``) and is one of :data:`soak.faults.SIMPLE_KINDS`."""

from __future__ import annotations

import os
import random
import shutil
import subprocess
import time
from typing import Any

import redis
from rq import Queue
from rq.job import Job

from rq_emq.keys import QueueKeys

from . import faults as F
from .base import SoakBase
from .faults import Fault
from .fleet import QUEUE, RQ_BIN, Slot
from .jobs import read_runs
from .producer import enqueue_planned


class Chaos(SoakBase):
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
                if slot.simple:  # the run is the worker process (busy: held_job tells)
                    out.append((slot, [slot.pid]))
                    continue
                horses = [p for p in F.horses(slot.pid) if p not in schedulers]
                if horses:
                    out.append((slot, horses))
        return out

    def fits(self, kind: str, slot: Slot, job_id: str | None) -> bool:
        """Whether a fault of ``kind`` can hit ``slot`` running ``job_id`` (None: between
        jobs): a SimpleLeaseWorker takes no horse-only kind and only when busy, a slow log
        needs a DEBUG worker, a job enqueued again is a plain job (a lifecycle unit's
        dependents, cancels and schedules are judged by rules of their own)."""
        if slot.simple and (kind not in F.SIMPLE_KINDS or job_id is None):
            return False
        if kind in F.DEBUG_ONLY and slot.slow_flag is None:
            return False
        if kind == "enqueue_again":
            planned = self.jobs.get(job_id or "")
            return planned is not None and planned.kind in ("plain", "fenced")
        return True

    def threaded(self, job_id: str | None) -> bool:
        """The job does its work on threads (the ``pool`` and ``thread`` bodies)."""
        planned = self.jobs.get(job_id or "")
        return planned is not None and planned.body in ("pool", "thread")

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
        if kind == "lose_data":
            return self.lose_data()
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
        held = [v for v in held if self.fits(kind, v[0], v[2])]
        if kind in F.MID_JOB:  # only a horse inside its job function: a run to overlap with
            held = [v for v in held if v[2] is not None]
        threaded = [v for v in held if v[0].simple and self.threaded(v[2])]
        if kind in F.STOPS_THREADS and threaded:
            # threads in a simple-mode job: the stop unwinds the frame while they work on
            held = threaded
        if not held:
            return None
        slot, horses, job_id = rng.choice(held)
        token = None
        if job_id and cfg.worker == "lease":
            token = self.redis_call(lambda: self.lease_of(job_id))[0]
        fault = Fault(kind, time.time(), slot.name, slot.pid, horses, job_id, token)
        self.record(fault)  # before the signal: the supervisor must know this death is no crash
        assert slot.pid is not None
        watchdog = [p for p in F.children(slot.pid) if F.is_watchdog(p)] if kind in F.SEEN_DEATHS else []
        if watchdog:
            # its death is seen: the bound runs from the kill (soak/recoverybound.py)
            fault.detail = f"watchdog {watchdog[0]}"
        if kind == "enqueue_again":
            fault.detail = self.enqueue_again(job_id)
        elif kind == "cold_stop":
            slot.faulted = True  # not respawned before its second signal
            F.send(F.signal.SIGTERM, slot.pid)
            # RQ ignores a second signal within a second of the first
            hold = rng.uniform(1.1, 1.6)
            fault.detail = f"second SIGTERM after {hold:.2f}s"
            self.after(hold, lambda: self.release(slot, fault, horses))
        elif kind == "slow_log":
            assert slot.slow_flag is not None
            slot.faulted = True
            slot.slow_flag.touch()
            hold = rng.uniform(1.3, 2.0) * cfg.bound_s + 0.5
            fault.detail = f"{hold:.2f}s"
            self.after(hold, lambda: self.release(slot, fault, horses))
        elif kind == "kill_worker":
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
        elif kind in F.HELD and kind not in ("cold_stop", "slow_log"):
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
        if (kind in F.CRASHING or watchdog) and cfg.worker == "lease" and job_id:
            fault.lapse_at = fault.started  # no lapse to wait for: the bound runs from the kill
        elif kind in F.LAPSING and cfg.worker == "lease" and job_id:
            time.sleep(0.02)  # the signal or the cut has taken hold: no renewal gets through now
            pttl = self.redis_call(lambda: self.lease_of(job_id))[1]
            fault.lapse_at = time.time() + max(pttl, 0) / 1000
        return fault

    def lose_data(self) -> Fault:
        """Redis restarts without persistence: SIGKILLed, its AOF removed, started empty
        after as long as a ``restart`` is down. The producer resubmits once the holders of
        the lost leases have had a lease to hear of it (their next renewal finds the lease
        lost and stops the run; a resubmission within a renew interval of the restart may
        be taken before that renewal: docs/soak.md)."""
        cfg = self.config
        with self.enqueue_guard:  # no enqueue straddles the loss
            fault = self.record(Fault("lose_data", time.time()))
            self.server.kill()
            for name in ("appendonlydir", "appendonly.aof", "dump.rdb"):  # what a restart reloads
                path = self.server.dir / name
                shutil.rmtree(path) if path.is_dir() else path.unlink(missing_ok=True)
            time.sleep(self.chaos_rng.uniform(0.1, 0.8) * cfg.grace_s)
            self.server.start()
            back = time.time()
            time.sleep(cfg.lease_ms / 1000)
            resubmitted, lost = self.resubmit_after_loss(fault.started)
            fault.ended = time.time()
        fault.detail = f"down {1000 * (back - fault.started):.0f} ms; resubmitted {resubmitted}, lost {lost}"
        return fault

    def enqueue_again(self, job_id: str | None) -> str:
        """The running job ``job_id`` enqueued again, as a web process does it: RQ's
        ``enqueue_job`` of a copy it fetched, or ``enqueue`` under its id (one try: a
        resend after a lost reply would be a second enqueue). Returns which."""
        assert job_id is not None
        how = self.chaos_rng.choice(("enqueue_job of a fetched copy", "enqueue under its id"))
        if how.startswith("enqueue_job"):
            Queue(QUEUE, connection=self.client).enqueue_job(Job.fetch(job_id, connection=self.client))
        else:
            enqueue_planned(self.client, self.log, self.jobs[job_id])
        return how

    def release(self, slot: Slot, fault: Fault, horses: list[int]) -> None:
        if fault.kind == "cold_stop":
            if fault.worker_pid is not None and slot.pid == fault.worker_pid:
                F.send(F.signal.SIGTERM, fault.worker_pid)  # the second: a cold shutdown
        elif fault.kind == "slow_log":
            if slot.slow_flag is not None:
                slot.slow_flag.unlink(missing_ok=True)
        elif fault.kind == "stop_worker":
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
        the chaos ends; a loss of its data (``--lose-data``): once, half-way."""
        scheduled = []
        if "lose_data" in self.config.kinds:
            scheduled.append((start + self.config.duration / 2, "lose_data"))
        if "restart" in self.config.kinds:
            restarts = [start + self.config.duration / 3]
            while restarts[-1] + 30 < end - 10:
                restarts.append(restarts[-1] + 30)
            scheduled += [(at, "restart") for at in restarts]
        return sorted(scheduled)

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
