"""Redis's own work per job, as instructions: ours beside stock RQ, one run, one redis-server.

Redis CPU seconds (``INFO cpu``, what ``cost.py`` reads) swing with the host; the
instructions Redis executes for the same jobs do not. This runs a private redis-server
under ``valgrind --tool=callgrind`` (installed on the CI machine), and for each worker class
enqueues ``--jobs`` no-op jobs, zeroes the counts, runs ``rq worker --burst`` over them and
reads what Redis executed meanwhile: in all, and in scripts (``luaCallFunction``, the
commands they run included). Start-up is included; the scripts' first load is not (they
are loaded before the counts start). Run again on the same code, ours came within 0.2%,
stock within 3% (how many times its loop polls depends on timing).

What it cannot see: the kernel's work for each round trip (system CPU), where stock RQ,
with some four times our round trips a job, spends more. Read the ratio as the user-space
half of Redis CPU.

    python benchmarks/redis_instructions.py [--jobs 300] [--quick]
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import redis
from common import table, worker
from rq import Queue

from rq_emq.testing import find_redis_server, free_port

PAIRS = [("rq.SimpleWorker", "rq_emq.SimpleLeaseWorker"), ("rq.Worker", "rq_emq.LeaseWorker")]


def _counts(dump: Path) -> tuple[int, int]:
    """Instructions in all, and inside ``luaCallFunction``, from one callgrind dump."""
    out = subprocess.run(
        ["callgrind_annotate", "--inclusive=yes", "--threshold=100", "--auto=no", str(dump)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout

    def number(pattern: str) -> int:
        found = re.search(rf"^\s*([\d,]+) .*{pattern}", out, re.MULTILINE)
        return int(found.group(1).replace(",", "")) if found else 0

    return number("PROGRAM TOTALS"), number(r":luaCallFunction ")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--jobs", type=int, default=300)
    parser.add_argument("--quick", action="store_true", help="20 jobs: shows it still runs")
    options = parser.parse_args()
    if options.quick:
        options.jobs = 20
    for tool in ("valgrind", "callgrind_control", "callgrind_annotate"):
        if shutil.which(tool) is None:
            print(f"redis_instructions: {tool} is not installed (Debian: apt-get install valgrind)")
            sys.exit(0 if options.quick else 1)
    server_binary = find_redis_server()  # the one the tests and the other benchmarks start
    if server_binary is None:
        sys.exit("redis_instructions: no redis-server found")
    port = free_port()
    url = f"redis://127.0.0.1:{port}/0"
    with tempfile.TemporaryDirectory() as scratch:
        prefix = Path(scratch) / "redis.callgrind"
        server = subprocess.Popen(
            ["valgrind", "--tool=callgrind", f"--callgrind-out-file={prefix}"]
            + [server_binary, "--port", str(port), "--save", "", "--appendonly", "no"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        control = ["callgrind_control"]
        try:
            r = redis.Redis.from_url(url)
            deadline = time.monotonic() + 60
            while True:
                try:
                    r.ping()
                    break
                except redis.ConnectionError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.2)
            rows: list[list[object]] = []
            for stock_class, our_class in PAIRS:
                measured: dict[str, tuple[int, int]] = {}
                for cls in (stock_class, our_class):
                    # a first burst loads the scripts and warms the server: not counted
                    for counted in (False, True):
                        r.flushdb()
                        jobs = options.jobs if counted else 5
                        data = [Queue.prepare_data("bench_jobs.noop") for _ in range(jobs)]
                        Queue("q0", connection=r).enqueue_many(data)
                        subprocess.run([*control, "-z", str(server.pid)], check=True, capture_output=True)
                        with worker(url, cls, ["q0"], burst=True) as process:
                            process.wait(timeout=900)
                        if r.llen("rq:queue:q0"):
                            sys.exit(f"redis_instructions: {cls} left jobs behind")
                    dumps_before = set(Path(scratch).glob("redis.callgrind*"))
                    subprocess.run([*control, "-d", str(server.pid)], check=True, capture_output=True)
                    (dump,) = set(Path(scratch).glob("redis.callgrind*")) - dumps_before
                    total, lua = _counts(dump)
                    measured[cls] = (total // options.jobs, lua // options.jobs)
                label = f"{our_class.split('.')[-1]} vs {stock_class}"
                (stock_total, stock_lua), (our_total, our_lua) = measured[stock_class], measured[our_class]
                ratio = f"{our_total / stock_total:.2f}x"
                rows.append([f"Redis instructions per job, {label}", stock_total, our_total, ratio])
                rows.append([f"  of them in scripts, {label}", stock_lua, our_lua, "-"])
        finally:
            server.terminate()
            server.wait(timeout=60)
    print(f"{options.jobs} no-op jobs on one queue, start-up included; callgrind's Ir, user space only")
    print("(ratio: ours over stock: below 1.00x is ours cheaper)")
    print(table(["what", "stock RQ", "rq-emq", "ratio"], rows))


if __name__ == "__main__":
    main()
