"""A named daemon thread that runs one loop until stopped: the lock manager's timer and
the sweeper are both one of these."""

from __future__ import annotations

import threading
from typing import Protocol


class Stopping(Protocol):
    """What a loop waits on: a ``threading.Event``, or a command's stop signals."""

    def is_set(self) -> bool: ...

    def wait(self, timeout: float | None = None) -> bool: ...


class BackgroundLoop:
    """Runs :meth:`loop` in a daemon thread; :meth:`stop` ends it and waits for it."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def loop(self, stop: Stopping) -> None:
        raise NotImplementedError

    def start(self) -> None:
        if self._thread is not None and self._thread.is_alive():
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self.loop, args=(self._stop,), name=self.name, daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)
        self._thread = None
