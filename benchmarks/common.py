"""Shared pieces of the benchmarks: a private redis-server, worker processes, a table."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import redis

HERE = Path(__file__).resolve().parent
RQ_BIN = str(Path(sys.executable).parent / "rq")
STOCK = "rq.Worker"
OURS = "rq_emq.LeaseWorker"


@contextmanager
def private_redis() -> Iterator[str]:
    """REDIS_URL when set, else a redis-server of our own on a free port, no persistence."""
    if os.environ.get("REDIS_URL"):
        yield os.environ["REDIS_URL"]
        return
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    folder = tempfile.mkdtemp(prefix="rq-emq-bench-")
    server = subprocess.Popen(
        [
            "redis-server",
            "--port",
            str(port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            folder,
        ],
        stdout=subprocess.DEVNULL,
    )
    url = f"redis://127.0.0.1:{port}/0"
    try:
        wait_until(lambda: _pings(url), 10)
        yield url
    finally:
        server.kill()
        server.wait()
        shutil.rmtree(folder, ignore_errors=True)


def _pings(url: str) -> bool:
    try:
        return bool(redis.Redis.from_url(url).ping())
    except redis.exceptions.ConnectionError:
        return False


def wait_until(predicate: Callable[[], object], timeout: float, interval: float = 0.01) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError("benchmark setup timed out")
        time.sleep(interval)


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
        **os.environ,
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
