"""How long a SIGKILLed worker's job takes to come back: ours beside stock RQ.

Ours, two kinds of death, each with real ``rq worker -w rq_emq.LeaseWorker`` processes;
each round a fresh worker takes a long job and is killed at a random moment; the time
from the kill to the job being back in its queue is timed with a blocking pop on the
queue (it wakes the moment the job is pushed):

- *seen*: the worker alone is SIGKILLed (the OOM killer choosing it, a ``kill -9``), at
  the default settings; its watchdog, which outlives it, ends the horse and hands the job
  back (bound: a second);
- *unseen*: every process of the worker is SIGKILLed, its watchdog first (a host or a
  container lost whole), with short settings (lease 2 s, renew 0.5 s, sweep 1 s: bound
  lease + 2 x sweep interval = 4 s) and a standalone ``rq-emq reaper`` as the only
  sweeper; the bound for the default settings is computed from them.

Stock RQ: no setting shortens the 60 s its started-registry entries outlive the last
heartbeat (``get_heartbeat_ttl`` adds it), so it is measured with the other settings
shortened (``--job-monitoring-interval 5`` on the workers that die; an idle observer
``rq.Worker`` with ``--maintenance-interval 1 --worker-ttl 16``, so that it runs
maintenance about every second), all victims killed in the same minute. Its outcome is
also reported: stock cleanup *fails* the job (``AbandonedJobError``) unless it has a
``Retry``. Its time with the default settings is computed from them.

    python benchmarks/detection.py [--kills 20] [--seen-kills 50] [--stock-kills 5] [--quick]
"""

from __future__ import annotations

import argparse
import math
import os
import random
import signal
import subprocess
import sys
import time
from contextlib import ExitStack
from pathlib import Path

import redis
from common import percentile, private_redis, table, wait_until, worker
from rq import Queue
from rq.defaults import DEFAULT_JOB_MONITORING_INTERVAL, DEFAULT_MAINTENANCE_TASK_INTERVAL, DEFAULT_WORKER_TTL

from rq_emq.recover.sweep import Sweeper
from rq_emq.settings import LeaseSettings
from rq_emq.testing import watchdogs_of

QUEUE = "det"
SHORT = LeaseSettings(lease_ms=2_000, renew_interval_ms=500, sweep_interval_ms=1_000)
REAPER = str(Path(sys.executable).parent / "rq-emq")
STOCK_MONITORING_INTERVAL = 5
DEFAULT_JOB_TIMEOUT = 180  # rq.Queue's default job timeout (seconds)


def env_of(settings: LeaseSettings) -> dict[str, str]:
    return {
        "RQ_EMQ_LEASE_MS": str(settings.lease_ms),
        "RQ_EMQ_RENEW_INTERVAL_MS": str(settings.renew_interval_ms),
        "RQ_EMQ_SWEEP_INTERVAL_MS": str(settings.sweep_interval_ms),
    }


def bound_ms(settings: LeaseSettings) -> int:
    return settings.lease_ms + 2 * settings.sweep_interval_ms


def runners(r: redis.Redis, job_id: str) -> tuple[int, int]:
    """The horse running ``job_id`` and its worker, once the job has started."""
    wait_until(lambda: r.get(f"bench:runner:{job_id}"), 30)
    horse, worker_pid = (r.get(f"bench:runner:{job_id}") or b"0 0").split()
    return int(horse), int(worker_pid)


def kill(*pids: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def measure_ours(url: str, kills: int, seen: bool) -> list[float]:
    """Seen: the worker alone killed, at the default settings. Unseen: the worker, its
    horse and its watchdog (first: frozen worker, so it starts no other), short settings."""
    r = redis.Redis.from_url(url)
    r.flushdb()
    queue = Queue(QUEUE, connection=r)
    settings = LeaseSettings() if seen else SHORT
    reaper = subprocess.Popen(
        [REAPER, "reaper", "--url", url, QUEUE],
        env={**os.environ, **env_of(settings)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    latencies = []
    try:
        for _ in range(kills):
            with worker(url, "rq_emq.LeaseWorker", [QUEUE], env=env_of(settings)) as victim:
                job = queue.enqueue("bench_jobs.hold", 300)
                horse, worker_pid = runners(r, job.id)
                assert worker_pid == victim.pid
                # any moment of the renew cycle and of the sweep rounds
                time.sleep(random.uniform(0, 2 * SHORT.sweep_interval_ms / 1000))
                if not seen:
                    os.kill(victim.pid, signal.SIGSTOP)
                    kill(*watchdogs_of(victim.pid))
                killed = time.time()
                if seen:
                    kill(victim.pid)
                else:
                    kill(victim.pid, horse)
                popped = r.blpop([queue.key], timeout=3 * bound_ms(settings) / 1000 + 5)
                back = time.time()
                assert popped is not None and popped[1].decode() == job.id, "job not recovered"
                latencies.append(back - killed)
            job.delete()
    finally:
        reaper.terminate()
        reaper.wait()
    return latencies


def ours_row(kind: str, settings: str, latencies: list[float], bound: int) -> list[object]:
    ms = sorted(x * 1000 for x in latencies)
    return [
        f"rq_emq.LeaseWorker, {kind}",
        settings,
        len(ms),
        f"{ms[0]:.0f}",
        f"{percentile(ms, 50):.0f}",
        f"{percentile(ms, 99):.0f}",
        f"{ms[-1]:.0f}",
        f"{bound}",
        f"{sum(x <= bound for x in ms)}/{len(ms)}",
        "requeued (front)",
    ]


def measure_stock(url: str, kills: int) -> tuple[list[float], list[str]]:
    r = redis.Redis.from_url(url)
    r.flushdb()
    queue = Queue(QUEUE, connection=r)
    interval = ["--job-monitoring-interval", str(STOCK_MONITORING_INTERVAL)]
    with ExitStack() as stack:
        # rq's own CLI, as an operator runs it (options go before the queue name)
        for _ in range(kills):
            stack.enter_context(worker(url, "rq.Worker", [*interval, QUEUE]))
        wait_until(lambda: r.scard("rq:workers") == kills, 30)
        jobs = [queue.enqueue("bench_jobs.hold", 170) for _ in range(kills)]
        pids = [runners(r, job.id) for job in jobs]  # a job runs on whichever worker took it
        # the observer starts once every job is taken, so that it takes none itself
        observer = ["--maintenance-interval", "1", "--worker-ttl", "16", QUEUE]
        stack.enter_context(worker(url, "rq.Worker", observer))
        killed: dict[str, float] = {}
        for (horse, worker_pid), job in zip(pids, jobs, strict=True):
            time.sleep(random.uniform(0, STOCK_MONITORING_INTERVAL))  # any moment of the heartbeat cycle
            killed[job.id] = time.time()
            # killed with its horse: a stock horse outlives its worker (own process group)
            kill(worker_pid, horse)
        noticed: dict[str, float] = {}
        deadline = time.time() + 60 + STOCK_MONITORING_INTERVAL + 60
        while len(noticed) < kills and time.time() < deadline:
            for job in jobs:
                status = r.hget(job.key, "status")
                if job.id not in noticed and status != b"started":
                    noticed[job.id] = time.time()
            time.sleep(0.05)
        outcomes = []
        for job in jobs:
            job.refresh()
            status = job.get_status()
            result = job.latest_result()
            abandoned = result is not None and "AbandonedJobError" in (result.exc_string or "")
            reason = "AbandonedJobError" if abandoned else "?"
            outcomes.append(f"{getattr(status, 'value', status)} ({reason})")
    latencies = [noticed[job_id] - killed[job_id] for job_id in noticed]
    return latencies, outcomes


def ours_earliest_ms(settings: LeaseSettings) -> int:
    """Killed just before a renewal: the lock outlives it by lease - renew interval, then a
    mark must stand for the sweep's grace before a round recovers the job."""
    grace = Sweeper(redis.Redis(), [], settings).grace_ms  # the client is never used
    return settings.lease_ms - settings.renew_interval_ms + grace


def stock_default_bound_s() -> tuple[int, int]:
    """Earliest and latest detection with RQ's defaults, given an idle worker on the queue."""
    ttl = min(DEFAULT_JOB_TIMEOUT, DEFAULT_JOB_MONITORING_INTERVAL) + 60  # get_heartbeat_ttl
    earliest = ttl - DEFAULT_JOB_MONITORING_INTERVAL  # killed just before a heartbeat
    # an idle worker looks at its maintenance clock each time its blocking dequeue
    # (worker_ttl - 15 s) times out, and runs cleanup once maintenance_interval has passed
    dequeue = DEFAULT_WORKER_TTL - 15
    latest = ttl + math.ceil(DEFAULT_MAINTENANCE_TASK_INTERVAL / dequeue) * dequeue
    return earliest, latest


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--kills", type=int, default=20, help="unseen deaths (short settings)")
    parser.add_argument("--seen-kills", type=int, default=50, help="seen deaths (default settings)")
    parser.add_argument("--stock-kills", type=int, default=5, help="0: stock RQ computed only")
    parser.add_argument("--quick", action="store_true")
    options = parser.parse_args()
    if options.quick:
        options.kills, options.seen_kills, options.stock_kills = 2, 2, 0
    defaults = LeaseSettings()
    rows = []
    with private_redis() as url:
        seen = measure_ours(url, options.seen_kills, seen=True)
        rows.append(ours_row("seen", f"measured, defaults (lease {defaults.lease_ms} ms)", seen, 1000))
        unseen = measure_ours(url, options.kills, seen=False)
        short = f"measured, lease {SHORT.lease_ms} ms, sweep {SHORT.sweep_interval_ms} ms"
        rows.append(ours_row("unseen", short, unseen, bound_ms(SHORT)))
        rows.append(
            [
                "rq_emq.LeaseWorker, unseen",
                f"computed, defaults (lease {defaults.lease_ms} ms, sweep {defaults.sweep_interval_ms} ms)",
                "",
                f"{ours_earliest_ms(defaults)}",
                "",
                "",
                "",
                f"{bound_ms(defaults)}",
                "",
                "requeued (front)",
            ]
        )
        if options.stock_kills:
            stock, outcomes = measure_stock(url, options.stock_kills)
            sm = sorted(x * 1000 for x in stock)
            stock_bound = (STOCK_MONITORING_INTERVAL + 60 + 1 + 1) * 1000
            rows.append(
                [
                    "rq.Worker",
                    f"measured, --job-monitoring-interval {STOCK_MONITORING_INTERVAL}, "
                    "observer maintenance 1 s",
                    f"{len(sm)}/{options.stock_kills}",
                    f"{sm[0]:.0f}" if sm else "-",
                    f"{percentile(sm, 50):.0f}" if sm else "-",
                    f"{percentile(sm, 99):.0f}" if sm else "-",
                    f"{sm[-1]:.0f}" if sm else "-",
                    f"{stock_bound}",
                    f"{sum(x <= stock_bound for x in sm)}/{len(sm)}",
                    ", ".join(sorted(set(outcomes))),
                ]
            )
        earliest, latest = stock_default_bound_s()
        rows.append(
            [
                "rq.Worker",
                "computed, defaults (entry lives 90 s past a heartbeat every 30 s; idle worker: "
                "cleanup every 600 s, looked at every 405 s)",
                "",
                f"{earliest * 1000}",
                "",
                "",
                "",
                f"{latest * 1000}",
                "",
                "failed (AbandonedJobError)",
            ]
        )
    print(
        table(
            ["worker", "settings", "kills", "min ms", "p50 ms", "p99 ms", "max ms", "bound ms", "within"]
            + ["outcome"],
            rows,
        )
    )


if __name__ == "__main__":
    main()
