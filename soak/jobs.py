"""The soak's job function and its side-effect log.

Every run appends one ``start`` line when it begins and one ``end`` line when the job
function returns or raises (``O_APPEND``, one ``write`` per line, so lines from concurrent
runs never interleave):

    start <job_id> <pid> <ppid> <unix time> <attempt> <rq start> <fencing token>
    alive <job_id> <pid> <unix time>          (every TICK_S while it runs)
    alive <job_id> <pid> <unix time> <start>  (the same, from a thread of the run started at
                                              ``<start>``, its start line's time)
    effect <job_id> <pid> <unix time> <token>|- counted|again|refused|nolease
                                              (a fenced job's effect, :mod:`soak.effects`)
    end <job_id> <pid> <unix time> ok|raise|lost
    failure <job_id> <pid> <unix time>         (its ``on_failure`` callback ran)

A fenced job's run writes its effect at the end of its work (only on the way to
returning: a run that raises has no effect), logs what became of it, and spends the
rest of its time on its wrap-up before it returns (:mod:`soak.effects`); a run whose
fenced write the fence refused (its lease is lost: a newer grant owns the job) returns at
once, ``lost``, as a user's job would (``examples/fenced_effects.py``), and its outcome is
refused by the fence too.

A run stopped before its end (killed, or fenced by its own holder) was last seen alive
at its last ``alive`` line: the no-overlap check (:mod:`soak.overlap`) needs that, not
just its start, to see a run that went on after its job began elsewhere.

A run's ``body`` is what does its work: ``sleep`` (the run itself), ``child`` /
``child_session`` (a child process it waits on, in the run's process group or in a
session of its own, writes the run's ``alive`` lines under the run's pid: a child that
outlives its stopped run shows as the run going on), or ``gil`` (the run spends
``seconds`` in C code holding the GIL, then writes one ``alive`` line: a run that went on
past a stop shows by that line and its end), or ``pool`` / ``thread`` (the run's work done
on threads: a ``ThreadPoolExecutor`` of two, or one ``Thread``, that the run waits for;
each thread writes its own ``alive`` lines naming the run by its start, so a thread that
outlives its run's frame, as a stop in a ``SimpleLeaseWorker`` unwinds it, shows as the
run going on, even after the run's ``end`` line and under the same pid as a later run).

``attempt`` is the job hash's ``emq_attempts`` as the run begins (``-`` under stock RQ).
``rq start`` is the time the horse stamped on the job as it wrote status ``started``
(``last_heartbeat``, taken before that write commits): a run whose start committed
before a cancel or delete has an earlier stamp than the moment that call returned.
``fencing token`` is the run's grant's (``current_lease().fencing_token``; ``-`` under
stock RQ): the tokens of a job's runs must rise, across a loss of Redis' data too.
The log counts runs independently of anything the workers write to Redis.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import Any

from rq import get_current_job

from .effects import WRAP_UP, write_effect

#: How often a run writes an ``alive`` line: the resolution of the no-overlap check.
TICK_S = 0.05


def append_line(path: str, line: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)


def _fencing_token() -> str:
    """This run's grant's fencing token, or ``-`` outside a lease (a stock worker's run,
    which never imports rq_emq)."""
    rq_emq = sys.modules.get("rq_emq")
    lease = rq_emq.current_lease() if rq_emq is not None else None
    return "-" if lease is None else str(lease.fencing_token)


def _attempt(job: object) -> str:
    try:
        raw = job.connection.hget(job.key, "emq_attempts")  # type: ignore[attr-defined]
    except Exception:  # Redis unreachable (a fault); the run goes on without the number
        return "?"
    return raw.decode() if raw else "-"


#: A run's child: ``alive`` lines for its run (job id, run pid) every TICK_S for a while.
_CHILD = """
import os, sys, time
log, job_id, run, until = sys.argv[1], sys.argv[2], sys.argv[3], time.monotonic() + float(sys.argv[4])
while (left := until - time.monotonic()) > 0:
    time.sleep(min(left, float(sys.argv[5])))
    fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    os.write(fd, f"alive {job_id} {run} {time.time():.6f}\\n".encode())
    os.close(fd)
"""


def hold_gil(seconds: float) -> None:
    """About ``seconds`` in one C call that never lets the GIL go (``sum`` over a
    ``range`` of small ints checks no eval breaker), sized by a short calibration."""
    began = time.perf_counter()
    sum(range(200_000))
    rate = 200_000 / max(time.perf_counter() - began, 1e-6)
    sum(range(int(seconds * rate)))


def work(
    log: str, seconds: float, outcome: str = "ok", retries: int = 0, body: str = "sleep", effect: bool = False
) -> str:
    """Work ``seconds`` (``body``: see the module's docstring); ``outcome`` ok returns,
    raise raises, flaky raises while the job still has all of its ``retries`` left (its
    first run that got to the end). With ``effect`` (a fenced job), a run that is to return
    writes its effect at the end of its work (:mod:`soak.effects`), then spends the last
    ``WRAP_UP`` of its time on its wrap-up before it returns."""
    job = get_current_job()
    assert job is not None
    stamp = job.last_heartbeat.timestamp() if job.last_heartbeat is not None else 0.0
    began = f"{time.time():.6f}"
    append_line(
        log,
        f"start {job.id} {os.getpid()} {os.getppid()} {began} {_attempt(job)} {stamp:.6f} {_fencing_token()}",
    )
    fails = outcome == "raise" or (outcome == "flaky" and job.retries_left == retries)
    wrap_up = seconds * WRAP_UP if effect and not fails else 0.0
    busy(log, job.id, seconds - wrap_up, body, began)
    if effect and not fails:
        what, token = write_effect(job.connection, job.id)
        shown = "-" if token is None else token
        append_line(log, f"effect {job.id} {os.getpid()} {time.time():.6f} {shown} {what}")
        if what == "refused":  # a newer grant owns the job: this run's outcome is refused too
            append_line(log, f"end {job.id} {os.getpid()} {time.time():.6f} lost")
            return "lost"
        busy(log, job.id, wrap_up, "sleep")
    append_line(log, f"end {job.id} {os.getpid()} {time.time():.6f} {'raise' if fails else 'ok'}")
    if fails:
        raise ValueError(f"soak: job {job.id} raised as planned ({outcome})")
    return "done"


def busy(log: str, job_id: str, seconds: float, body: str, began: str = "") -> None:
    """``seconds`` of a run's work, done by ``body`` (see the module's docstring); ``began``
    is the run's start line's time, which a thread's lines name the run by."""
    if body == "pool":
        # the pool is left to finish on its own (no ``with``): a stop that unwinds this
        # frame leaves its threads working, as a user's pool would be
        pool = ThreadPoolExecutor(2, thread_name_prefix=f"soak-{job_id[:8]}")
        futures = [pool.submit(_thread_work, log, job_id, began, seconds) for _ in range(2)]
        wait(futures)
        pool.shutdown(wait=False)
    elif body == "thread":
        worker = threading.Thread(target=_thread_work, args=(log, job_id, began, seconds), daemon=False)
        worker.start()
        worker.join()
    elif body in ("child", "child_session"):
        args = [log, job_id, str(os.getpid()), str(seconds), str(TICK_S)]
        subprocess.run([sys.executable, "-c", _CHILD, *args], start_new_session=body == "child_session")
    elif body == "gil":
        hold_gil(seconds)
        append_line(log, f"alive {job_id} {os.getpid()} {time.time():.6f}")
    else:
        until = time.monotonic() + seconds
        while (left := until - time.monotonic()) > 0:
            time.sleep(min(left, TICK_S))
            append_line(log, f"alive {job_id} {os.getpid()} {time.time():.6f}")


def _thread_work(log: str, job_id: str, began: str, seconds: float) -> None:
    """A run's thread: ``seconds`` of work, an ``alive`` line naming its run every TICK_S."""
    until = time.monotonic() + seconds
    while (left := until - time.monotonic()) > 0:
        time.sleep(min(left, TICK_S))
        append_line(log, f"alive {job_id} {os.getpid()} {time.time():.6f} {began}")


def on_failure(job: Any, connection: Any, exc_type: Any, exc_value: Any, tb: Any) -> None:
    """Every soak job's ``on_failure``: a real side effect (an email, a refund), so the log
    records each call, wherever it runs (the horse after a raise, the outbox drain after a
    failure at max attempts). The log is the job's first argument (``work``'s ``log``)."""
    append_line(str(job.args[0]), f"failure {job.id} {os.getpid()} {time.time():.6f}")


def log_lines(path: str) -> list[str]:
    """The side-effect log's lines; none before the first run wrote one."""
    try:
        with open(path) as log:
            return log.read().splitlines()
    except FileNotFoundError:
        return []


def read_failure_callbacks(path: str) -> dict[str, list[float]]:
    """Job id -> the times its failure callback ran."""
    calls: dict[str, list[float]] = {}
    for line in log_lines(path):
        parts = line.split()
        if len(parts) == 4 and parts[0] == "failure":
            calls.setdefault(parts[1], []).append(float(parts[3]))
    return calls


@dataclass
class Run:
    """One run of a job, from the side-effect log."""

    job_id: str
    pid: int
    ppid: int
    started: float
    attempt: int | None
    ended: float | None = None
    outcome: str | None = None
    #: when RQ marked it started (the horse's stamp); None in logs that predate the field
    rq_started: float | None = None
    #: the last time the run was seen alive (its last ``alive`` line, else its start)
    last_seen: float | None = None
    #: a fenced job's run: what became of its effect (counted, again, refused, nolease;
    #: None: it wrote none) and the fencing token it wrote under
    effect: str | None = None
    token: int | None = None
    #: its grant's fencing token, from its start line (None: a stock run, or an older log)
    fence: int | None = None
    #: the last ``alive`` line of a thread of this run (``pool``/``thread`` bodies), wherever
    #: it falls: after the run's ``end`` line too (a thread its frame left running)
    threads_seen: float | None = None


def read_runs(path: str) -> dict[str, list[Run]]:
    """Runs per job id, in start order; a start with no end is a run that was cut short."""
    runs: dict[str, list[Run]] = {}
    open_runs: dict[tuple[str, int], Run] = {}
    #: every run by (job, pid, its start line's time as written): a thread's lines name it so
    by_start: dict[tuple[str, int, str], Run] = {}
    for line in log_lines(path):
        parts = line.split()
        if len(parts) in (6, 7, 8) and parts[0] == "start":
            _, job_id, pid, ppid, t, attempt = parts[:6]
            run = Run(job_id, int(pid), int(ppid), float(t), int(attempt) if attempt.isdigit() else None)
            run.rq_started = float(parts[6]) if len(parts) >= 7 and float(parts[6]) > 0 else None
            run.fence = int(parts[7]) if len(parts) == 8 and parts[7].isdigit() else None
            runs.setdefault(job_id, []).append(run)
            open_runs[(job_id, run.pid)] = run
            by_start[(job_id, run.pid, t)] = run
        elif len(parts) == 5 and parts[0] == "alive":
            owner = by_start.get((parts[1], int(parts[2]), parts[4]))
            if owner is not None:
                owner.threads_seen = max(owner.threads_seen or owner.started, float(parts[3]))
        elif len(parts) in (4, 6) and parts[0] in ("alive", "effect"):
            alive = open_runs.get((parts[1], int(parts[2])))
            if alive is not None:
                alive.last_seen = max(alive.last_seen or alive.started, float(parts[3]))
                if parts[0] == "effect":
                    alive.effect, alive.token = parts[5], int(parts[4]) if parts[4].isdigit() else None
        elif len(parts) == 5 and parts[0] == "end":
            _, job_id, pid, t, outcome = parts
            started = open_runs.pop((job_id, int(pid)), None)
            if started is not None:
                started.ended, started.outcome = float(t), outcome
    for job_runs in runs.values():
        job_runs.sort(key=lambda run: run.started)
    return runs
