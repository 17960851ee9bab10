"""What the job's own lease costs (``rq_emq.current_lease()``): a fenced write beside a plain
pipeline, and ``report()`` beside RQ's ``save_meta()``, on the job's side and on the lock
manager's tick.

1. Fenced write: a job's small write (an HSET, an INCR, an EXPIRE) and a batch of 20 commands,
   through ``current_lease().fenced_pipeline()`` (one ``guard_job_write`` EVALSHA) and
   through a plain ``pipeline(transaction=True)`` (MULTI/EXEC) on the same connection, in
   alternating blocks. The job runs in a real ``SimpleLeaseWorker`` (taken by the real
   take script, its start fenced as in any run, ``current_lease()`` built by the worker's
   ``perform_job``) working in this process, so that the job counts its round trips with
   this process's counting client; a forked horse runs the same code on the same kind of
   connection. Per ``execute()``: latency (client wall time, only the ``execute()``), round
   trips, Redis commands (INFO commandstats, those inside the script and the transaction
   included), Redis time in the EVALSHA or MULTI/EXEC (commandstats; the commands inside
   included) and Redis CPU (INFO cpu, user + sys: parsing and replying included).
   A job with its own max attempts (``meta=rq_emq.max_attempts(n)``) has its own row.
2. ``report()`` on the job's side: µs per call in a ``SimpleLeaseWorker`` (kept in the
   process, for its lock manager) and in a ``LeaseWorker``'s horse (written to the memory it
   shares with its worker); beside it RQ's way of keeping progress, ``job.meta`` and
   ``job.save_meta()``, in a stock ``rq.SimpleWorker`` and in a ``SimpleLeaseWorker``
   (where it is a fenced write).
3. ``report()`` on the lock manager's tick: one LeaseWorker's lock manager holding N leases,
   each with its RQ execution (as benchmarks/renewal.py builds it), ticked with no report
   pending, with a new report on every lease posted in the process, and with one posted
   in horse memory (what a forking worker's tick reads). Per tick: round trips, Redis
   commands, Redis time in the renew scripts, Redis CPU, the tick's latency (the lock
   manager's thread: building the pipeline, the round trip, reading the replies). The
   tick that also stamps RQ's ``last_heartbeat`` (once per 30 s) is left out.

Variants alternate in rounds on one private redis-server, so a busy moment of a shared
machine falls on each alike.

    python benchmarks/job_lease.py [--executes 300] [--rounds 8] [--calls 10000] [--ticks 10] [--quick]
"""

from __future__ import annotations

import argparse
import logging
import math
import time
from collections.abc import Sequence
from statistics import median
from typing import Any

import redis
from common import Spent, counting_client, percentile, private_redis, spending, table
from renewal import holding
from rq import Queue, SimpleWorker

import rq_emq
from rq_emq import LeaseWorker, SimpleLeaseWorker
from rq_emq.hold.lease import LockManager
from rq_emq.run.horse_fence import HorseDeadline
from rq_emq.run.job_lease import encode_report

QUEUE = "bench"
#: No renewal nor sweep while a job measures itself (the lease outlives every run here).
LEASE_MS = 3_600_000
SOURCES = ("none", "posted in process", "posted in horse memory")


def run_jobs(
    url: str, worker_class: type[Any], calls: Sequence[tuple[str, tuple[Any, ...], dict[str, Any]]]
) -> list[Any]:
    """Run the jobs in one burst of a worker working in this process; their return values."""
    r = redis.Redis.from_url(url)
    queue = Queue(QUEUE, connection=r)
    jobs = [
        queue.enqueue(f"job_lease_jobs.{name}", *args, job_timeout=1800, **kw) for name, args, kw in calls
    ]
    settings = {"lease_ms": LEASE_MS} if issubclass(worker_class, rq_emq.LeaseMixin) else {}
    worker_class([QUEUE], connection=counting_client(url), **settings).work(burst=True, logging_level="ERROR")
    for job in jobs:
        assert job.get_status(refresh=True) == "finished", (job.func_name, job.latest_result())
    return [job.return_value() for job in jobs]


def us(values: Sequence[float], p: float) -> float:
    return percentile(values, p) / 1000


def ratio(value: float, base: float) -> str:
    return f"{value / base:.2f}" if base else ""


def per_unit(blocks: Sequence[Spent], units: int) -> Spent:
    """Per unit (an execute, a tick) of blocks of ``units`` each: round trips and commands
    on average (they never vary), Redis time and CPU the median of the blocks' averages (a
    busy machine deschedules Redis now and then, and its wall-clock timings with it)."""
    return Spent(
        trips=sum(b.trips for b in blocks) / (units * len(blocks)),
        commands=sum(b.commands for b in blocks) / (units * len(blocks)),
        unit_usec=median(b.unit_usec / units for b in blocks),
        cpu_usec=median(b.cpu_usec / units for b in blocks),
    )


# -- 1. a fenced write beside a plain pipeline ------------------------------------------------
def writes(url: str, executes: int, rounds: int) -> str:
    sizes = [3, 20]
    plain, own_max = run_jobs(
        url,
        SimpleLeaseWorker,
        [
            ("writes", (url, sizes, executes, rounds), {}),
            ("writes", (url, [3], executes, rounds), {"meta": rq_emq.max_attempts(5)}),
        ],
    )
    rows = []
    for size, measured, what in [(3, plain, ""), (20, plain, ""), (3, own_max, ", job with max_attempts")]:
        base: dict[str, float] = {}
        for kind, label in (("plain", "plain MULTI/EXEC"), ("fenced", "fenced_pipeline()")):
            times = measured["latencies"][f"{kind} {size}"]
            blocks = [Spent(**b) for b in measured["blocks"][f"{kind} {size}"]]
            spent, p50 = per_unit(blocks, len(times) // len(blocks)), us(times, 50)
            base = base or {"p50": p50, "cpu": spent.cpu_usec}
            fenced = kind == "fenced"
            rows.append(
                [
                    f"{size}{what}",
                    label,
                    f"{p50:.0f}",
                    f"{us(times, 99):.0f}",
                    f"{spent.trips:.2f}",
                    f"{spent.commands:.1f}",
                    f"{spent.unit_usec:.1f}",
                    f"{spent.cpu_usec:.0f}",
                    ratio(p50, base["p50"]) if fenced else "",
                    ratio(spent.cpu_usec, base["cpu"]) if fenced else "",
                ]
            )
    return table(
        [
            "commands",
            "pipeline",
            "execute p50 µs",
            "p99 µs",
            "round trips/execute",
            "Redis cmds/execute",
            "Redis µs/execute",
            "Redis CPU µs/execute",
            "p50 ratio",
            "CPU ratio",
        ],
        rows,
    )


# -- 2. report() on the job's side ------------------------------------------------------------
def report_calls(url: str, calls: int) -> str:
    (stock,) = run_jobs(url, SimpleWorker, [("saved_meta", (calls,), {})])
    fenced_meta, in_process = run_jobs(
        url, SimpleLeaseWorker, [("saved_meta", (calls,), {}), ("reports", (calls,), {})]
    )
    (in_horse,) = run_jobs(url, LeaseWorker, [("reports", (calls,), {})])
    measured = [
        ("`job.meta` + `save_meta()`", "rq.SimpleWorker", stock),
        ("`job.meta` + `save_meta()`", "SimpleLeaseWorker (a fenced write)", fenced_meta),
        ("`current_lease().report()`", "SimpleLeaseWorker (kept in process)", in_process),
        ("`current_lease().report()`", "LeaseWorker horse (shared memory)", in_horse),
    ]
    base = us(stock["latencies"], 50)
    rows = [
        [
            how,
            where,
            f"{us(m['latencies'], 50):.1f}",
            f"{us(m['latencies'], 99):.1f}",
            f"{m['trips'] / len(m['latencies']):.2f}",
            "" if m is stock else ratio(us(m["latencies"], 50), base),
        ]
        for how, where, m in measured
    ]
    return table(
        ["the job keeps its progress", "worker", "µs/call p50", "p99", "round trips/call", "p50 ratio"], rows
    )


# -- 3. report() on the lock manager's tick ---------------------------------------------------
class Holder:
    """A lock manager holding N leases, each with horse memory beside it, fed reports."""

    def __init__(self, url: str, n: int) -> None:
        self.manager: LockManager = holding(url, n)
        self.leases = self.manager.held()
        self.memories = [HorseDeadline() for _ in self.leases]
        self.posted = 0

    def use(self, source: str) -> None:
        """Reports from now on come from ``source`` (none: nothing is pending)."""
        for lease, memory in zip(self.leases, self.memories, strict=True):
            lease.report_source = memory.read_report if source == SOURCES[2] else None
            # a lease reads one source in a real run; numbered anew here on each switch
            lease.report_sent, lease._posted = 0, None
            memory.reset(math.inf)

    def post(self, source: str) -> None:
        """Before a tick (not timed): a new report on every lease, from ``source``."""
        self.posted += 1
        text = encode_report(round(self.posted / 1000, 3), {"step": "load", "rows": self.posted})
        for lease, memory in zip(self.leases, self.memories, strict=True):
            if source == SOURCES[1]:
                lease.post_report(text)
            elif source == SOURCES[2]:
                memory.post_report(text)
        # the measured ticks leave RQ's last_heartbeat alone (a tick stamps it once per 30 s)
        self.manager._job_heartbeat_at = time.monotonic()

    def landed(self, source: str) -> bool:
        """Every report posted went with this tick's renewal (none is pending any more)."""
        return source == SOURCES[0] or all(lease.pending_report() is None for lease in self.leases)

    def in_redis(self, r: redis.Redis) -> bool:
        """Each lease's last report is the one on its job hash (``emq_report``)."""
        with r.pipeline(transaction=False) as pipe:
            for lease in self.leases:
                pipe.hget(lease.keys.job(lease.job_id), "emq_report")
            found = pipe.execute()
        return found == [(lease.last_report or "").encode() for lease in self.leases]


def tick_costs(r: redis.Redis, holder: Holder, ticks: int, rounds: int) -> dict[str, tuple[Spent, list[int]]]:
    """Per source of reports: what Redis spent per tick, and each tick's latency (ns)."""
    blocks: dict[str, list[Spent]] = {source: [] for source in SOURCES}
    times: dict[str, list[int]] = {source: [] for source in SOURCES}
    holder.manager.tick()  # warm up: the client connects, RQ's heartbeat stamped
    for _ in range(rounds):
        for source in SOURCES:
            holder.use(source)
            with spending(r) as spent:
                for _ in range(ticks):
                    holder.post(source)
                    started = time.perf_counter_ns()
                    lost = holder.manager.tick()
                    times[source].append(time.perf_counter_ns() - started)
                    assert not lost and holder.landed(source), source
            blocks[source].append(spent)
    assert holder.in_redis(r)
    return {source: (per_unit(blocks[source], ticks), times[source]) for source in SOURCES}


def tick_table(url: str, sizes: list[int], ticks: int, rounds: int) -> str:
    r = redis.Redis.from_url(url)
    rows = []
    for n in sizes:
        r.flushdb()
        measured = tick_costs(r, Holder(url, n), ticks, rounds)
        base, base_times = measured[SOURCES[0]]
        for source, (spent, times) in measured.items():
            first = source == SOURCES[0]
            assert spent.trips == 1, (source, spent.trips)  # one round trip per tick, whatever it carries
            rows.append(
                [
                    n,
                    source,
                    f"{spent.trips:.0f}",
                    f"{spent.commands:.0f}",
                    f"{spent.unit_usec:.0f}",
                    f"{spent.cpu_usec:.0f}",
                    f"{us(times, 50):.0f}",
                    f"{us(times, 99):.0f}",
                    "" if first else ratio(spent.commands, base.commands),
                    "" if first else ratio(spent.unit_usec, base.unit_usec),
                    "" if first else ratio(spent.cpu_usec, base.cpu_usec),
                    "" if first else ratio(us(times, 50), us(base_times, 50)),
                ]
            )
    return table(
        [
            "leases",
            "report on every lease",
            "round trips/tick",
            "Redis cmds/tick",
            "script µs/tick",
            "Redis CPU µs/tick",
            "tick p50 µs",
            "p99 µs",
            "cmds ratio",
            "script ratio",
            "CPU ratio",
            "p50 ratio",
        ],
        rows,
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--executes", type=int, default=300, help="executes per block of the write table")
    parser.add_argument("--rounds", type=int, default=8, help="alternating blocks per variant")
    parser.add_argument("--calls", type=int, default=10_000, help="report() and save_meta() calls")
    parser.add_argument("--sizes", default="1,100,1000", help="leases held, comma separated")
    parser.add_argument("--ticks", type=int, default=10, help="ticks per block of the tick table")
    parser.add_argument("--quick", action="store_true")
    options = parser.parse_args()
    sizes = [int(s) for s in options.sizes.split(",")]
    if options.quick:
        options.executes, options.rounds, options.calls, options.ticks, sizes = 20, 1, 200, 2, [1, 10]
    logging.disable(logging.WARNING)
    with private_redis() as url:
        sections = [
            (
                "A fenced write beside a plain pipeline, per execute()",
                writes(url, options.executes, options.rounds),
            ),
            ("report() on the job's side, per call", report_calls(url, options.calls)),
            ("report() on the lock manager's tick", tick_table(url, sizes, options.ticks, options.rounds)),
        ]
    print("\n\n".join(f"{title}\n\n{text}" for title, text in sections))


if __name__ == "__main__":
    main()
