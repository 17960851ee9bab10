"""What keeping N jobs alive costs Redis per heartbeat tick: ours beside stock RQ.

Ours: one LeaseWorker process holding N leases, taken through the real ``pop_job``
script, each with its RQ execution. One lock-manager tick renews them all (a
``renew_leases`` EVALSHA) and sends RQ's worker and execution heartbeats, in one pipeline.

Stock RQ runs one job per worker process, so N jobs in flight means N workers, each
sending its own ``maintain_heartbeats`` pipeline (worker, execution, started-registry and
job heartbeats) every ``job_monitoring_interval``. That is modelled with N real
``rq.Worker`` objects in this process, each with its own job and execution, each calling
RQ's own ``maintain_heartbeats`` once per tick: the same commands and round trips N
processes would send, without N forks.

Per tick: round trips (counted in the client), Redis commands (INFO commandstats, those
inside scripts included), Redis time spent executing the commands clients sent (SLOWLOG
for plain commands, commandstats for scripts), Redis CPU (INFO cpu, user + sys, so
parsing and replying per round trip included; all ticks run back to back) and the
longest single command of a tick (what blocks every other client meanwhile; the median
over ticks).

    python benchmarks/renewal.py [--ticks 20] [--quick]
"""

from __future__ import annotations

import argparse
import inspect
import logging
from collections.abc import Callable
from typing import Any

import redis
from common import RoundTrips, counting_client, percentile, private_redis, table
from rq import Queue, Worker
from rq.utils import now

from rq_emq import LeaseWorker, scripts
from rq_emq.hold.lease import LockManager
from rq_emq.intake.take import Taker

QUEUE = "bench"
IGNORED = ("cmdstat_config", "cmdstat_info", "cmdstat_slowlog")


def enqueue(r: redis.Redis, n: int, name: str = QUEUE) -> None:
    queue = Queue(name, connection=r)
    for start in range(0, n, 500):
        queue.enqueue_many([Queue.prepare_data("bench_jobs.noop") for _ in range(start, min(n, start + 500))])


def ours(url: str, n: int) -> Callable[[], object]:
    """One LeaseWorker holding n leases; returns its lock manager's tick."""
    return holding(url, n).tick


def holding(
    url: str, n: int, queue: str = QUEUE, name: str = "ours", start: bool = False, **settings: Any
) -> LockManager:
    """The lock manager of one LeaseWorker holding n leases, each with its RQ execution
    (not started: the caller ticks it); its client counts round trips. With ``start``,
    each job is also started as its horse starts it (RQ's ``prepare_job_execution``,
    guarded: status ``started``); ``settings`` are the worker's lease settings."""
    r = redis.Redis.from_url(url)
    enqueue(r, n, queue)
    scripts.load_all(r)
    w = LeaseWorker([queue], connection=r, name=name, **settings)
    w.register_birth()
    w._taker = Taker(r, w.name, w.lease_settings)
    w.lock_manager = w._new_lock_manager(counting_client(url))  # as bootstrap builds it
    for _ in range(n):
        taken = w._take(None)
        assert taken is not None
        job, _queue = taken
        job.started_at = now()
        w.prepare_execution(job)
        if start:
            w.prepare_job_execution(job)
    assert len(w.lock_manager.held()) == n
    return w.lock_manager


def stock(url: str, n: int) -> Callable[[], object]:
    """n rq.Workers, one job each (as n processes would hold them); returns one tick of all."""
    r = redis.Redis.from_url(url)
    enqueue(r, n)
    client = counting_client(url)
    queue = Queue(QUEUE, connection=client)
    held: list[tuple[Any, Any, Any]] = []
    for i in range(n):
        w = Worker([queue], connection=client, name=f"stock-{i}")
        w.register_birth()
        job_id = r.lpop(queue.key)
        assert job_id is not None
        job = queue.fetch_job(job_id.decode())
        assert job is not None
        job.started_at = now()
        execution = w.prepare_execution(job)
        held.append((w, job, execution))

    with_execution = len(inspect.signature(Worker.maintain_heartbeats).parameters) > 2  # RQ >= 2.1

    def tick() -> None:
        for w, job, execution in held:
            if with_execution:
                w.maintain_heartbeats(job, execution)
            else:  # RQ 2.0 keeps the execution on the worker
                w.maintain_heartbeats(job)

    return tick


def top_level(r: redis.Redis) -> list[tuple[bytes, int]]:
    """SLOWLOG entries of commands clients sent (not those run inside a script)."""
    entries = r.slowlog_get(1_000_000)
    skip = (b"CONFIG", b"SLOWLOG", b"INFO")
    return [
        (e["command"].split(b" ")[0].upper(), int(e["duration"]))
        for e in entries
        if e["client_address"] != b"?:0" and e["command"].split(b" ")[0].upper() not in skip
    ]


def measure(r: redis.Redis, tick: Callable[[], object], ticks: int) -> dict[str, float]:
    tick()  # warm up: the client connects on its first tick
    # pass 1, no SLOWLOG (its bookkeeping costs time itself): round trips, commands, CPU,
    # and the scripts' own time
    r.config_set("slowlog-log-slower-than", -1)
    r.config_set("slowlog-max-len", 1_000_000)
    r.config_resetstat()
    cpu0 = r.info("cpu")
    RoundTrips.count = 0
    for _ in range(ticks):
        tick()
    trips = RoundTrips.count
    cpu1 = r.info("cpu")
    stats = r.info("commandstats")
    commands = sum(v["calls"] for k, v in stats.items() if k not in IGNORED)
    script_usec = stats.get("cmdstat_evalsha", {"usec": 0})["usec"]
    cpu = sum(cpu1[k] - cpu0[k] for k in ("used_cpu_user", "used_cpu_sys"))
    # pass 2: every command a client sent, timed inside Redis (scripts from pass 1, since
    # SLOWLOG would also log, and slow down, every command a script runs)
    r.slowlog_reset()
    r.config_set("slowlog-log-slower-than", 0)
    for _ in range(ticks):
        tick()
    r.config_set("slowlog-log-slower-than", -1)
    sent = [(name, usec) for name, usec in top_level(r) if name != b"EVALSHA"]
    # pass 3: each tick's longest single command (only slow ones logged, so scripts run at
    # speed); the median over ticks, since a shared machine sometimes deschedules Redis
    # mid-command and SLOWLOG times wall-clock
    longest_per_tick = []
    for _ in range(ticks):
        r.slowlog_reset()
        r.config_set("slowlog-log-slower-than", 50)
        tick()
        r.config_set("slowlog-log-slower-than", -1)
        longest_per_tick.append(max((usec for _name, usec in top_level(r)), default=0))
    longest = percentile(longest_per_tick, 50)
    return {
        "trips": trips / ticks,
        "commands": commands / ticks,
        "usec": (script_usec + sum(usec for _name, usec in sent)) / ticks,
        "cpu_usec": cpu * 1e6 / ticks,
        "longest": longest,
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--ticks", type=int, default=20)
    parser.add_argument("--sizes", default="1,10,100,1000", help="leases held, comma separated")
    parser.add_argument("--quick", action="store_true")
    options = parser.parse_args()
    sizes = [int(s) for s in options.sizes.split(",")]
    if options.quick:
        sizes, options.ticks = [1, 10], 2
    logging.disable(logging.WARNING)
    rows = []
    with private_redis() as url:
        r = redis.Redis.from_url(url)
        for n in sizes:
            measured = {}
            for kind, build in (("stock", stock), ("ours", ours)):
                r.flushdb()
                measured[kind] = measure(r, build(url, n), options.ticks)
            s, o = measured["stock"], measured["ours"]
            for kind, m in (("rq.Worker x N", s), ("rq_emq LockManager", o)):
                rows.append(
                    [
                        n,
                        kind,
                        f"{m['trips']:.0f}",
                        f"{m['commands']:.0f}",
                        f"{m['usec']:.0f}",
                        f"{m['cpu_usec']:.0f}",
                        f"{m['longest']:.0f}" if m["longest"] > 50 else "< 50",
                        "" if m is s else f"{o['cpu_usec'] / s['cpu_usec']:.2f}",
                    ]
                )
    print(
        table(
            [
                "leases",
                "heartbeat",
                "round trips/tick",
                "Redis cmds/tick",
                "Redis usec/tick",
                "Redis CPU usec/tick",
                "longest command usec (p50 of ticks)",
                "CPU ratio",
            ],
            rows,
        )
    )


if __name__ == "__main__":
    main()
