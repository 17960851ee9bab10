"""What idle workers cost Redis: commands per second per idle worker, ours beside stock RQ.

N idle ``rq worker`` processes (N = 1, 10, 50) on 1 and on 3 queues, nothing enqueued.
Once every worker has registered and run its start-up round, ``CONFIG RESETSTAT``, wait,
then ``INFO commandstats`` (which counts the commands run inside our scripts too) gives
Redis commands per second per worker, split by what they are for:

- sweep: the stalled sweep and its fleet-wide election (``EVALSHA`` and what runs inside
  the sweep script, ``EXISTS``, the election's ``SET``/``GET``/``PEXPIRE``);
- wake: how an idle multi-queue worker learns of a push (``CLIENT TRACKING`` re-arms,
  its ``PING``s, ``BLMOVE`` timeouts): owned by the wake/wait design, counted apart;
- other: the rest (RQ's own heartbeats and maintenance).

    python benchmarks/idle_cost.py [--quick] [--seconds 60] [--workers 1 10 50]
"""

from __future__ import annotations

import argparse
import time
from contextlib import ExitStack

import redis
from common import STOCK, private_redis, table, wait_until, worker

OURS = "rq_emq.LeaseWorker"
IGNORED = ("config", "info")
#: Commands an idle worker sends to learn of a push (its wait), not to sweep.
WAKE = {"client|tracking", "client", "ping", "blmove", "blpop", "brpoplpush", "lmove", "subscribe", "hello"}
#: Commands of the sweep and of its election (ours only; stock sends none of them).
SWEEP = {
    "evalsha",
    "eval",
    "exists",
    "set",
    "get",
    "pexpire",
    "zrangebyscore",
    "zcount",
    "lrange",
    "zcard",
    "script|load",
    "script",
}


def commandstats(r: redis.Redis) -> dict[str, int]:
    stats = r.info("commandstats")
    return {
        name.removeprefix("cmdstat_"): int(value["calls"])
        for name, value in stats.items()
        if not name.removeprefix("cmdstat_").startswith(IGNORED)
    }


def measure(url: str, worker_class: str, workers: int, queues: list[str], seconds: float) -> dict[str, float]:
    """Commands per second per idle worker, by command name."""
    r = redis.Redis.from_url(url)
    r.flushdb()
    with ExitStack() as stack:
        for _ in range(workers):
            stack.enter_context(worker(url, worker_class, queues))
        wait_until(lambda: r.scard("rq:workers") >= workers, timeout=60 + 2 * workers, interval=0.2)
        time.sleep(3)  # every worker's start-up round is over
        r.config_resetstat()
        time.sleep(seconds)
        calls = commandstats(r)
        alive = r.scard("rq:workers")
    assert alive == workers, f"{workers - alive} worker(s) died during the measurement"
    return {name: count / seconds / workers for name, count in calls.items()}


def split(per_name: dict[str, float]) -> tuple[float, float, float, float]:
    sweep = sum(v for k, v in per_name.items() if k in SWEEP)
    wake = sum(v for k, v in per_name.items() if k in WAKE)
    total = sum(per_name.values())
    return total, sweep, wake, total - sweep - wake


def top(per_name: dict[str, float], n: int = 6) -> str:
    ranked = sorted(per_name.items(), key=lambda kv: -kv[1])[:n]
    return " ".join(f"{k}={v:.3f}" for k, v in ranked if v > 0) or "-"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="N = 1 and 3, 10 s each: only shows it runs")
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 10, 50])
    parser.add_argument("--queues", type=int, nargs="+", default=[1, 3])
    parser.add_argument("--ours-only", action="store_true", help="skip stock rq.Worker")
    options = parser.parse_args()
    seconds = 10.0 if options.quick else options.seconds
    sizes = [1, 3] if options.quick else options.workers
    classes = [OURS] if options.ours_only else [STOCK, OURS]
    rows = []
    with private_redis() as url:
        for queue_count in options.queues:
            queues = [f"q{i}" for i in range(queue_count)]
            for n in sizes:
                for worker_class in classes:
                    per_name = measure(url, worker_class, n, queues, seconds)
                    total, sweep, wake, other = split(per_name)
                    rows.append(
                        [
                            queue_count,
                            n,
                            "ours" if worker_class == OURS else "stock",
                            f"{total:.3f}",
                            f"{sweep:.3f}",
                            f"{wake:.3f}",
                            f"{other:.3f}",
                            top(per_name),
                        ]
                    )
                    print(" | ".join(map(str, rows[-1])), flush=True)
    print()
    print(f"Idle Redis commands per second per worker, over {seconds:.0f} s (INFO commandstats)")
    print(
        table(
            ["queues", "N", "worker", "total/s", "sweep/s", "wake/s", "other/s", "by command (per worker/s)"],
            rows,
        )
    )


if __name__ == "__main__":
    main()
