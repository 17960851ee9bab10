"""What a running job told its lease, as readers of Redis see it.

A job under a lease worker may call ``rq_emq.current_lease().report(progress, **details)``;
its newest report rides on the next renewal into the job hash (``emq_report``, JSON) with
the Redis time it landed (``emq_progress_at``, also stamped at the grant), and a renewal
that found the job silent past its progress timeout records why (``emq_no_progress``).
All of it goes when the lease does. This module reads those fields, with the grant's
fencing token (``emq_fence``), for ``rq-emq leases`` and the dashboard; a value that does
not read is a problem named, never a failed listing. Nothing read is evaluated: a report
is parsed as JSON only.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any, Protocol

#: The job-hash fields :func:`read_notes` reads, in its order.
NOTE_FIELDS = ("emq_fence", "emq_report", "emq_progress_at", "emq_no_progress")


class Noted(Protocol):
    job_id: str
    fencing_token: int | None
    report: Any
    progress_ms_ago: int | None
    no_progress: str | None
    problems: list[str]


def read_notes(info: Noted, now_ms: int, values: Sequence[Any]) -> None:
    """Set ``info``'s notes from the HMGET of :data:`NOTE_FIELDS` (``now_ms``: Redis time)."""
    fence, report, progress_at, no_progress = (_text(value) for value in values)
    if fence is not None:
        info.fencing_token = count_value(fence)
        if info.fencing_token is None:
            info.problems.append(f"emq_fence of job {info.job_id} is not a number: {fence[:40]!r}")
    if report is not None:
        try:
            info.report = json.loads(report)
        except ValueError:
            info.problems.append(f"emq_report of job {info.job_id} is not JSON: {report[:80]!r}")
    at = None if progress_at is None else count_value(progress_at)
    info.progress_ms_ago = None if at is None else now_ms - at
    info.no_progress = no_progress


def short_report(report: Any, width: int = 48) -> str | None:
    """A report in one short line: the progress, then the details as ``name=value`` (JSON
    values), cut to ``width`` characters. A progress that is a fraction (a float from 0.0
    to 1.0: ``report(step / steps)``) shows as a percentage, 1.0 as ``100%`` (done); any
    other value as written: ``report(1)``, an int, is a count (step 1), not done."""
    if report is None:
        return None
    if not isinstance(report, dict):
        line = _json(report)
    else:
        details = dict(report)
        progress = details.pop("progress", None)
        words = [_progress(progress)] if progress is not None else []
        words += [f"{name}={_json(value)}" for name, value in details.items()]
        line = " ".join(words) or "{}"
    return line if len(line) <= width else line[: width - 1] + "…"


def report_json(report: Any) -> str:
    """A report in full, as JSON text (for a tooltip: plain text, escaped where it lands)."""
    return json.dumps(report, ensure_ascii=False)


def _progress(value: Any) -> str:
    if isinstance(value, float) and 0 <= value <= 1:
        return f"{value:.0%}"
    return _json(value)


def _json(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def _text(value: Any) -> str | None:
    if value is None:
        return None
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def count_value(value: str) -> int | None:
    """A count a script stored (digits only, as lua/lib/lease.lua reads them); else None."""
    return int(value) if value.isdigit() and len(value) <= 18 else None
