"""Shared pieces of the benchmarks: a private redis-server, worker processes, a table."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import redis
from redis.connection import Connection

from rq_emq.testing import private_redis

__all__ = [
    "private_redis",
    "table",
    "percentile",
    "wait_until",
    "worker",
    "counting_client",
    "RoundTrips",
    "Spent",
    "spending",
]

HERE = Path(__file__).resolve().parent
RQ_BIN = str(Path(sys.executable).parent / "rq")
STOCK = "rq.Worker"
OURS = "rq_emq.LeaseWorker"


class RoundTrips:
    """Requests a client sent: one per single command, one per pipeline (redis-py writes a
    whole pipeline in one ``send_packed_command``), so each is one round trip."""

    count = 0


class _CountingConnection(Connection):
    def send_packed_command(self, command: object, check_health: bool = True) -> None:
        RoundTrips.count += 1
        super().send_packed_command(command, check_health)  # type: ignore[arg-type]


def counting_client(url: str) -> redis.Redis:
    """A client whose round trips add to :attr:`RoundTrips.count`."""
    kwargs = redis.ConnectionPool.from_url(url).connection_kwargs
    return redis.Redis(connection_pool=redis.ConnectionPool(connection_class=_CountingConnection, **kwargs))


#: What a benchmark's own measuring sends (INFO, CONFIG RESETSTAT, SLOWLOG): never counted.
MEASURING = ("cmdstat_config", "cmdstat_info", "cmdstat_slowlog")
#: What a client sends as one unit: a transaction, a script. Redis times such a command with
#: the commands run inside it (which commandstats counts again, each on its own).
UNITS = ("cmdstat_multi", "cmdstat_exec", "cmdstat_eval", "cmdstat_evalsha")


@dataclass
class Spent:
    """What Redis did over one span of a benchmark: the round trips this process sent
    (through its counting clients), the commands Redis ran (those inside transactions and
    scripts included), Redis' time in MULTI/EXEC and scripts (the commands inside them
    included; other commands a client sent on their own are not in it) and Redis CPU
    (``INFO cpu``, user + sys: parsing and replying included, and whatever else Redis did)."""

    trips: float = 0
    commands: float = 0
    unit_usec: float = 0
    cpu_usec: float = 0


@contextmanager
def spending(r: redis.Redis) -> Iterator[Spent]:
    """What Redis does during the block, filled in as it ends. ``r`` should be a client that
    does not count its round trips (its INFO and CONFIG calls are not the block's). Resets
    Redis' command statistics."""
    r.config_resetstat()
    cpu, trips = r.info("cpu"), RoundTrips.count
    spent = Spent()
    yield spent
    spent.trips = RoundTrips.count - trips
    cpu_after, stats = r.info("cpu"), r.info("commandstats")
    spent.commands = sum(v["calls"] for k, v in stats.items() if not k.startswith(MEASURING))
    spent.unit_usec = sum(v["usec"] for k, v in stats.items() if k in UNITS)
    spent.cpu_usec = sum(cpu_after[k] - cpu[k] for k in ("used_cpu_user", "used_cpu_sys")) * 1e6


def wait_until(predicate: Callable[[], object], timeout: float, interval: float = 0.01) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError("benchmark setup timed out")
        time.sleep(interval)


def worker_environ() -> dict[str, str]:
    """The environment a benchmarked worker starts in: this one, less
    ``PYTHONDONTWRITEBYTECODE``. With it set (some shells and containers set it), every
    worker compiled its modules from source at each start, as no deployment does: it added
    some 0.2 s of CPU to a start of ours and 0.1 s to stock's, which a burst with start-up
    included counted as throughput."""
    return {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}


@contextmanager
def worker(
    url: str, worker_class: str, queues: Sequence[str], burst: bool = False, env: dict[str, str] | None = None
) -> Iterator[subprocess.Popen[bytes]]:
    args = [
        RQ_BIN,
        "worker",
        "-w",
        worker_class,
        "--url",
        url,
        "-q",
        *(["--burst"] if burst else []),
        *queues,
    ]
    full_env = {
        **worker_environ(),
        "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]),
        **(env or {}),
    }
    process = subprocess.Popen(
        args, env=full_env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
    )
    try:
        yield process
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()


def table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    cells = [[str(c) for c in headers]] + [[str(c) for c in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    lines = ["| " + " | ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) + " |" for row in cells]
    lines.insert(1, "|" + "|".join("-" * (w + 2) for w in widths) + "|")
    return "\n".join(lines)


def percentile(values: Sequence[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(p / 100 * (len(ordered) - 1))))]
