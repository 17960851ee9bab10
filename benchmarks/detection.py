"""How long a SIGKILLed worker's job takes to come back: ours beside stock RQ and BullMQ.

Ours, two kinds of death, each with real ``rq worker -w rq_emq.LeaseWorker`` processes at
the settings given (default: ``LeaseSettings()``'s); each round starts a batch of fresh
victims, each on a queue of its own with one long job, and kills them one after the other
at random moments (spread over two renew intervals for the seen kind, two sweep intervals
for the unseen, so that the kills meet every phase of those cycles); each victim is timed
from its own kill to its job being back in its queue, with a blocking pop on the queues
(it wakes the moment a job is pushed). A standalone ``rq-emq reaper`` on the victims'
queues is the only sweeper:

- *seen*: the worker alone is SIGKILLed (the OOM killer choosing it, a ``kill -9``); its
  watchdog, which outlives it, ends the horse and hands the job back (bound: a second).
  One victim a round by default (``--seen-batch``): a watchdog's hand-back starts a fresh
  interpreter and connects, and victims killed at once, or alive beside it, compete with
  it for the CPU (on a busy 2-core host, 4 victims a round took p50 1.0 s and up to 2.5 s
  where one a round took 0.2-0.5 s);
- *unseen*: every process of the worker is SIGKILLed (a host or a container lost whole):
  the worker is frozen (SIGSTOP, so that it starts no other process), its watchdog killed
  first, then the worker and every other process under it (its horse, a spare forked
  ahead); timed from the freeze. Bound: lease + 2 x sweep interval.

Stock RQ: no setting shortens the 60 s its started-registry entries outlive the last
heartbeat (``get_heartbeat_ttl`` adds it), so it is measured with the other settings
shortened (``--job-monitoring-interval 5`` on the workers that die; an idle observer
``rq.Worker`` with ``--maintenance-interval 1 --worker-ttl 16``, so that it runs
maintenance about every second), all victims killed in the same minute. Its outcome is
also reported: stock cleanup *fails* the job (``AbandonedJobError``) unless it has a
``Retry``. Its time with the default settings is computed from them. BullMQ's row is its
documentation's (a lock of 30 s, a stalled-jobs check every 30 s), not measured.

    python benchmarks/detection.py [--kills 50] [--seen-kills 50] [--stock-kills 5] [--batch 10]
        [--seen-batch 1] [--lease-ms MS] [--renew-ms MS] [--sweep-ms MS] [--quick]

At the defaults (lease 10 s) the full run takes about 8 minutes on 2 cores: 50 seen kills
at 2-4 s each, 50 unseen in 5 rounds of 10 at about 25 s a round, stock RQ about 2.5 minutes.
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
SEEN_BOUND_MS = 1000
REAPER = str(Path(sys.executable).parent / "rq-emq")
STOCK_MONITORING_INTERVAL = 5
DEFAULT_JOB_TIMEOUT = 180  # rq.Queue's default job timeout (seconds)
#: BullMQ's documented defaults: a job's lock lives 30 s (lockDuration) and the stalled-jobs
#: check runs every 30 s (stalledInterval): a dead worker's job is moved back 30-60 s later.
BULLMQ_MS = (30_000, 60_000)


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
    wait_until(lambda: r.get(f"bench:runner:{job_id}"), 60)
    horse, worker_pid = (r.get(f"bench:runner:{job_id}") or b"0 0").split()
    return int(horse), int(worker_pid)


def kill(*pids: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def descendants(pid: int) -> list[int]:
    """Every process under ``pid`` (children, theirs, ...), read from /proc."""
    children: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as stat:
                parent = int(stat.read().rsplit(b")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(parent, []).append(int(name))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def kill_whole(worker_pid: int, horse: int) -> None:
    """A worker lost whole: frozen, so that it starts nothing more; its watchdog first
    (it would see the others die), then the worker and everything under it."""
    os.kill(worker_pid, signal.SIGSTOP)
    kill(*watchdogs_of(worker_pid))
    kill(worker_pid, horse, *descendants(worker_pid))


def measure_ours(url: str, kills: int, seen: bool, settings: LeaseSettings, batch: int) -> list[float]:
    """Seen: the worker alone killed. Unseen: the worker, its watchdog (first) and every
    other process it started. ``batch`` victims a round, each on its own queue."""
    r = redis.Redis.from_url(url)
    r.flushdb()
    names = [f"{QUEUE}{i}" for i in range(max(batch, 1))]
    queues = [Queue(name, connection=r) for name in names]
    reaper = subprocess.Popen(
        [REAPER, "reaper", "--url", url, *names],
        env={**os.environ, **env_of(settings)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    latencies: list[float] = []
    # kills meet every phase of the renew cycle (seen) or of the renew and sweep cycles
    spread = 2 * (settings.renew_interval_ms if seen else settings.sweep_interval_ms) / 1000
    wait_s = 3 * (SEEN_BOUND_MS if seen else bound_ms(settings)) / 1000 + 10
    try:
        while len(latencies) < kills:
            size = min(batch, kills - len(latencies))
            with ExitStack() as stack:
                victims = [
                    stack.enter_context(worker(url, "rq_emq.LeaseWorker", [names[i]], env=env_of(settings)))
                    for i in range(size)
                ]
                jobs = [queues[i].enqueue("bench_jobs.hold", 600, job_timeout=900) for i in range(size)]
                pids = [runners(r, job.id) for job in jobs]
                for victim, (_, worker_pid) in zip(victims, pids, strict=True):
                    assert worker_pid == victim.pid
                offsets = sorted(random.uniform(0, spread) for _ in range(size))
                order = random.sample(range(size), size)
                killed: dict[bytes, float] = {}
                began = time.monotonic()
                for offset, i in zip(offsets, order, strict=True):
                    time.sleep(max(0.0, began + offset - time.monotonic()))
                    horse, worker_pid = pids[i]
                    killed[queues[i].key.encode()] = time.monotonic()
                    if seen:
                        kill(worker_pid)
                    else:
                        kill_whole(worker_pid, horse)
                waiting, deadline = dict(killed), time.monotonic() + wait_s
                while waiting:
                    # short blocking pops: the client's socket times out well before a lease
                    popped = r.blpop(list(waiting), timeout=1)
                    back = time.monotonic()
                    if popped is not None:
                        latencies.append(back - waiting.pop(popped[0]))
                    assert back < deadline, f"{len(waiting)} jobs not recovered within {wait_s:.0f} s"
                for job in jobs:
                    job.delete()
    finally:
        reaper.terminate()
        reaper.wait()
    return latencies


def settings_text(settings: LeaseSettings) -> str:
    given = "defaults" if settings == LeaseSettings() else "given"
    return (
        f"measured, {given}: lease {settings.lease_ms} ms, renew {settings.renew_interval_ms} ms, "
        f"sweep {settings.sweep_interval_ms} ms"
    )


def ours_row(kind: str, settings: LeaseSettings, latencies: list[float], bound: int) -> list[object]:
    ms = sorted(x * 1000 for x in latencies)
    return [
        f"rq_emq.LeaseWorker, {kind}",
        settings_text(settings),
        len(ms),
        f"{ms[0]:.0f}",
        f"{percentile(ms, 50):.0f}",
        f"{percentile(ms, 95):.0f}",
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


def settings_from(options: argparse.Namespace) -> LeaseSettings:
    """The settings given; each one not given follows the others, as a worker's does."""
    return LeaseSettings(
        lease_ms=options.lease_ms or 0,
        renew_interval_ms=options.renew_ms or 0,
        sweep_interval_ms=options.sweep_ms or 0,
    )


def main() -> None:
    defaults = LeaseSettings()
    parser = argparse.ArgumentParser()
    parser.add_argument("--kills", type=int, default=50, help="unseen deaths")
    parser.add_argument("--seen-kills", type=int, default=50, help="seen deaths")
    parser.add_argument("--stock-kills", type=int, default=5, help="0: stock RQ computed only")
    parser.add_argument(
        "--batch", type=int, default=10, help="unseen victims per round, each on its own queue"
    )
    parser.add_argument("--seen-batch", type=int, default=1, help="seen victims per round")
    parser.add_argument("--lease-ms", type=int, help=f"default {defaults.lease_ms}")
    parser.add_argument("--renew-ms", type=int, help="default: follows the lease")
    parser.add_argument("--sweep-ms", type=int, help="default: follows the lease and renew")
    parser.add_argument("--quick", action="store_true")
    options = parser.parse_args()
    if options.quick:
        options.kills, options.seen_kills, options.stock_kills, options.batch = 2, 2, 0, 2
    settings = settings_from(options)
    rows = []
    with private_redis() as url:
        if options.seen_kills:
            seen = measure_ours(url, options.seen_kills, True, settings, options.seen_batch)
            rows.append(ours_row("seen", settings, seen, SEEN_BOUND_MS))
        if options.kills:
            unseen = measure_ours(url, options.kills, False, settings, options.batch)
            rows.append(ours_row("unseen", settings, unseen, bound_ms(settings)))
        rows.append(
            [
                "rq_emq.LeaseWorker, unseen",
                f"computed, defaults: lease {defaults.lease_ms} ms, sweep {defaults.sweep_interval_ms} ms "
                "(earliest: killed just before a renewal)",
                "",
                f"{ours_earliest_ms(defaults)}",
                "",
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
                    *(
                        [f"{v:.0f}" for v in (sm[0], *(percentile(sm, p) for p in (50, 95, 99)), sm[-1])]
                        if sm
                        else ["-"] * 5
                    ),
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
                "",
                f"{latest * 1000}",
                "",
                "failed (AbandonedJobError)",
            ]
        )
        rows.append(
            [
                "BullMQ",
                "documented, not measured: defaults (lock 30 s, stalled-jobs check every 30 s)",
                "",
                f"{BULLMQ_MS[0]}",
                "",
                "",
                "",
                "",
                f"{BULLMQ_MS[1]}",
                "",
                "moved back to wait (failed past maxStalledCount)",
            ]
        )
    print(
        table(
            ["worker", "settings", "kills", "min ms", "p50 ms", "p95 ms", "p99 ms", "max ms", "bound ms"]
            + ["within", "outcome"],
            rows,
        )
    )


if __name__ == "__main__":
    main()
