"""Every benchmark, one after the other, each ours beside stock RQ: all tables in one report.

    python benchmarks/run_all.py [--quick] [--markdown results.md] [--only throughput renewal]

Each script starts its own private redis-server (or uses REDIS_URL) and prints one table;
this prints them under headings with the versions they ran on, and can write the same as
markdown (ready for docs/benchmarks.md). ``--quick`` only shows that every script still runs: its
numbers are not worth reading. A full run takes about 15 minutes.
"""

from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

import redis
import rq

from rq_emq.testing import find_redis_server

HERE = Path(__file__).resolve().parent

BENCHMARKS = {
    "cost": "What a worker costs: connections, throughput and Redis CPU per job, start-up included",
    "redis_instructions": "Redis's own work per job in instructions (callgrind): repeatable, unlike CPU time",
    "worker_instructions": "The no-fork worker's own work per job in instructions (callgrind)",
    "pickup": "Idle workers: pick-up latency and idle Redis cost",
    "fleet": "A fleet of idle workers: Redis work per job, connections and pick-up as it grows",
    "idle_cost": "Idle fleets: Redis commands per second per idle worker (N = 1, 10, 50)",
    "throughput": "No-op jobs: throughput, Redis commands, round trips and Redis CPU per job",
    "renewal": "Keeping N jobs alive: cost of one heartbeat tick",
    "job_lease": "The job's own lease: a fenced write beside a plain pipeline, report() beside save_meta()",
    "sweep_cost": "Sweep: Redis time with 1k-100k jobs in flight",
    "dashboard": "The lease panel in rq-dashboard: its page against jobs in flight, its record's cost",
    "detection": "SIGKILLed worker: time until its job is back",
}


def versions() -> str:
    server = find_redis_server()
    server_version = "?"
    if server:
        words = subprocess.run([server, "--version"], capture_output=True, text=True).stdout.split()
        server_version = next((w[2:] for w in words if w.startswith("v=")), "?")
    return (
        f"RQ {rq.__version__}, redis-py {redis.__version__}, Redis {server_version}, "
        f"Python {platform.python_version()}, {os.cpu_count()} CPUs"
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="only show that every benchmark still runs")
    parser.add_argument("--markdown", type=Path, help="also write the report to this file")
    parser.add_argument("--only", nargs="+", choices=sorted(BENCHMARKS), help="run only these")
    options = parser.parse_args()
    names = options.only or list(BENCHMARKS)
    mode = "quick: numbers not meaningful" if options.quick else "full"
    report = [f"Benchmarks ({mode}): {versions()}", ""]
    failed = []
    for name in names:
        args = [sys.executable, str(HERE / f"{name}.py"), *(["--quick"] if options.quick else [])]
        print(f"== {name}: {BENCHMARKS[name]}", flush=True)
        started = time.monotonic()
        run = subprocess.run(args, cwd=HERE, capture_output=True, text=True)
        took = time.monotonic() - started
        if run.returncode != 0:
            failed.append(name)
            print(run.stdout + run.stderr, flush=True)
            continue
        print(run.stdout, flush=True)
        report += [f"### {BENCHMARKS[name]}", "", f"`python benchmarks/{name}.py` ({took:.0f} s)", ""]
        report += [run.stdout.strip(), ""]
    if options.markdown:
        options.markdown.write_text("\n".join(report))
    if failed:
        sys.exit(f"benchmarks failed: {', '.join(failed)}")


if __name__ == "__main__":
    main()
