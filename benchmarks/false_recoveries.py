"""No false recoveries under load: healthy ``LeaseWorker`` runs are never taken from them.

For ``--duration`` seconds, at the settings given (default: ``LeaseSettings()``'s), on a
private redis-server: ``--workers`` ``rq worker -w rq_emq.LeaseWorker`` processes on one
queue, the first ``--debug-workers`` of them under ``--logging_level DEBUG`` with a log
handler that takes ``--slow-log-seconds`` per record (``-c false_recovery_load``: every
record of the process, RQ's heartbeat lines included); ``--burners`` processes spinning on
the CPU; a stream of jobs that keeps ``--depth`` jobs waiting (short sleeps of 0.1-1 s and,
``--long-share`` of them, sleeps of 2.5-4 leases); one job at a time holding the GIL in C
code in its horse (catastrophic regex backtracking sized, on this machine before the load
starts, to ``--gil-seconds``; it runs longer under the load); and the redis-server stopped
(SIGSTOP) for ``--stall-seconds`` every ``--stall-every`` seconds, then continued. Once the
duration is over, no more jobs are enqueued and every job is waited for (at most
``--drain`` seconds).

No process is killed, so every recovery is false. Counted from our counters
(``emq:{q}:stats``), from the lease events of every worker (an event hook), from the
workers' logs (the local lease clock's line, the watchdog's), and from the jobs themselves:
each appends a line as it starts and as it ends, so a job that ran twice shows two starts.
The longest time a lease went without renewal is sampled from Redis (the oldest lease's
age, ``rq-emq status``'s reading) about four times a second. Exits 1 on any recovery, any
job failed or run more than once, any lease lost, or any job left unfinished.

    python benchmarks/false_recoveries.py [--duration 180] [--workers 20] [--debug-workers 5]
        [--burners 2] [--stall-every 30] [--stall-seconds 1] [--gil-seconds 5]
        [--slow-log-seconds 2] [--lease-ms MS] [--renew-ms MS] [--sweep-ms MS]

The full run takes the duration plus about a minute (workers' start, the drain).
"""

from __future__ import annotations

import argparse
import math
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import redis
from common import HERE, RQ_BIN, table, wait_until, worker_environ
from false_recovery_load import backtrack
from rq import Queue

from rq_emq.keys import QueueKeys
from rq_emq.operate.inspection import read_status
from rq_emq.settings import LeaseSettings
from rq_emq.testing import RedisServer

QUEUE = "fr"
FINAL = {b"finished", b"failed", b"stopped", b"canceled"}
#: The workers' log lines that say a run was stopped by the local lease clock: the worker's
#: (its clock ran out), the watchdog's (it ended a run past its deadline).
CLOCK_LINE = "local lease clock ran out"
WATCHDOG_LINE = "past its deadline"


def settings_from(options: argparse.Namespace) -> LeaseSettings:
    """The settings given; each one not given follows the others, as a worker's does."""
    return LeaseSettings(
        lease_ms=options.lease_ms or 0,
        renew_interval_ms=options.renew_ms or 0,
        sweep_interval_ms=options.sweep_ms or 0,
    )


def env_of(settings: LeaseSettings) -> dict[str, str]:
    return {
        "RQ_EMQ_LEASE_MS": str(settings.lease_ms),
        "RQ_EMQ_RENEW_INTERVAL_MS": str(settings.renew_interval_ms),
        "RQ_EMQ_SWEEP_INTERVAL_MS": str(settings.sweep_interval_ms),
    }


def gil_size(seconds: float) -> int:
    """The ``n`` for which :func:`backtrack` takes about ``seconds`` here (each extra
    character about doubles it), measured before any load starts."""
    n, took = 16, 0.0
    while took < 0.2:
        n += 1
        began = time.perf_counter()
        backtrack(n)
        took = time.perf_counter() - began
    return n + max(0, round(math.log2(seconds / took)))


@contextmanager
def processes() -> Iterator[list[subprocess.Popen[bytes]]]:
    """Processes started in sessions of their own, each killed whole at the end."""
    started: list[subprocess.Popen[bytes]] = []
    try:
        yield started
    finally:
        for process in started:
            if process.poll() is None:
                try:
                    os.killpg(process.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        for process in started:
            process.wait()


def start_worker(url: str, env: dict[str, str], log: Path, debug: bool) -> subprocess.Popen[bytes]:
    slow = ["-c", "false_recovery_load", "--logging_level", "DEBUG"] if debug else []
    args = [RQ_BIN, "worker", "-w", "rq_emq.LeaseWorker", "--url", url, *slow, QUEUE]
    with open(log, "wb") as out:
        return subprocess.Popen(args, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)


class Stalls(threading.Thread):
    """The redis-server stopped for ``seconds`` every ``every`` seconds."""

    def __init__(self, server: RedisServer, every: float, seconds: float) -> None:
        super().__init__(daemon=True)
        self.server, self.every, self.seconds = server, every, seconds
        self.done = threading.Event()
        self.count = 0

    def run(self) -> None:
        while not self.done.wait(self.every):
            self.server.pause()
            try:
                time.sleep(self.seconds)
            finally:
                self.server.resume()
            self.count += 1


class LeaseAges(threading.Thread):
    """The oldest lease's age (time since its last renewal, by Redis's clock), sampled."""

    def __init__(self, url: str, settings: LeaseSettings) -> None:
        super().__init__(daemon=True)
        self.client = redis.Redis.from_url(url)
        self.settings = settings
        self.done = threading.Event()
        self.max_ms = 0
        self.samples = 0

    def run(self) -> None:
        while not self.done.wait(0.25):
            try:
                status = read_status(self.client, [QUEUE], self.settings)[0]
            except redis.RedisError:
                continue
            self.samples += 1
            if status.oldest_lease is not None:
                self.max_ms = max(self.max_ms, status.oldest_lease.age_ms)


def enqueue_ordinary(queue: Queue, lease_s: float, long_share: float) -> str:
    if random.random() < long_share:
        seconds = random.uniform(2.5, 4) * lease_s  # spans several leases and renewals
    else:
        seconds = random.uniform(0.1, 1.0)
    return str(queue.enqueue("false_recovery_load.work", seconds, job_timeout=3600).id)


def runs_of(path: Path) -> tuple[Counter[str], Counter[str], dict[str, list[float]]]:
    starts: Counter[str] = Counter()
    ends: Counter[str] = Counter()
    times: dict[str, list[float]] = {}
    if path.exists():
        for line in path.read_text().splitlines():
            what, job_id, _pid, at = line.split()
            (starts if what == "start" else ends)[job_id] += 1
            times.setdefault(job_id, []).append(float(at))
    return starts, ends, times


def main() -> int:
    defaults = LeaseSettings()
    parser = argparse.ArgumentParser()
    parser.add_argument("--duration", type=float, default=180, help="seconds of load")
    parser.add_argument("--workers", type=int, default=20)
    parser.add_argument("--debug-workers", type=int, default=5, help="of the workers, under a slow DEBUG log")
    parser.add_argument("--burners", type=int, default=2, help="processes spinning on the CPU")
    parser.add_argument("--depth", type=int, default=5, help="ordinary jobs kept waiting")
    parser.add_argument("--long-share", type=float, default=0.2, help="share of jobs spanning 2.5-4 leases")
    parser.add_argument("--gil-seconds", type=float, default=5, help="a GIL-holding job's length, unloaded")
    parser.add_argument("--slow-log-seconds", type=float, default=2, help="per record, DEBUG workers")
    parser.add_argument("--stall-every", type=float, default=30, help="seconds between Redis stalls")
    parser.add_argument("--stall-seconds", type=float, default=1)
    parser.add_argument("--drain", type=float, default=180, help="longest wait for the last jobs")
    parser.add_argument("--lease-ms", type=int, help=f"default {defaults.lease_ms}")
    parser.add_argument("--renew-ms", type=int, help="default: follows the lease")
    parser.add_argument("--sweep-ms", type=int, help="default: follows the lease and renew")
    options = parser.parse_args()
    settings = settings_from(options)
    lease_s = settings.lease_ms / 1000
    gil_n = gil_size(options.gil_seconds)
    work = Path(tempfile.mkdtemp(prefix="rq-emq-false-recoveries-"))
    runs_log, events_log = work / "runs.log", work / "events.log"
    env = {
        **worker_environ(),
        "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]),
        **env_of(settings),
        "RQ_EMQ_EVENT_HOOKS": "false_recovery_load:on_event",
        "FR_RUNS": str(runs_log),
        "FR_EVENTS": str(events_log),
        "FR_SLOW_LOG_SECONDS": str(options.slow_log_seconds),
    }
    server = RedisServer().start()
    jobs: list[str] = []
    gil_jobs: list[str] = []
    with ExitStack() as stack:
        stack.callback(server.stop)
        started = stack.enter_context(processes())
        r = redis.Redis.from_url(server.url)
        queue = Queue(QUEUE, connection=r)
        for i in range(options.workers):
            started.append(start_worker(server.url, env, work / f"worker-{i}.log", i < options.debug_workers))
        quick = options.workers - options.debug_workers
        wait_until(lambda: r.scard("rq:workers") >= quick, 120, 0.2)
        for _ in range(options.burners):
            burner = [sys.executable, "-c", "while True: pass"]
            started.append(subprocess.Popen(burner, start_new_session=True))
        ages = LeaseAges(server.url, settings)
        stalls = Stalls(server, options.stall_every, options.stall_seconds)
        ages.start()
        stalls.start()
        began = time.monotonic()
        while time.monotonic() - began < options.duration:
            if not gil_jobs or r.hget(f"rq:job:{gil_jobs[-1]}", "status") in FINAL:
                gil_jobs.append(
                    str(
                        queue.enqueue(
                            "false_recovery_load.hold_gil", gil_n, job_timeout=3600, at_front=True
                        ).id
                    )
                )
                jobs.append(gil_jobs[-1])
            while queue.count < options.depth:
                jobs.append(enqueue_ordinary(queue, lease_s, options.long_share))
            time.sleep(0.2)
        stalls.done.set()
        stalls.join()
        loaded = time.monotonic() - began

        def all_final() -> bool:
            pipe = r.pipeline(transaction=False)
            for job_id in jobs:
                pipe.hget(f"rq:job:{job_id}", "status")
            return all(status in FINAL for status in pipe.execute())

        try:
            wait_until(all_final, options.drain, 0.5)
        except TimeoutError:
            pass
        ages.done.set()
        ages.join()
        pipe = r.pipeline(transaction=False)
        for job_id in jobs:
            pipe.hget(f"rq:job:{job_id}", "status")
        statuses = Counter((s or b"gone").decode() for s in pipe.execute())
        stats = {k.decode(): int(v) for k, v in r.hgetall(QueueKeys(QUEUE).stats).items()}
    starts, ends, times = runs_of(runs_log)
    events = (
        Counter(line.split()[0] for line in events_log.read_text().splitlines())
        if events_log.exists()
        else Counter()
    )
    logs = "\n".join(p.read_text(errors="replace") for p in sorted(work.glob("worker-*.log")))
    clock_stops, watchdog_stops = logs.count(CLOCK_LINE), logs.count(WATCHDOG_LINE)
    twice = sum(1 for n in starts.values() if n > 1)
    unfinished = len(jobs) - statuses["finished"]
    others = sorted((k, v) for k, v in statuses.items() if k != "finished")
    gil_runs = [times[j][-1] - times[j][0] for j in gil_jobs if ends[j] and j in times]
    recovered = max(stats.get("recovered", 0), events["recovered"])
    rows = [
        [
            "settings",
            f"lease {settings.lease_ms} ms, renew {settings.renew_interval_ms} ms, "
            f"sweep {settings.sweep_interval_ms} ms" + (" (defaults)" if settings == LeaseSettings() else ""),
        ],
        [
            "load",
            f"{options.workers} workers ({options.debug_workers} DEBUG, "
            f"{options.slow_log_seconds:g} s a record), {options.burners} CPU burners, "
            f"{stalls.count} Redis stalls of {options.stall_seconds:g} s",
        ],
        ["duration", f"{loaded:.0f} s of load, then the drain"],
        ["jobs enqueued / finished", f"{len(jobs)} / {statuses['finished']}"],
        [
            "jobs not finished",
            f"{unfinished} ({', '.join(f'{k} {v}' for k, v in others) or '-'})",
        ],
        [
            "GIL-holding jobs run",
            f"{len(gil_runs)} (n={gil_n}, {min(gil_runs):.1f}-{max(gil_runs):.1f} s each)"
            if gil_runs
            else "0",
        ],
        ["recoveries (all false)", recovered],
        ["stall marks (marked / unmarked)", f"{stats.get('marked', 0)} / {stats.get('unmarked', 0)}"],
        [
            "leases lost (refused renewals / lease_lost events)",
            f"{stats.get('lease_lost', 0)} / {events['lease_lost']}",
        ],
        [
            "runs stopped by the local lease clock (worker / watchdog lines)",
            f"{clock_stops} / {watchdog_stops}",
        ],
        ["crashed / failed (counters)", f"{stats.get('crashed', 0)} / {stats.get('failed', 0)}"],
        ["jobs run more than once", twice],
        [
            "longest lease age seen",
            f"{ages.max_ms} ms ({ages.samples} samples; the lease is {settings.lease_ms} ms)",
        ],
    ]
    print(table(["measure", "value"], rows))
    print(f"(worker logs and the runs log: {work})")
    bad = (
        recovered
        or twice
        or unfinished
        or stats.get("lease_lost", 0)
        or events["lease_lost"]
        or clock_stops
        or watchdog_stops
    )
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
