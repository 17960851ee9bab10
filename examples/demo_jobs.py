"""Jobs for the crash demo (workers import this module; examples/ is on their PYTHONPATH)."""

from __future__ import annotations

import os
import time


def work(seconds: float, log: str) -> str:
    with open(log, "a") as out:
        out.write(f"start {os.getpid()}\n")
    time.sleep(seconds)
    return f"done by pid {os.getpid()}"
