"""A fleet of idle workers: what one job costs Redis as the fleet grows, ours beside stock RQ.

Real ``rq worker`` processes (N = 1, 10, 50, 200 by default, started in batches) on one
queue and on three, ``rq_emq.LeaseWorker`` and stock ``rq.Worker``, one private
redis-server. Per N:

- idle Redis commands per second per worker (every worker blocked, nothing pushed), and
  what that idle rate adds to each job of the trickle below (it depends on the trickle's
  pace, not on the job: a share of the per-job count, shown apart);
- under a trickle (one job at a time into the last queue, every worker idle before each
  push): Redis commands and Lua calls per job (the producer's enqueue included), the
  waiting's own share (BLMOVE/BLPOP and CLIENT UNBLOCK per job), Redis CPU per job
  (INFO cpu, user + sys, less the benchmark's own commands' time), pick-up latency
  (enqueue to ``started_at``) p50/p95;
- connections per worker (CLIENT LIST while idle).

The benchmark's own polling uses commands no worker sends (CLIENT LIST, INFO, HSTRLEN)
and those are left out of the counts.

    python benchmarks/fleet.py [--ns 1 10 50 200] [--jobs 30] [--idle-seconds 20] [--quick]
                               [--queues 1 3] [--workers both|ours|stock]
                               [--worker-env RQ_EMQ_...=...]
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from datetime import datetime

import redis
from common import HERE, OURS, RQ_BIN, STOCK, percentile, private_redis, table, wait_until, worker_environ
from rq import Queue

from rq_emq.keys import sweeper_election_key, watch_key

#: The benchmark's own commands (no worker sends them): left out of every count.
OWN = ("cmdstat_info", "cmdstat_client|list", "cmdstat_hstrlen", "cmdstat_config|resetstat")
LUA = ("cmdstat_evalsha", "cmdstat_eval", "cmdstat_evalsha_ro", "cmdstat_eval_ro")
#: The waiting itself: blocking pops and moves, and our cancels of the waits a push did not serve.
WAITS = ("cmdstat_blmove", "cmdstat_blpop", "cmdstat_blmpop", "cmdstat_brpoplpush", "cmdstat_client|unblock")
BATCH = 10  # workers started at a time: 200 Python processes at once would stall a small machine


class Fleet:
    """Worker processes of one class on one set of queues, grown on demand."""

    def __init__(
        self, url: str, r: redis.Redis, worker_class: str, queues: Sequence[str], env: dict[str, str]
    ) -> None:
        self.url, self.r, self.worker_class, self.queues = url, r, worker_class, list(queues)
        self.processes: list[subprocess.Popen[bytes]] = []
        #: blocked clients when every worker waits (None: not known for this fleet size)
        self._expected_blocked: int | None = None
        path = os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")])
        self.env = {**worker_environ(), "PYTHONPATH": path, **env}

    def idle(self) -> int:
        """Workers idle now. Stock RQ's: blocked in its BLPOP (or BLMOVE). Ours on one queue:
        blocked in its BLMOVE; on several: the set's watcher (holding the watch, nothing left
        in the wake list to hand on) and the standbys blocked in BLPOP on the wake list
        (rq_emq/intake/watch.py)."""
        listed = self.r.client_list()

        def blocked(*commands: str) -> int:
            return sum(c.get("cmd") in commands and "b" in str(c.get("flags")) for c in listed)

        if self.worker_class != OURS:
            return blocked("blpop", "blmove")
        if len(self.queues) == 1:
            return blocked("blmove")
        watch = watch_key(sweeper_election_key(self.queues))
        watcher = bool(self.r.exists(watch)) and not self.r.exists(watch.replace(":watch", ":wake"))
        return blocked("blpop") + int(watcher)

    def all_idle(self) -> bool:
        return self.idle() == len(self.processes)

    def blocked_clients(self) -> int:
        return int(self.r.info("clients")["blocked_clients"])

    def settle(self) -> None:
        """Wait until every worker waits again. CLIENT LIST says it exactly, but its reply
        grows with the connections (300 KB at 1,000), and writing it out costs Redis CPU
        that INFO commandstats does not give to the command: polled after every job, it
        made a fleet with more connections look costlier per job. So the count of blocked
        clients (INFO, a small reply) is compared with the one read when CLIENT LIST last
        said every worker waits (queue waits and line waits alike); CLIENT LIST again only
        when that count is not back within a second (a standby that left the line)."""
        expected = self._expected_blocked
        if expected is not None:
            try:
                wait_until(lambda: self.blocked_clients() == expected, 1.0, interval=0.005)
                return
            except TimeoutError:
                pass
        wait_until(self.all_idle, 30, interval=0.02)
        self._expected_blocked = self.blocked_clients()

    def grow(self, n: int) -> None:
        self._expected_blocked = None
        while len(self.processes) < n:
            for _ in range(min(BATCH, n - len(self.processes))):
                args = [RQ_BIN, "worker", "-w", self.worker_class, "--url", self.url, "-q", *self.queues]
                self.processes.append(
                    subprocess.Popen(
                        args,
                        env=self.env,
                        stdout=subprocess.DEVNULL,
                        stderr=subprocess.DEVNULL,
                        start_new_session=True,
                    )
                )
            wait_until(self.all_idle, timeout=120, interval=0.2)

    def stop(self) -> None:
        for process in self.processes:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
        for process in self.processes:
            process.wait()
        self.processes.clear()


def counters(r: redis.Redis) -> tuple[int, int, int, float]:
    """(commands, Lua calls, wait commands, Redis CPU seconds) so far, the benchmark's own
    commands left out: the CPU is the server's (INFO cpu, user + sys) less the time INFO
    commandstats gives the benchmark's own commands (its CLIENT LIST polling costs more
    the more connections the fleet holds)."""
    stats = r.info("commandstats")
    cpu = r.info("cpu")
    commands = sum(v["calls"] for k, v in stats.items() if k not in OWN)
    lua = sum(stats.get(k, {}).get("calls", 0) for k in LUA)
    waits = sum(stats.get(k, {}).get("calls", 0) for k in WAITS)
    own_s = sum(v["usec"] for k, v in stats.items() if k in OWN) / 1e6
    return commands, lua, waits, float(cpu["used_cpu_user"]) + float(cpu["used_cpu_sys"]) - own_s


def _when(value: bytes | None) -> float:
    text = (value or b"").decode().rstrip("Z")
    return datetime.fromisoformat(text).timestamp()


def measure(fleet: Fleet, n: int, jobs: int, idle_seconds: float) -> list[object]:
    r = fleet.r
    fleet.grow(n)
    time.sleep(1.0)
    connections = (len(r.client_list()) - 1) / n  # less the benchmark's own
    before = counters(r)
    time.sleep(idle_seconds)
    idle = (counters(r)[0] - before[0]) / idle_seconds / n

    target = Queue(fleet.queues[-1], connection=r)  # the last queue: looked at last
    ids = []
    fleet.settle()  # reads the blocked count that means "all waiting", before counting starts
    start = counters(r)
    began = time.monotonic()
    for _ in range(jobs):
        time.sleep(random.uniform(0.05, 0.15))
        job = target.enqueue("bench_jobs.noop")
        ids.append(job.id)
        wait_until(lambda key=job.key: r.hstrlen(key, "status") == len("finished"), 30, interval=0.002)
        fleet.settle()
    end = counters(r)
    elapsed = time.monotonic() - began
    latencies = []
    for job_id in ids:
        enqueued, started = r.hmget(f"rq:job:{job_id}", "enqueued_at", "started_at")
        latencies.append((_when(started) - _when(enqueued)) * 1000)
    per_job = [(e - s) / jobs for s, e in zip(start, end, strict=True)]
    return [
        len(fleet.queues),
        n,
        "stock rq.Worker" if fleet.worker_class == STOCK else "LeaseWorker",
        f"{idle:.2f}",
        f"{per_job[0]:.1f}",
        f"{idle * n * elapsed / jobs:.1f}",
        f"{per_job[1]:.1f}",
        f"{per_job[2]:.1f}",
        f"{per_job[3] * 1e6:.0f}",
        f"{connections:.1f}",
        f"{percentile(latencies, 50):.1f}",
        f"{percentile(latencies, 95):.1f}",
    ]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--ns", type=int, nargs="+", default=[1, 10, 50, 200])
    parser.add_argument("--jobs", type=int, default=30)
    parser.add_argument("--idle-seconds", type=float, default=20.0)
    parser.add_argument("--queues", type=int, nargs="+", default=[1, 3], choices=[1, 3])
    parser.add_argument("--quick", action="store_true", help="N <= 10, a few jobs: shows the script works")
    parser.add_argument("--workers", choices=["both", "ours", "stock"], default="both")
    parser.add_argument(
        "--worker-env",
        nargs="*",
        default=[],
        metavar="NAME=VALUE",
        help="settings for every worker, e.g. RQ_EMQ_SWEEP_INTERVAL_MS=60000 to set idle sweeps aside",
    )
    options = parser.parse_args()
    worker_env = dict(item.split("=", 1) for item in options.worker_env)
    if options.quick:
        options.ns, options.jobs, options.idle_seconds = [1, 5], 5, 2.0
    rows = []
    with private_redis() as url:
        r = redis.Redis.from_url(url)
        for count in options.queues:
            queues = ["q0", "q1", "q2"][:count]
            classes = {"both": (STOCK, OURS), "ours": (OURS,), "stock": (STOCK,)}[options.workers]
            for worker_class in classes:
                r.flushdb()
                fleet = Fleet(url, r, worker_class, queues, worker_env)
                try:
                    for n in sorted(options.ns):
                        rows.append(measure(fleet, n, options.jobs, options.idle_seconds))
                        print(" | ".join(map(str, rows[-1])), file=sys.stderr, flush=True)
                finally:
                    fleet.stop()
    headers = [
        "queues",
        "idle workers",
        "worker",
        "idle cmds/s per worker",
        "cmds per job",
        "of which idle fleet's",
        "Lua calls per job",
        "wait cmds per job",
        "Redis CPU µs per job",
        "connections per worker",
        "pick-up p50 ms",
        "pick-up p95 ms",
    ]
    print(table(headers, rows))


if __name__ == "__main__":
    main()
