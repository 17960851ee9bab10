"""Job functions the tests enqueue; workers import them (tests/ is on their PYTHONPATH)."""

from __future__ import annotations

import os
import time
from pathlib import Path


def record(log: str, tag: str = "run") -> None:
    """Append one line per run, with the pid: the side-effect log counts runs."""
    with open(log, "a") as out:
        out.write(f"{tag} {os.getpid()}\n")


def runs(log: str) -> list[str]:
    path = Path(log)
    return path.read_text().splitlines() if path.exists() else []


def sleep_and_record(log: str, seconds: float, result: object = "done") -> object:
    record(log, "start")
    time.sleep(seconds)
    record(log, "end")
    return result


def add(a: int, b: int) -> int:
    return a + b


def fail(message: str = "boom") -> None:
    raise ValueError(message)


def fail_and_record(log: str) -> None:
    record(log)
    raise ValueError("boom")


def noop() -> None:
    return None


def on_failure_record(
    job: object, connection: object, exc_type: object, exc_value: object, tb: object
) -> None:
    """A failure callback that leaves a trace in the file named by the job's meta."""
    with open(job.meta["log"], "a") as out:  # type: ignore[attr-defined]
        out.write(f"failed {exc_type.__name__}\n")  # type: ignore[attr-defined]


def record_event(event: object) -> None:
    """A lease event hook (``RQ_EMQ_EVENT_HOOKS=jobs:record_event``): one line per event in
    the file named by EMQ_TEST_EVENT_LOG."""
    with open(os.environ["EMQ_TEST_EVENT_LOG"], "a") as out:
        out.write(f"{event.kind} {event.job_id} {event.queue} {os.getpid()}\n")  # type: ignore[attr-defined]


def slow_hook(event: object) -> None:
    """A lease event hook that blocks on every event, as an HTTP call with no timeout does
    (``RQ_EMQ_EVENT_HOOKS=jobs:slow_hook``): records the event as :func:`record_event`
    does, then sleeps EMQ_TEST_HOOK_SECONDS."""
    record_event(event)
    time.sleep(float(os.environ["EMQ_TEST_HOOK_SECONDS"]))


def report_steadily(log: str, seconds: float, every: float) -> int:
    """Report progress every ``every`` seconds for ``seconds`` (``current_lease().report``),
    one line per run in ``log``; returns this run's attempt."""
    import rq_emq

    lease = rq_emq.current_lease()
    assert lease is not None
    record(log, f"start:{lease.attempt}")
    started = time.monotonic()
    step = 0
    while time.monotonic() - started < seconds:
        lease.report(step)
        step += 1
        time.sleep(every)
    record(log, "end")
    return lease.attempt


def sleep_record_and_fail(log: str, seconds: float) -> None:
    record(log, "start")
    time.sleep(seconds)
    record(log, "end")
    raise ValueError("planned failure")


def lose_lease_and_fail(log: str) -> None:
    """A job whose lease is taken away while it runs (as a recovery would), then raises:
    its worker's failure outcome must be fenced out."""
    from rq import get_current_job

    job = get_current_job()
    assert job is not None
    record(log, "start")
    job.connection.hset(job.key, "emq_token", "someone-else")
    raise ValueError("planned failure")


def lose_lease_and_succeed(log: str) -> str:
    """A job whose lease is taken away while it runs (as a recovery would), then returns:
    its worker's success outcome must be fenced out."""
    from rq import get_current_job

    job = get_current_job()
    assert job is not None
    record(log, "start")
    job.connection.hset(job.key, "emq_token", "someone-else")
    return "done"


def lose_lease_then_save_meta(log: str) -> str:
    """A job whose lease is taken away while it runs, then saves its meta: the guarded
    write is refused, and the refusal (``LeaseLost``) propagates out of the job."""
    from rq import get_current_job

    job = get_current_job()
    assert job is not None
    record(log, "start")
    job.connection.hset(job.key, "emq_token", "someone-else")
    job.meta["progress"] = 1
    job.save_meta()
    return "done"


def sleep_first_run_and_record(log: str, seconds: float) -> str:
    """Like sleep_and_record, but only the first run sleeps: a job killed mid-run whose
    rerun is quick."""
    first = not any(line.startswith("start") for line in runs(log))
    record(log, "start")
    if first:
        time.sleep(seconds)
    record(log, "end")
    return "done"


def _this_runs_length(log: str, seconds: float, later_s: float | None) -> float:
    """``seconds`` for the job's first run; ``later_s`` (when given) for a run after one
    (the rerun after a recovery, whose length no test measures: it only has to finish)."""
    if later_s is not None and any(line.startswith("start ") for line in runs(log)):
        return later_s
    return seconds


def ticking_run(log: str, seconds: float, later_s: float | None = None) -> str:
    """A run that leaves a trace while it lives: ``start``, then a ``tick`` every 20 ms,
    then ``end``, each line with the pid and ``time.monotonic()`` (CLOCK_MONOTONIC, one
    clock for every process on the host). A killed run's last tick is when it was last
    alive. A run after the first lasts ``later_s`` when given."""

    def line(tag: str) -> None:
        with open(log, "a") as out:
            out.write(f"{tag} {os.getpid()} {time.monotonic():.6f}\n")

    seconds = _this_runs_length(log, seconds, later_s)
    line("start")
    until = time.monotonic() + seconds
    while time.monotonic() < until:
        time.sleep(0.02)
        line("tick")
    line("end")
    return "done"


def ticking_run_saving_meta(
    log: str, seconds: float, save_at: float | str, later_s: float | None = None
) -> str:
    """A :func:`ticking_run` that saves its own meta ``save_at`` seconds in, or once the
    file named by ``save_at`` exists (a job that reports its progress the RQ way:
    ``job.meta[...] = ...; job.save_meta()``), and goes on whatever the save raised (a
    ``save`` line records the error's name, or ``ok``)."""
    from rq import get_current_job

    def line(tag: str) -> None:
        with open(log, "a") as out:
            out.write(f"{tag} {os.getpid()} {time.monotonic():.6f}\n")

    seconds = _this_runs_length(log, seconds, later_s)
    line("start")
    started = time.monotonic()
    until, saved = started + seconds, False
    while time.monotonic() < until:
        time.sleep(0.02)
        due = os.path.exists(save_at) if isinstance(save_at, str) else time.monotonic() >= started + save_at
        if not saved and due:
            saved, job = True, get_current_job()
            assert job is not None
            job.meta["progress"] = 0.5
            try:
                job.save_meta()
                outcome = "ok"
            except Exception as error:  # noqa: BLE001 (a job that goes on after any refusal)
                outcome = type(error).__name__
            with open(log, "a") as out:
                out.write(f"save:{outcome} {os.getpid()} {time.monotonic():.6f}\n")
        line("tick")
    line("end")
    return "done"


def run_spans(log: str) -> dict[int, tuple[float, float]]:
    """Per pid in a :func:`ticking_run` log: (first, last) monotonic time it was seen alive."""
    spans: dict[int, tuple[float, float]] = {}
    for text in runs(log):
        parts = text.split()
        if len(parts) != 3:
            continue
        pid, at = int(parts[1]), float(parts[2])
        first, last = spans.get(pid, (at, at))
        spans[pid] = (min(first, at), max(last, at))
    return spans


def uninterruptible_run(log: str, seconds: float, later_s: float | None = None) -> str:
    """A :func:`ticking_run` that no Python exception can interrupt (as if stuck in C code):
    it blocks SIGUSR1, the signal a ``SimpleLeaseWorker`` interrupts its job with."""
    import signal

    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1})
    return ticking_run(log, seconds, later_s)


#: A child process that ticks into a log under its run's pid, as a job's ffmpeg or script
#: works on: ``<tag> <run pid> <monotonic>``, tag ``child:<its own pid>``.
_CHILD = """
import os, sys, time
log, run, until = sys.argv[1], sys.argv[2], time.monotonic() + float(sys.argv[3])
if sys.argv[4] == "orphan" and os.fork():
    os._exit(0)  # a daemon's double fork: the ticking grandchild is orphaned at once
if sys.argv[4] != "group":
    os.setsid()
while time.monotonic() < until:
    with open(log, "a") as out:
        out.write(f"child:{os.getpid()} {run} {time.monotonic():.6f}\\n")
    time.sleep(0.02)
"""


def run_with_child(
    log: str, seconds: float, how: str = "group", uninterruptible: bool = False, later_s: float | None = None
) -> str:
    """A :func:`ticking_run` that first starts a child process ticking into the same log
    under this run's pid for ``seconds``, and waits on it as ``subprocess.run`` does. The
    child stays in this run's process group (``how="group"``), starts a session of its own
    (``"session"``), or is a daemon (``"orphan"``: its parent exits at once, it runs on in
    a session of its own, and the run sleeps while it ticks). ``uninterruptible``: no
    Python exception can interrupt the run (see :func:`uninterruptible_run`). A run after
    the first lasts ``later_s`` when given."""
    import signal
    import subprocess
    import sys

    seconds = _this_runs_length(log, seconds, later_s)
    if uninterruptible:
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1})
    me = str(os.getpid())
    with open(log, "a") as out:
        out.write(f"start {me} {time.monotonic():.6f}\n")
    subprocess.run([sys.executable, "-c", _CHILD, log, me, str(seconds), how])
    if how == "orphan":
        time.sleep(seconds)
    return ticking_run(log, 0.0)


def children(log: str) -> list[int]:
    """The pids of the :func:`run_with_child` children seen in ``log``."""
    return sorted({int(line.split()[0].split(":")[1]) for line in runs(log) if line.startswith("child:")})


def hold_gil_first_run(log: str, letters: int) -> str:
    """The first run spends long in C code that holds the GIL (catastrophic regex
    backtracking: about 2**letters steps), so no other thread of its process runs; a
    later run returns at once. Lines as :func:`ticking_run`'s."""
    import re

    first = not runs(log)
    ticking_run(log, 0.0)
    if first:
        re.match(r"(a+)+$", "a" * letters + "b")
        ticking_run(log, 0.0)
    return "done"


def _tick(log: str, tag: str) -> None:
    """One :func:`ticking_run` line: ``<tag> <pid> <monotonic>``."""
    with open(log, "a") as out:
        out.write(f"{tag} {os.getpid()} {time.monotonic():.6f}\n")


def ticking_run_with_finally(log: str, seconds: float, finally_s: float, later_s: float | None = None) -> str:
    """A :func:`ticking_run` whose clean-up, once the run is interrupted (a stop's
    ``SystemExit``), goes on in its ``finally:`` for ``finally_s``, ticking (``cleanup``
    lines, then ``cleaned``), as a job that closes a transfer or rolls back its work does."""
    interrupted = True
    try:
        ticking_run(log, _this_runs_length(log, seconds, later_s))
        interrupted = False
    finally:
        if interrupted:
            until = time.monotonic() + finally_s
            while time.monotonic() < until:
                time.sleep(0.02)
                _tick(log, "cleanup")
            _tick(log, "cleaned")
    return "done"


def swallowing_run(log: str, seconds: float, later_s: float | None = None) -> str:
    """A :func:`ticking_run` that swallows every exception in a bare ``except:`` and carries
    on (``swallowed`` lines): a stop's interrupt never ends it, only the end of its process."""
    seconds = _this_runs_length(log, seconds, later_s)
    _tick(log, "start")
    until = time.monotonic() + seconds
    while time.monotonic() < until:
        try:
            time.sleep(0.02)
            _tick(log, "tick")
        except:  # noqa: E722 - the point: it swallows SystemExit and the lease interrupt too
            _tick(log, "swallowed")
    _tick(log, "end")
    return "done"


def process_age() -> tuple[int, float]:
    """This process's pid, and how long it has existed (seconds): a horse forked for its
    job is milliseconds old as the job starts, one forked ahead as old as its wait."""
    with open("/proc/self/stat") as stat:
        start_ticks = int(stat.read().rsplit(")", 1)[1].split()[19])
    age = time.clock_gettime(time.CLOCK_BOOTTIME) - start_ticks / os.sysconf("SC_CLK_TCK")
    return os.getpid(), age


def swallow_then_hold_gil(log: str, letters: int) -> str:
    """Ticks until an exception reaches it (a stop's interrupt), swallows it, then spends
    long in one C call that holds the GIL (about 2**letters steps): after a stop, only the
    end of its process ends it."""
    import re

    _tick(log, "start")
    try:
        while True:
            time.sleep(0.02)
            _tick(log, "tick")
    except BaseException:  # noqa: BLE001 - the point: it swallows the stop's interrupt
        _tick(log, "swallowed")
    re.match(r"(a+)+$", "a" * letters + "b")
    _tick(log, "end")
    return "done"
