"""``python -m soak``: run the chaos soak and print its results (see soak/README.md).

Exit status: 0 when every invariant held (always 0 for ``--worker stock``, the baseline,
unless the harness itself broke), 1 when one failed, 2 on bad arguments.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from dataclasses import asdict
from pathlib import Path
from typing import Any

from .checks import evaluate
from .faults import KINDS, NOT_WITH_SENTINEL, OPT_IN, SENTINEL_KINDS
from .model import BOUND_SLACK_S, Config, Evidence, load
from .run import Soak
from .verdict import Verdict


def parse(argv: list[str] | None) -> tuple[Config, bool, bool, Path | None, float | None]:
    p = argparse.ArgumentParser(prog="python -m soak", description=__doc__)
    p.add_argument("--duration", type=float, default=60.0, help="seconds of chaos while jobs flow")
    p.add_argument("--workers", type=int, default=4, help="worker processes (half behind a TCP proxy)")
    p.add_argument("--worker", choices=("lease", "stock"), default="lease")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--rate", type=float, default=3.0, help="jobs enqueued per second")
    p.add_argument("--fault-every", type=float, default=1.5, help="mean seconds between faults")
    p.add_argument("--lease-ms", type=int, default=1500)
    p.add_argument("--renew-ms", type=int, default=250)
    p.add_argument("--sweep-ms", type=int, default=500)
    p.add_argument("--max-attempts", type=int, default=5)
    p.add_argument("--drain", type=float, default=45.0, help="seconds allowed to finish after the chaos")
    p.add_argument(
        "--bound-slack",
        type=float,
        default=None,
        help=f"seconds a recovery may take past lease + 2 sweeps before it fails (default {BOUND_SLACK_S})",
    )
    p.add_argument(
        "--faults",
        default=None,
        help=f"comma list of: {', '.join(KINDS)}; with --sentinel also {', '.join(SENTINEL_KINDS)} "
        f"and none of {', '.join(sorted(NOT_WITH_SENTINEL))} (default: all that apply)",
    )
    p.add_argument(
        "--stock-neighbours",
        type=int,
        default=None,
        help="stock rq workers beside the lease fleet on the same queue, frozen now and then "
        "(0: none; default 1, 0 with --sentinel)",
    )
    p.add_argument(
        "--simple-workers",
        type=int,
        default=None,
        help="of the lease workers, the last this many are SimpleLeaseWorkers (default 1, 0 with --sentinel)",
    )
    p.add_argument(
        "--debug-workers",
        type=int,
        default=None,
        help="of the lease workers, the first this many log DEBUG through a handler that the "
        "slow_log fault makes slow (default 1, 0 with --sentinel)",
    )
    p.add_argument(
        "--sentinel",
        action="store_true",
        help="a primary, a replica and 3 sentinels; workers find the master through Sentinel; "
        "failover and kill_master faults (soak/sentinel.py)",
    )
    p.add_argument(
        "--lose-data",
        action="store_true",
        help="also: Redis restarts once without persistence (its data lost), half-way, and the "
        "producer resubmits its plain jobs under their ids (soak/dataloss.py)",
    )
    p.add_argument("--keep", type=Path, help="keep the run's files (worker logs, side-effect log) here")
    p.add_argument("--json", action="store_true", help="print the results as JSON")
    p.add_argument("--recheck", type=Path, help="run no soak: check again the evidence a --keep DIR holds")
    a = p.parse_args(argv)
    known = list(KINDS)
    if a.sentinel:
        known = [k for k in KINDS if k not in NOT_WITH_SENTINEL] + list(SENTINEL_KINDS)
    kinds = tuple(k.strip() for k in (a.faults or ",".join(known)).split(",") if k.strip())
    unknown = [k for k in kinds if k not in known]
    if unknown:
        p.error(f"--faults: kind(s) {', '.join(unknown)} not known here; known: {', '.join(known)}")
    if a.lose_data:
        if a.sentinel:
            p.error("--lose-data: not with --sentinel (a replica keeps the data)")
        kinds += OPT_IN
    if a.workers < 1 or a.duration <= 0 or a.rate <= 0 or a.fault_every <= 0:
        p.error("--workers, --duration, --rate and --fault-every must be positive")
    if a.bound_slack is not None and a.bound_slack < 0:
        p.error("--bound-slack must be zero or more")
    if a.renew_ms >= a.lease_ms:
        p.error("--renew-ms must be shorter than --lease-ms")
    if a.renew_ms * 25 > a.sweep_ms * 16:  # the workers' own check (rq_emq.settings)
        p.error("--renew-ms must be at most 0.64 x --sweep-ms")
    if a.keep is not None and a.keep.exists() and any(a.keep.iterdir()):
        # the side-effect log appends: an earlier run's lines would be judged with this run's jobs
        p.error(f"--keep: {a.keep} is not empty (an earlier run's files would mix with this run's)")
    config = Config(
        duration=a.duration,
        workers=a.workers,
        worker=a.worker,
        seed=a.seed,
        rate=a.rate,
        fault_every=a.fault_every,
        lease_ms=a.lease_ms,
        renew_ms=a.renew_ms,
        sweep_ms=a.sweep_ms,
        max_attempts=a.max_attempts,
        drain=a.drain,
        kinds=kinds,
        out=a.keep,
        bound_slack_s=BOUND_SLACK_S if a.bound_slack is None else a.bound_slack,
        stock_neighbours=max(0, int(not a.sentinel) if a.stock_neighbours is None else a.stock_neighbours),
        sentinel=a.sentinel,
        simple_workers=max(0, int(not a.sentinel) if a.simple_workers is None else a.simple_workers),
        debug_workers=0 if a.sentinel else max(0, 1 if a.debug_workers is None else a.debug_workers),
    )
    return config, a.json, a.keep is not None, a.recheck, a.bound_slack


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{1000 * value:.0f}"


def table(ev: Evidence, v: Verdict) -> str:
    c, lat = v.counts, v.latency
    cfg = ev.config
    lines = [
        f"soak: {cfg.worker} workers x{cfg.workers}, {cfg.duration:.0f}s chaos, seed {cfg.seed}, "
        f"wall {ev.wall:.0f}s, drained in {'-' if ev.drained_in is None else f'{ev.drained_in:.1f}s'}",
        f"settings: lease {cfg.lease_ms} ms, renew {cfg.renew_ms} ms, sweep {cfg.sweep_ms} ms, "
        f"max attempts {cfg.max_attempts}; --with-scheduler{'; Sentinel' if cfg.sentinel else ''}"
        if cfg.worker == "lease"
        else "settings: stock rq.Worker --with-scheduler --job-monitoring-interval 1 "
        "--maintenance-interval 1 --worker-ttl 20",
        "",
        "| measure | value |",
        "|---|---|",
    ]
    stock_copies = c.get("stock_ran_its_duplicate", 0)
    rows = [
        ("jobs enqueued", c["jobs"]),
        ("finished / failed", f"{c['finished']} / {c['failed']}"),
        ("failed, by reason", ", ".join(f"{k} {n}" for k, n in sorted(c["failed_by_reason"].items())) or "-"),
        ("failed at max attempts (stalled every time)", c["failed_at_max_attempts"]),
        (
            "of them, Result still behind a drainer's live outbox claim (a drainer the soak hit)",
            c.get("failure_commit_pending", 0),
        ),
        ("lost (not finished after the drain)", c["lost"]),
        (
            "left in RQ's intermediate list by a stock neighbour's dequeue (stock RQ's loss)",
            c.get("stranded_by_stock_dequeue", 0),
        ),
        (
            "failed while running (failed, yet a run completed) / no fault explains it",
            f"{c['failed_while_running']} / {c['failed_while_running_unexplained']}",
        ),
        ("wrong outcome", c["wrong_outcome"]),
        ("duplicates (repeated runs no fault explains)", c["duplicates"]),
        (
            "runs by a stock neighbour of the copy stock RQ's own double enqueue made (stock RQ's)",
            c.get("stock_ran_its_duplicate", 0),
        ),
        ("overlapping runs / longest overlap ms", f"{c['overlapping_runs']} / {c['longest_overlap_ms']}"),
        (
            "repeated runs, explained by a fault / by a self-fenced stop (the worker's log)",
            f"{c['repeated_runs'] - c['duplicates'] - c.get('self_fenced_stops', 0) - stock_copies} / "
            f"{c.get('self_fenced_stops', 0)}",
        ),
        (
            "queued twice / by a stock neighbour's own double enqueue",
            f"{c['queued_twice']} / {c.get('queued_twice_by_stock', 0)} (in {c['queue_samples']} samples)",
        ),
        (
            "fencing tokens: runs with one / shared by two runs / not above a loss of Redis's data",
            f"{c.get('runs_with_a_token', 0)} / {c.get('tokens_shared', 0)} / "
            f"{c.get('tokens_not_above_the_loss', 0)}",
        ),
        (
            "Redis lost its data (--lose-data): jobs resubmitted / lost with it (lifecycle units)",
            f"{c.get('resubmitted_after_loss', 0)} / {c.get('lost_with_redis', 0)}",
        ),
        (
            "jobs not in exactly one place RQ reads (conservation, every sample)",
            f"{c.get('conservation_violations', 0)} (in {c.get('conservation_samples', 0)} samples)",
        ),
        (
            "stray copies RQ's own clients pushed: samples that saw one / copies our take dropped",
            f"{c.get('stray_copies_seen', 0)} / {c.get('stray_copies_dropped', 0)}",
        ),
        (
            "runs / takes / takes that never started / stale runs / counts read after a self-fenced stop",
            f"{c['runs']} / {c.get('takes', '-')} / {c.get('takes_never_started', '-')} / "
            f"{c.get('stale_runs', '-')} / {c.get('attempts_read_after_a_self_fenced_stop', '-')}",
        ),
        ("worker respawns / crashes (exits the soak did not cause)", f"{c['respawns']} / {c['crashes']}"),
        (
            "stock neighbours (frozen, never killed) / their runs / stock rq info calls",
            f"{cfg.stock_neighbours if cfg.worker == 'lease' else 0} / "
            f"{sum(r.ppid in set(ev.stock_workers) for runs in ev.runs.values() for r in runs)} / "
            f"{ev.rq_info_calls}",
        ),
        (
            "failure callbacks / for a job that finished (beyond its runs that raised)",
            f"{c.get('failure_callbacks', '-')} / {c.get('spurious_failure_callbacks', '-')}",
        ),
        ("faults", ", ".join(f"{k} {n}" for k, n in sorted(c["faults"].items())) or "none"),
        ("jobs by lifecycle kind", ", ".join(f"{k} {n}" for k, n in sorted(c["lifecycle_jobs"].items()))),
        (
            "canceled / deleted by the producer; scheduled never enqueued (RQ's scheduler quit)",
            f"{c['acted']['cancel']} / {c['acted']['delete']}; {c['scheduled_stranded']}",
        ),
        (
            "lifecycle violations by kind",
            ", ".join(f"{k} {n}" for k, n in sorted(c["lifecycle_violations"].items())) or "-",
        ),
    ]
    if lat:
        rows += [
            (
                f"lapse -> requeued ms p50 / p95 / max ({lat['samples']} seen, {lat['not_seen']} not)",
                f"{_ms(lat['lapse_p50'])} / {_ms(lat['lapse_p95'])} / {_ms(lat['lapse_max'])}",
            ),
            (
                f"fault -> requeued ms p50 / p95 / max (bound lease + 2 sweeps = {_ms(lat['bound_s'])}; "
                f"{_ms(lat['double_bound_s'])} with another worker hit too ({lat['double']} such, "
                f"{lat.get('outages', 0)} of them counted from an outage of every worker); "
                f"+ {_ms(lat['slack_s'])} slack)",
                f"{_ms(lat['fault_p50'])} / {_ms(lat['fault_p95'])} / {_ms(lat['fault_max'])}; "
                f"over bound + slack: {lat['over_bound']}",
            ),
            (
                "seen death (oom_horse; kill_worker, its watchdog alive) -> requeued ms p50 / max "
                f"({lat['crash_samples']} seen; "
                f"bound {_ms(lat['crash_bound_s'])} + {_ms(lat['slack_s'])} slack)",
                f"{_ms(lat['crash_p50'])} / {_ms(lat['crash_max'])}",
            ),
        ]
    fe = c.get("fenced_effects")
    if fe:
        rows += [
            (
                "fenced-effect jobs / finished (by a stock worker: no lease to fence by)",
                f"{fe['jobs']} / {fe['finished']} ({fe['finished_without_lease']})",
            ),
            (
                "their plain effects (at least once) / jobs with more than one",
                f"{fe['plain']} / {fe['plain_over_one']}",
            ),
            (
                "fenced effects landed / writes that counted nothing (one grant's resent) / writes refused",
                f"{fe['landed']} / {fe['again']} ({fe['resent']}) / {fe['refused']}",
            ),
        ]
    if "failover" in c:
        fo = c["failover"]
        rows += [
            (
                "failovers (failover, kill_master) / injections failed / reruns in their windows",
                f"{fo['moves']} / {fo['injection_failed']} / {fo['reruns_in_window']}",
            ),
            (
                f"back on the new master, max s over {fo['rejoin_samples']} worker-failovers "
                f"(bound {fo['rejoin_bound_s']:.1f} + {fo['slack_s']:.1f} slack)",
                "-" if fo["rejoin_max_s"] is None else f"{fo['rejoin_max_s']:.2f}",
            ),
        ]
    lines += [f"| {name} | {value} |" for name, value in rows]
    lines += ["", *overlap_table(c.get("overlap_by_kind", {}))]
    if "witness_faults" in c:
        lines += ["", *witness_table(c["witness_faults"])]
    if fe:
        lines += ["", *effects_table(fe)]
    lines += [f"note: {note}" for note in ev.notes]
    if v.violations:
        what = "violation(s)" if v.enforced else "finding(s) (the baseline is not held to them)"
        lines += ["", f"{len(v.violations)} {what}:", *(f"  {x}" for x in v.violations[:40])]
    verdict = (
        "baseline (reported, not checked)" if cfg.worker == "stock" else ("PASS" if v.passed else "FAIL")
    )
    lines += ["", f"result: {verdict}"]
    return "\n".join(lines)


def overlap_table(rows: dict[str, dict[str, Any]]) -> list[str]:
    """Overlapping runs per fault kind (the kind that hit the earlier run's worker or horse
    last before the later run began): the issue-11 table, ours beside stock."""
    lines = ["| fault kind | faults | overlapping runs | longest overlap ms |", "|---|---|---|---|"]
    lines += [
        f"| {kind} | {row['faults']} | {row['overlaps']} | {row['longest_ms']:.0f} |"
        for kind, row in rows.items()
    ]
    return lines


def witness_table(rows: dict[str, dict[str, int]]) -> list[str]:
    """Issue 46's faults (soak/witnesscheck.py): each must show 0 overlaps, 0 lost jobs and
    0 false recoveries; ``threads`` counts the threaded bodies' runs in a SimpleLeaseWorker."""
    lines = [
        "| issue 46 fault | faults (threads: runs, hit by a stop or kill) | overlapping runs | lost jobs "
        "| false recoveries |",
        "|---|---|---|---|---|",
    ]
    for kind, row in rows.items():
        faults = f"{row['faults']} ({row['hit']})" if "hit" in row else str(row["faults"])
        lines.append(f"| {kind} | {faults} | {row['overlaps']} | {row['lost']} | {row['false_recoveries']} |")
    return lines


def effects_table(fe: dict[str, Any]) -> list[str]:
    """The fenced jobs per fault kind that hit them (soak/effectcheck.py): the plain twin's
    at-least-once count beside the fenced effect that must land once."""
    lines = [
        "| fault kind | fenced jobs | plain effects | jobs with >1 plain | fenced effects landed | "
        "fenced writes that counted nothing | fenced writes refused | violations |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for kind, row in [*fe["by_kind"].items(), ("all", fe)]:
        lines.append(
            f"| {kind} | {row['jobs']} | {row['plain']} | {row['plain_over_one']} | {row['landed']} | "
            f"{row['again']} | {row['refused']} | {row['violations']} |"
        )
    return lines


def main(argv: list[str] | None = None) -> int:
    config, as_json, keep, recheck, slack = parse(argv)
    if recheck is not None:
        evidence = load(recheck / "evidence.json")
        if slack is not None:
            evidence.config.bound_slack_s = slack
        config = evidence.config
        verdict = evaluate(evidence)
    else:
        work_dir = config.out or Path(tempfile.mkdtemp(prefix="rq-emq-soak-"))
        work_dir.mkdir(parents=True, exist_ok=True)
        try:
            if config.sentinel:
                from .sentinel import SentinelSoak

                evidence = SentinelSoak(config, work_dir).run()
            else:
                evidence = Soak(config, work_dir).run()
            verdict = evaluate(evidence)
        finally:
            if not keep:
                shutil.rmtree(work_dir, ignore_errors=True)
    if as_json:
        out = {
            "config": {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(config).items()},
            "counts": verdict.counts,
            "latency": verdict.latency,
            "violations": verdict.violations,
            "passed": verdict.passed,
            "wall_s": evidence.wall,
            "drained_in_s": evidence.drained_in,
        }
        print(json.dumps(out, indent=2))
    else:
        print(table(evidence, verdict))
    return 0 if verdict.passed else 1


if __name__ == "__main__":
    sys.exit(main())
