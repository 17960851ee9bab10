"""Ctrl-C and SIGTERM for the ``rq-emq`` commands that loop in their main thread (the
reaper, ``status --watch``): a stop the loop waits on, set by a handler that takes no lock.

A handler that sets a ``threading.Event`` takes the event's condition lock. A signal runs
its handler in the main thread between two bytecodes, and if that is inside the loop's own
``Event.wait``, where the same thread holds that lock, the handler waits on it for ever:
the process sleeps on and never exits (1 SIGTERM in 200 hung a loop of short waits, and a
reaper under CI's load hung so). Here the handler sets a flag and writes a byte to a
pipe, and the wait is a ``select`` on the pipe, which the byte wakes at once.
"""

from __future__ import annotations

import os
import select
import signal
from types import FrameType, TracebackType
from typing import Any

SIGNALS = (signal.SIGINT, signal.SIGTERM)


class StopSignals:
    """A context in which SIGINT and SIGTERM stop the loop (``is_set``, ``wait`` as a
    ``threading.Event`` offers them); the previous handlers come back on exit."""

    def __init__(self) -> None:
        self._stopped = False
        self._read, self._write = os.pipe()
        os.set_blocking(self._write, False)
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> StopSignals:
        self._previous = {sig: signal.signal(sig, self._on_signal) for sig in SIGNALS}
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        os.close(self._read)
        os.close(self._write)

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self._stopped = True
        try:
            os.write(self._write, b"\0")
        except OSError:  # the pipe is full: a wake-up is already waiting
            pass

    def is_set(self) -> bool:
        return self._stopped

    def wait(self, timeout: float | None = None) -> bool:
        """Sleep up to ``timeout`` seconds, or until a stop signal; whether stopped."""
        if not self._stopped:
            select.select([self._read], [], [], timeout)
        return self._stopped
