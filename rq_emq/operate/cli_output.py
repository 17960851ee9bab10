"""How the ``rq-emq`` commands show what they read: aligned tables for people, JSON for
machines, and the ``--watch`` refresh loop. Nothing here talks to Redis itself.

Names read from Redis (queues, jobs, workers, counters) can hold anything: text output
shows them through :func:`printable`, so a newline cannot break a table and a terminal
escape sequence cannot reach the operator's terminal. JSON escapes them itself.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Callable, Sequence
from datetime import datetime, timezone
from typing import Any

import click
from redis.exceptions import RedisError

from ..recover.sweep import SweepReport
from .inspection import COUNTERS, QueueStatus, remaining_buckets
from .lease_list import LeasePage
from .reports import short_report
from .stop_signals import StopSignals


def printable(value: object) -> str:
    """``value`` as text safe to print: a backslash and every character that is not
    printable (controls such as newline and ESC, bidi overrides) in Python's escape form."""
    text = str(value)
    if text.isprintable() and "\\" not in text:
        return text
    return "".join(
        "\\\\" if c == "\\" else c if c.isprintable() else c.encode("unicode_escape").decode("ascii")
        for c in text
    )


def table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """Columns padded to their widest cell; numbers (and '-') right-aligned."""
    cells = [[printable(h) for h in headers]] + [
        ["-" if c is None else printable(c) for c in row] for row in rows
    ]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    numeric = [
        all(_looks_numeric(row[i]) for row in cells[1:]) and len(cells) > 1 for i in range(len(headers))
    ]
    lines = []
    for row in cells:
        padded = [
            cell.rjust(width) if right else cell.ljust(width)
            for cell, width, right in zip(row, widths, numeric, strict=True)
        ]
        lines.append("  ".join(padded).rstrip())
    return "\n".join(lines)


_NUMERIC = re.compile(r"-|-?\d+(\.\d+)?(ms|s|m\d\ds|h\d\dm)?|[\d?]+/\d+\*?")


def _looks_numeric(cell: str) -> bool:
    return _NUMERIC.fullmatch(cell) is not None


def duration(ms: int | None) -> str | None:
    """``850ms``, ``12.3s``, ``4m05s``, ``2h03m``; negative for 'ago/overdue' values."""
    if ms is None:
        return None
    sign, ms = ("-" if ms < 0 else ""), abs(ms)
    if ms < 1000:
        return f"{sign}{ms}ms"
    if ms < 60_000:
        return f"{sign}{ms / 1000:.1f}s"
    minutes, seconds = divmod(ms // 1000, 60)
    if minutes < 60:
        return f"{sign}{minutes}m{seconds:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{sign}{hours}h{minutes:02d}m"


def _problems(items: Sequence[tuple[str, Sequence[str]]]) -> str:
    lines = [
        f"  {printable(where)}: {printable(problem)}" for where, problems in items for problem in problems
    ]
    return ("\nproblems:\n" + "\n".join(lines)) if lines else ""


# -- status ------------------------------------------------------------------------------
def status_text(statuses: Sequence[QueueStatus]) -> str:
    if not statuses:
        return "no queues (rq:queues is empty): name them, or enqueue something first"
    buckets = remaining_buckets()
    state = table(
        [
            "queue",
            "waiting",
            "in flight",
            *[b if b == "overdue" else f"{b} left" for b in buckets],
            "stalled",
            "oldest lease",
            "oldest mark",
            "outbox",
        ],
        [
            [
                s.queue,
                s.waiting,
                s.in_flight,
                *[s.by_remaining.get(b) for b in buckets],
                s.stalled,
                duration(s.oldest_lease.age_ms) if s.oldest_lease else None,
                duration(s.oldest_mark.age_ms) if s.oldest_mark else None,
                s.outbox,
            ]
            for s in statuses
        ],
    )
    extra = sorted({name for s in statuses for name in s.counters} - set(COUNTERS))
    counters = table(
        ["queue", *COUNTERS, *extra],
        [[s.queue, *[s.counters.get(c) for c in (*COUNTERS, *extra)]] for s in statuses],
    )
    return f"{state}\n\ncounters (since the queue's first lease)\n{counters}" + _problems(
        [(s.queue, s.problems) for s in statuses]
    )


def status_json(statuses: Sequence[QueueStatus]) -> dict[str, Any]:
    return {"queues": [dataclasses.asdict(s) for s in statuses]}


# -- leases ------------------------------------------------------------------------------
def _attempts(lease: Any) -> str | None:
    if lease.attempts is None and lease.max_attempts is None:
        return None
    mark = "*" if lease.max_attempts_source == "default" else ""
    return f"{'?' if lease.attempts is None else lease.attempts}/{lease.max_attempts}{mark}"


def _report(lease: Any) -> str | None:
    """The job's last report, how long ago it showed progress, and why renewals stopped."""
    if lease.no_progress:
        return lease.no_progress
    if lease.report is None:
        return None
    return f"{short_report(lease.report)} ({duration(lease.progress_ms_ago)} ago)"


def leases_text(pages: Sequence[LeasePage]) -> str:
    rows = []
    for page in pages:
        for lease in page.leases:
            rows.append(
                [
                    page.queue,
                    lease.job_id,
                    lease.worker,
                    lease.token_prefix,
                    duration(lease.lock_ttl_ms) if lease.lock == "held" else lease.lock,
                    duration(lease.due_in_ms),
                    _attempts(lease),
                    lease.status if lease.job_exists else "(job gone)",
                    duration(lease.marked_ms_ago),
                    _report(lease),
                    ", ".join(f"{crash.attempt}: {crash.short}" for crash in lease.crashes) or None,
                ]
            )
    # the report and crash history columns only where some job has one
    heads = ["queue", "job", "worker", "token", "lock ttl", "due in", "attempts", "status", "marked"]
    shown_columns = list(range(len(heads))) + [
        i for i in (len(heads), len(heads) + 1) if any(row[i] for row in rows)
    ]
    heads += ["report", "crashed"]
    rows = [[row[i] for i in shown_columns] for row in rows]
    if not rows:
        out = "no leases"
    else:
        out = table([heads[i] for i in shown_columns], rows)
        if any(ls.max_attempts_source == "default" and ls.max_attempts for p in pages for ls in p.leases):
            out += "\n* max attempts: the configured default (the job has none of its own)"
    shown = [f"{page.queue}: {len(page.leases)} of {page.total}" for page in pages if page.total is not None]
    if any(page.total is not None and page.total > len(page.leases) for page in pages):
        out += "\nshown (raise --limit for more): " + ", ".join(shown)
    problems = [(f"{p.queue}", p.problems) for p in pages]
    problems += [(f"{p.queue} {lease.job_id}", lease.problems) for p in pages for lease in p.leases]
    return out + _problems(problems)


def leases_json(pages: Sequence[LeasePage]) -> dict[str, Any]:
    return {"queues": [dataclasses.asdict(page) for page in pages]}


# -- sweep -------------------------------------------------------------------------------
#: What heads a dry run's output: it reads like a real sweep's, in the conditional.
DRY_RUN_HEAD = "dry run: nothing changed"


def sweep_texts(reports: Sequence[SweepReport], dry: bool, drained: bool = True) -> str:
    """Every queue's report, headed, for a dry run, by :data:`DRY_RUN_HEAD`."""
    return "\n".join([*([DRY_RUN_HEAD] if dry else []), *(sweep_text(r, dry, drained) for r in reports)])


def sweep_text(report: SweepReport, dry: bool, drained: bool = True) -> str:
    head = "would be" if dry else "was"
    queue = printable(report.queue)
    rows = [
        (
            job_id,
            ("would be " if dry else "") + "marked stalled (recovered next round if its lock stays gone)",
        )
        for job_id in report.marked
    ]
    rows += [(job_id, f"{head} put back at the front of {queue}") for job_id in report.requeued]
    rows += [(job_id, f"{head} failed at max attempts") for job_id in report.failed]
    rows += [(job_id, f"lease entry of a deleted job, {head} dropped") for job_id in report.dropped]
    rows = [(printable(job_id), where) for job_id, where in rows]
    would = "would be " if dry else ""
    summary = (
        f"queue {queue}: {len(report.marked)} {would}marked, {len(report.requeued)} {would}recovered, "
        f"{len(report.failed)} {would}failed, {report.unmarked} {would}unmarked"
        + ("" if report.ran else " (another sweeper ran this round)")
    )
    width = max((len(job_id) for job_id, _ in rows), default=6)
    lines = [summary, *(f"  {job_id:<{width}}  {where}" for job_id, where in rows)]
    if report.outbox_due and not dry and not drained:
        lines.append(f"  {report.outbox_due} failed job(s) in the outbox, left to the workers (--no-drain)")
    lines += [f"  problem: {printable(problem)}" for problem in report.problems]
    return "\n".join(lines)


def sweep_json(reports: Sequence[SweepReport], dry: bool) -> dict[str, Any]:
    return {"dry_run": dry, "queues": [dataclasses.asdict(report) for report in reports]}


# -- output and --watch ------------------------------------------------------------------
def emit(document: dict[str, Any] | str, as_json: bool, compact: bool = False) -> None:
    if as_json:
        click.echo(json.dumps(document, separators=(",", ":")) if compact else json.dumps(document, indent=2))
    else:
        click.echo(document)


def watch(render: Callable[[], dict[str, Any] | str], interval: float, as_json: bool, describe: str) -> None:
    """Refresh until Ctrl-C (or SIGTERM): people get a cleared screen, machines one JSON
    line each. The signal only sets a flag, checked between refreshes: raised in the
    middle of a Redis call it could leave the connection pool's lock held, and the exit
    would then hang on it."""
    with StopSignals() as stop:
        while not stop.is_set():
            try:
                document = render()
            except RedisError as error:  # keep watching through a Redis outage
                document = f"cannot read Redis at {describe}: {error}"
                if as_json:
                    document = {"error": document}
            if not as_json:
                click.clear()
                stamp = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
                click.echo(f"every {interval:g}s, {stamp} (Ctrl-C to stop)\n")
            emit(document, as_json, compact=True)
            stop.wait(interval)
