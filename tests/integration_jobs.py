"""Jobs for the integration tests (workers import them: tests/ is on their PYTHONPATH)."""

from __future__ import annotations

import time

from jobs import record, runs


def slow_on_first_run(log: str, seconds: float) -> str:
    """Sleeps ``seconds`` on its first run (so a test can kill its worker mid-job) and
    returns at once on any later run (so the recovered job finishes promptly)."""
    first = not any(line.startswith("start") for line in runs(log))
    record(log, "start")
    if first:
        time.sleep(seconds)
    record(log, "end")
    return "done"
