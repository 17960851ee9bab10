"""Job functions that read their own lease (``rq_emq.current_lease()``); workers import
them (tests/ is on their PYTHONPATH). Each appends one JSON line per event to a log."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path
from typing import Any

from rq import Retry

import rq_emq


def _write(log: str, **event: Any) -> None:
    with open(log, "a") as out:
        out.write(json.dumps({"pid": os.getpid(), **event}) + "\n")


def events(log: str) -> list[dict[str, Any]]:
    path = Path(log)
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def _seen(log: str) -> dict[str, Any]:
    lease = rq_emq.current_lease()
    if lease is None:
        return {"lease": None}
    return {
        "lease": repr(lease),
        "job_id": lease.job_id,
        "attempt": lease.attempt,
        "fencing_token": lease.fencing_token,
        "held": lease.held,
        "stopping": lease.stopping,
    }


def record_lease(log: str) -> str:
    _write(log, event="run", **_seen(log))
    return "done"


def record_lease_then_crash_first(log: str) -> str:
    """The first run records its lease and dies as an OOM-killed horse does (SIGKILL)."""
    first = not events(log)
    _write(log, event="run", **_seen(log))
    if first:
        os.kill(os.getpid(), signal.SIGKILL)
    return "done"


def record_lease_then_retry_first(log: str) -> str:
    """The first run records its lease and raises; ``Retry`` runs it again."""
    first = not events(log)
    _write(log, event="run", **_seen(log))
    if first:
        raise RuntimeError("planned failure")
    return "done"


def record_lease_returning_retry_first(log: str) -> Any:
    first = not events(log)
    _write(log, event="run", **_seen(log))
    return Retry(max=1) if first else "done"


def fenced_writes_across_a_lost_lease(log: str, key: str, flag: str) -> str:
    """Write through the fenced pipeline while the lease holds; once the test took the
    lease away (it writes ``flag``), write again: refused in Redis, nothing written, even
    before this holder's clock knows; then wait for ``held`` to turn false."""
    lease = rq_emq.current_lease()
    assert lease is not None
    pipe = lease.fenced_pipeline()
    pipe.set(f"{key}:before", lease.fencing_token).incr(f"{key}:count")
    _write(log, event="before", replies=[str(reply) for reply in pipe.execute()])
    deadline = time.monotonic() + 20
    while not os.path.exists(flag) and time.monotonic() < deadline:
        time.sleep(0.02)
    pipe.set(f"{key}:after", lease.fencing_token).incr(f"{key}:count")
    try:
        pipe.execute()
        _write(log, event="after", outcome="written")
    except rq_emq.LeaseLost:
        _write(log, event="after", outcome="refused")
    while lease.held and time.monotonic() < deadline:
        time.sleep(0.02)
    try:
        lease.raise_if_lost()
        _write(log, event="lost", outcome="still held")
    except rq_emq.LeaseLost:
        _write(log, event="lost", outcome="raised", held=lease.held)
    return "done"


def until_stopping(log: str, seconds: float) -> str:
    """Run until the worker is asked to stop (or ``seconds`` pass), then end early."""
    _write(log, event="run", **_seen(log))
    deadline = time.monotonic() + seconds
    lease = rq_emq.current_lease()
    assert lease is not None
    while not lease.stopping and time.monotonic() < deadline:
        time.sleep(0.02)
    _write(log, event="end", stopping=lease.stopping)
    return "stopped early" if lease.stopping else "ran out"


def report_progress(log: str, steps: int, every_s: float) -> str:
    """Report each step through the lease (``report``), ``every_s`` apart."""
    _write(log, event="run", **_seen(log))
    lease = rq_emq.current_lease()
    assert lease is not None
    for step in range(1, steps + 1):
        lease.report(step / steps, step=step, of=steps)
        time.sleep(every_s)
    return "done"


def report_note(log: str, note: str, seconds: float) -> str:
    """Report ``note`` (a filename, say: end-user data) once, then run for ``seconds``."""
    _write(log, event="run", **_seen(log))
    lease = rq_emq.current_lease()
    assert lease is not None
    lease.report(0.5, note=note)
    time.sleep(seconds)
    return "done"


def silent(log: str, seconds: float) -> str:
    """Run for ``seconds`` without a report: a job hung on a dead socket, as a lease sees it."""
    _write(log, event="run", **_seen(log))
    time.sleep(seconds)
    _write(log, event="end")
    return "done"


def report_and_time_its_landing(log: str) -> str:
    """Report once, then watch the job hash until the report is there: how long it took."""
    from rq import get_current_job

    lease, job = rq_emq.current_lease(), get_current_job()
    assert lease is not None and job is not None
    lease.report("half", step=1)
    sent = time.monotonic()
    while job.connection.hget(job.key, "emq_report") is None and time.monotonic() - sent < 30:
        time.sleep(0.005)
    _write(log, event="landed", after_s=time.monotonic() - sent)
    return "done"


def fenced_write_then_raise(log: str, flag: str, lose_first: bool) -> str:
    """Wait for ``flag`` (the test may take the lease away first), then write through the
    fenced pipeline and let what it raises (LeaseLost once the lease is gone) end the run;
    with the lease still held, raise an error of the job's own."""
    lease = rq_emq.current_lease()
    assert lease is not None
    _write(log, event="run", **_seen(log))
    deadline = time.monotonic() + 20
    while not os.path.exists(flag) and time.monotonic() < deadline:
        time.sleep(0.02)
    lease.fenced_pipeline().set("effect", lease.fencing_token).execute()
    if not lose_first:
        raise RuntimeError("the job's own failure")
    return "unreachable: the write above raised LeaseLost"


def record_failure_callback(job: Any, connection: Any, kind: Any, value: Any, traceback: Any) -> None:
    """An ``on_failure`` callback: one line in the log its job names (``job.args[0]``)."""
    _write(job.args[0], event="failure callback", error=type(value).__name__)
