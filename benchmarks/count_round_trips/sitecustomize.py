"""Counts a process's Redis round trips, for benchmarks that run real worker processes.

On the ``PYTHONPATH`` of a process (with ``BENCH_ROUND_TRIPS_DIR`` set), this module is
imported at start-up: every request redis-py sends (one per single command, one per
pipeline) adds one, and the total is written to ``<dir>/<pid>`` when the process ends,
including a forked horse that leaves through ``os._exit``.
"""

from __future__ import annotations

import atexit
import os
from pathlib import Path
from typing import Any

_DIR = os.environ.get("BENCH_ROUND_TRIPS_DIR")
_count = 0


def _write() -> None:
    if _DIR and _count:
        (Path(_DIR) / str(os.getpid())).write_text(str(_count))


def _install() -> None:
    from redis.connection import AbstractConnection

    original = AbstractConnection.send_packed_command

    def send_packed_command(self: Any, command: Any, check_health: bool = True) -> None:
        global _count
        _count += 1
        original(self, command, check_health)

    AbstractConnection.send_packed_command = send_packed_command  # type: ignore[method-assign]
    real_exit = os._exit

    def _exit(code: int) -> None:
        _write()
        real_exit(code)

    os._exit = _exit  # type: ignore[assignment]

    def forked() -> None:  # a child starts from zero
        global _count
        _count = 0

    os.register_at_fork(after_in_child=forked)
    atexit.register(_write)


if _DIR:
    _install()
