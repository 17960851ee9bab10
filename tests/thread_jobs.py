"""Jobs whose work runs on threads, as many real jobs' does: a ``ThreadPoolExecutor`` whose
result the job waits for, or a ``Thread`` it joins. A stop interrupts the job's own frame
(the wait), not its threads, which work on until their process ends.

Each writes a :func:`jobs.ticking_run` log: ``start`` from the job's frame, then ``tick``
lines from its worker thread every 20 ms, each ``<tag> <pid> <monotonic>``; ``end`` once the
job returns. A run's last tick is when its threads were last alive."""

from __future__ import annotations

import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from jobs import runs


def _line(log: str, tag: str) -> None:
    with open(log, "a") as out:
        out.write(f"{tag} {os.getpid()} {time.monotonic():.6f}\n")


def _work(log: str, seconds: float) -> str:
    until = time.monotonic() + seconds
    while time.monotonic() < until:
        time.sleep(0.02)
        _line(log, "tick")
    return "done"


def threaded_run(log: str, seconds: float, how: str, later_s: float | None = None) -> str:
    """Work for ``seconds`` on a thread (``how``: ``pool`` or ``thread``), the job's frame
    waiting for it; a run after the first lasts ``later_s`` when given."""
    if later_s is not None and any(line.startswith("start ") for line in runs(log)):
        seconds = later_s
    _line(log, "start")
    if how == "pool":
        pool = ThreadPoolExecutor(max_workers=1)  # no `with`: its exit would wait for the work
        result = pool.submit(_work, log, seconds).result()
    else:
        thread = threading.Thread(target=_work, args=(log, seconds))
        thread.start()
        thread.join()
        result = "done"
    _line(log, "end")
    return result
