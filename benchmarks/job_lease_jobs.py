"""Jobs of benchmarks/job_lease.py: each measures itself inside a real run (the worker runs
in the benchmark's own process, or forks its horse from it) and returns its numbers."""

from __future__ import annotations

import time
from typing import Any

import redis
from common import RoundTrips, spending
from rq import get_current_job

import rq_emq

KINDS = ("plain", "fenced")


def queue_writes(pipe: Any, prefix: str, size: int) -> None:
    """A job's own small write of ``size`` commands: one row (HSET) per command but the last
    two, a counter (INCR) and the row's expiry (EXPIRE)."""
    for row in range(size - 2):
        pipe.hset(f"{prefix}:row:{row}", mapping={"state": "done", "rows": 1234, "by": prefix})
    pipe.incr(f"{prefix}:count")
    pipe.expire(f"{prefix}:row:0", 3600)


def writes(url: str, sizes: list[int], executes: int, rounds: int) -> dict[str, Any]:
    """Each size's write through ``current_lease().fenced_pipeline()`` and through a plain
    ``pipeline(transaction=True)`` on the job's own connection, in alternating blocks of
    ``executes``: per kind and size, each ``execute()``'s latency (ns) and what Redis spent
    in each block.
    Checks that every execute of both kinds landed (its counter)."""
    lease, job = rq_emq.current_lease(), get_current_job()
    assert lease is not None and job is not None
    r = redis.Redis.from_url(url)  # for the statistics: no round trip of it counted
    pipelines = {"plain": lambda: job.connection.pipeline(transaction=True), "fenced": lease.fenced_pipeline}
    latencies: dict[str, list[int]] = {f"{kind} {size}": [] for kind in KINDS for size in sizes}
    blocks: dict[str, list[dict[str, Any]]] = {key: [] for key in latencies}
    for round_ in range(rounds + 1):  # the first one warms up, and is not kept
        for size in sizes:
            for kind in KINDS:
                key, prefix = f"{kind} {size}", f"bench:{job.id}:{kind}:{size}"
                times: list[int] = []
                with spending(r) as spent:
                    for _ in range(executes):
                        pipe = pipelines[kind]()
                        queue_writes(pipe, prefix, size)
                        started = time.perf_counter_ns()
                        pipe.execute()
                        times.append(time.perf_counter_ns() - started)
                if round_:
                    latencies[key] += times
                    blocks[key].append(vars(spent))
    for size in sizes:
        for kind in KINDS:
            assert r.get(f"bench:{job.id}:{kind}:{size}:count") == str(executes * (rounds + 1)).encode()
    return {"latencies": latencies, "blocks": blocks}


def reports(calls: int) -> dict[str, Any]:
    """``current_lease().report()`` ``calls`` times, each timed (ns); the round trips sent."""
    lease = rq_emq.current_lease()
    assert lease is not None
    return _timed(calls, lambda i: lease.report(i / calls, step="load", rows=i))


def saved_meta(calls: int) -> dict[str, Any]:
    """RQ's own way for the same record: ``job.meta`` and ``job.save_meta()``, timed (ns)."""
    job = get_current_job()
    assert job is not None

    def save(i: int) -> None:
        job.meta["progress"] = {"progress": i / calls, "step": "load", "rows": i}
        job.save_meta()

    return _timed(calls, save)


def _timed(calls: int, call: Any) -> dict[str, Any]:
    call(0)  # warm up
    trips, times = RoundTrips.count, []
    for i in range(calls):
        started = time.perf_counter_ns()
        call(i)
        times.append(time.perf_counter_ns() - started)
    return {"latencies": times, "trips": RoundTrips.count - trips}
