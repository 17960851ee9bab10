"""``python -m mutations``: run the mutation catalog and print killed / survived.

    python -m mutations            # every mutation
    python -m mutations --fast     # the CI subset
    python -m mutations --only NAME [--only NAME ...]
    python -m mutations --list     # names, files and tests, nothing run
    python -m mutations --fast --jobs 2   # two at a time (CI: one per core)

Exits 1 when any mutation survives, 2 when the catalog no longer applies.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import sys
import tempfile
import time
from pathlib import Path

from .catalog import CATALOG, Mutation, by_name
from .runner import CatalogError, Outcome, apply, check_isolation, run, scratch_copy


def _select(args: argparse.Namespace) -> list[Mutation]:
    named = by_name()
    if args.only:
        unknown = [n for n in args.only if n not in named]
        if unknown:
            raise SystemExit(f"unknown mutation(s): {', '.join(unknown)} (see --list)")
        return [named[n] for n in args.only]
    return [m for m in CATALOG if m.fast or not args.fast]


def _check_catalog(mutations: list[Mutation]) -> None:
    """Every snippet still applies (and the copy is isolated) before anything runs."""
    with tempfile.TemporaryDirectory(prefix="mutation-check-") as tmp:
        tree = scratch_copy(Path(tmp))
        check_isolation(tree)
        pristine = {m.file: (tree / m.file).read_text() for m in mutations}
        for m in mutations:
            apply(m, tree)
            (tree / m.file).write_text(pristine[m.file])


def _table(outcomes: list[Outcome]) -> str:
    width = max(len(o.name) for o in outcomes)
    lines = [f"{'mutation':<{width}}  verdict   seconds  failing test", "-" * (width + 40)]
    for o in outcomes:
        lines.append(f"{o.name:<{width}}  {o.verdict:<8}  {o.seconds:7.1f}  {o.detail}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m mutations", description=__doc__.splitlines()[0])
    parser.add_argument("--only", action="append", metavar="NAME", help="run this mutation (repeatable)")
    parser.add_argument("--fast", action="store_true", help="only the fast subset that CI runs")
    parser.add_argument("--list", action="store_true", help="list the mutations and their tests")
    parser.add_argument("--keep", action="store_true", help="keep each scratch copy (paths on stderr)")
    parser.add_argument(
        "--jobs", type=int, default=1, metavar="N", help="run N mutations at a time (each in its own copy)"
    )
    args = parser.parse_args(argv)
    mutations = _select(args)
    if args.list:
        for m in mutations:
            flag = "fast" if m.fast else "slow"
            print(f"{m.name} [{flag}] {m.file}: {m.why}")
            for test in m.tests:
                print(f"    {test}")
        return 0
    try:
        _check_catalog(mutations)
    except CatalogError as error:
        print(error, file=sys.stderr)
        return 2
    outcomes: list[Outcome] = []
    started = time.monotonic()
    # each mutation has its own scratch copy and its pytest its own private redis-server,
    # so runs in parallel share nothing but the CPU
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        futures = [pool.submit(run, m, args.keep) for m in mutations]
        for future in concurrent.futures.as_completed(futures):
            try:
                outcome = future.result()
            except CatalogError as error:
                print(error, file=sys.stderr)
                for pending in futures:
                    pending.cancel()
                return 2
            print(f"{outcome.verdict:<8} {outcome.name} ({outcome.seconds:.1f}s)", flush=True)
            outcomes.append(outcome)
    order = {m.name: i for i, m in enumerate(mutations)}
    outcomes.sort(key=lambda o: order[o.name])
    survivors = [o for o in outcomes if not o.killed]
    print()
    print(_table(outcomes))
    named = by_name()
    for o in survivors:  # last, so that CI's tail of this log names them and their tests
        print(f"SURVIVED {o.name} ({named[o.name].file}): {', '.join(named[o.name].tests)}")
    print(
        f"\n{len(outcomes) - len(survivors)} of {len(outcomes)} mutations killed, "
        f"{len(survivors)} survived, in {time.monotonic() - started:.0f}s"
    )
    return 1 if survivors else 0


if __name__ == "__main__":
    sys.exit(main())
