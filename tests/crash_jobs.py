"""Jobs that end their own work horse without an outcome, as the OOM killer, a C
extension's segfault or a stray ``os._exit`` would; workers import them (tests/ is on
their PYTHONPATH). Each run appends a line to ``log`` first: the runs' own record."""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import time
from pathlib import Path


def _runs_so_far(log: str) -> int:
    with open(log, "a") as out:
        out.write(f"run {os.getpid()} {time.time():.6f}\n")
    return len(Path(log).read_text().splitlines())


def die(how: str) -> None:
    """End this process without an outcome: ``kill`` (SIGKILL, as the OOM killer sends),
    ``segv`` (a real segfault: a read of address 0), ``exit`` (``os._exit(1)``)."""
    if how == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    elif how == "segv":
        ctypes.string_at(0)
    elif how == "exit":
        os._exit(1)
    raise ValueError(how)


def crash_first(
    log: str, how: str, crashes: int = 1, result: object = "done", then_sleep: float = 0
) -> object:
    """Crash the first ``crashes`` runs (``how``, see :func:`die`), then sleep
    ``then_sleep`` seconds and succeed."""
    if _runs_so_far(log) <= crashes:
        die(how)
    time.sleep(then_sleep)
    return result


def poison(log: str, how: str = "kill") -> None:
    """A poison pill: every run kills its horse."""
    _runs_so_far(log)
    die(how)


def sleep_then(log: str, seconds: float) -> str:
    """Record the run, then sleep (a job for the deliberate kills: timeout, stop, shutdown)."""
    _runs_so_far(log)
    time.sleep(seconds)
    return "slept"


def raise_after_run(log: str) -> None:
    _runs_so_far(log)
    raise RuntimeError("boom")


def crash_odd_raise_even(log: str) -> None:
    """Odd runs kill their horse, even runs raise: crashes and RQ's ``Retry`` interleaved."""
    if _runs_so_far(log) % 2:
        die("kill")
    raise RuntimeError("planned failure")


def exit_cleanly_first(log: str) -> str:
    """The first run exits with status 0 without an outcome (a stray ``sys.exit(0)``-like
    ``os._exit(0)``); later runs succeed."""
    if _runs_so_far(log) == 1:
        os._exit(0)
    return "done"


def child_then_die(log: str, child_log: str, own_group: bool = False) -> str:
    """The first run starts a child process (as a job running ffmpeg or a script would),
    which appends a line to ``child_log`` every 20 ms (``tick <time.time()>``), then kills
    its own horse; the next run succeeds. ``own_group``: the child leads a process group of its own
    (``process_group=0``), out of the horse's group."""
    if _runs_so_far(log) == 1:
        script = (
            f"import time\nwhile True:\n    open({child_log!r}, 'a').write('tick %f\\n' % time.time()); "
            "time.sleep(0.02)"
        )
        subprocess.Popen([sys.executable, "-c", script], preexec_fn=os.setpgrp if own_group else None)
        deadline = time.monotonic() + 30
        while not os.path.exists(child_log) and time.monotonic() < deadline:
            time.sleep(0.01)  # until the child is ticking (its start may be slow on a loaded host)
        die("kill")
    return "done"
