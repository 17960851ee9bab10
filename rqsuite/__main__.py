"""``python -m rqsuite``: RQ's own test suite with rq-emq's workers swapped in, compared
with the stock run; exits 1 when a test that passes stock fails ours and the allowlist
does not name it (docs/testing.md)."""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import signal
import sys
import time
from pathlib import Path

from .sdist import extracted_sdist, installed_rq_version
from .suite import run_suite
from .verdict import ALLOWLIST, judge, read_allowlist

Outcomes = dict[str, dict[str, str]]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m rqsuite", description=__doc__)
    parser.add_argument("-n", "--processes", type=int, default=1, help="xdist processes (default 1: serial)")
    parser.add_argument(
        "--cache",
        type=Path,
        default=Path(
            os.environ.get("RQSUITE_CACHE", Path(__file__).resolve().parent.parent / ".rqsuite-cache")
        ),
        help="where the sdist, the stock baseline and the logs live (default .rqsuite-cache/)",
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=900,
        help="seconds a pass may take before it is stopped (default 900)",
    )
    parser.add_argument("--refresh-stock", action="store_true", help="rerun the stock baseline")
    parser.add_argument("--allowlist", type=Path, default=ALLOWLIST)
    parser.add_argument("--no-rerun", action="store_true", help="do not rerun failures serially once")
    parser.add_argument("pytest_args", nargs="*", help="after --: more pytest arguments (-k ..., node ids)")
    return parser.parse_args(argv)


#: Stock baselines kept in the repository (a fresh clone, CI, has no cache): stock RQ's
#: outcomes depend on the RQ release alone, so the stock pass need not run again each time.
#: To add or refresh one: ``python -m rqsuite -n 2 --refresh-stock``, then copy
#: ``.rqsuite-cache/rq-<version>.stock-n2.json`` here.
BASELINES = Path(__file__).resolve().parent / "baselines"


def baseline_file(args: argparse.Namespace, version: str, kept: Path = BASELINES) -> Path | None:
    """Where stock RQ's outcomes for this release and process count are kept: the cache
    first, then the repository's baselines; None when neither has them (or asked anew)."""
    if args.refresh_stock or args.pytest_args:
        return None
    name = f"rq-{version}.stock-n{args.processes}.json"
    for place in (args.cache / name, kept / name):
        if place.is_file():
            return place
    return None


def stock_baseline(args: argparse.Namespace, sdist: Path, version: str) -> Outcomes:
    """Stock RQ's outcomes, from a kept baseline unless asked (they depend on RQ only)."""
    cached = args.cache / f"rq-{version}.stock-n{args.processes}.json"
    kept = baseline_file(args, version)
    if kept is not None:
        print(f"  stock: baseline from {kept}")
        outcomes: Outcomes = json.loads(kept.read_text())
        return outcomes
    outcomes = run_suite(
        sdist,
        "stock",
        args.processes,
        args.cache / f"rq-{version}.stock.log",
        args.timeout,
        extra=args.pytest_args,
    )
    failed = sorted(node for node, entry in outcomes.items() if entry["outcome"] in ("failed", "error"))
    if failed and not args.no_rerun:
        # a stock failure excludes its test from the comparison: it must repeat, alone
        log = args.cache / f"rq-{version}.stock-rerun.log"
        again = run_suite(sdist, "stock", 1, log, args.timeout, select=failed)
        outcomes.update(
            {node: again[node] for node in failed if again.get(node, {}).get("outcome") == "passed"}
        )
    if not args.pytest_args:
        cached.write_text(json.dumps(outcomes, indent=1, sort_keys=True))
    return outcomes


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    # a stopped runner still stops its pytest session and its servers (the finally blocks)
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    started = time.monotonic()
    if args.processes > 1 and importlib.util.find_spec("xdist") is None:
        print("pytest-xdist is not installed: running serially")
        args.processes = 1
    version = installed_rq_version()
    sdist = extracted_sdist(version, args.cache)
    print(f"RQ {version}'s suite ({sdist}), {args.processes} process(es)", flush=True)
    allowlist = read_allowlist(args.allowlist)
    stock = stock_baseline(args, sdist, version)
    ours = run_suite(
        sdist,
        "ours",
        args.processes,
        args.cache / f"rq-{version}.ours.log",
        args.timeout,
        extra=args.pytest_args,
    )
    verdict = judge(stock, ours, allowlist)
    if verdict.failed and not args.no_rerun:
        # RQ's suite has timing-sensitive tests: a failure must repeat, alone, to count
        again = run_suite(
            sdist,
            "ours",
            1,
            args.cache / f"rq-{version}.ours-rerun.log",
            args.timeout,
            select=sorted(verdict.failed),
        )
        flaky = sorted(node for node in verdict.failed if again.get(node, {}).get("outcome") == "passed")
        ours.update({node: again[node] for node in flaky})
        verdict = judge(stock, ours, allowlist)
        for node in flaky:
            print(f"  passed when rerun alone (timing under load): {node}")
    for node, section in sorted(verdict.allowed.items()):
        print(f"  allowed [{section}]: {node} -- {allowlist[node][1]}")
    for node in verdict.stale:
        print(f"  listed in [{allowlist[node][0]}], passes on this RQ (drop it once all pass): {node}")
    for node, symptom in verdict.failed.items():
        print(f"  FAILED: {node} -- {symptom}")
    print(f"RQ {version}: {verdict.summary()} ({time.monotonic() - started:.0f} s)")
    return 1 if verdict.failed else 0


if __name__ == "__main__":
    sys.exit(main())
