"""The self-fencing horse: the local lease deadline of the job a horse runs, in memory
the worker shares with it, and the thread in the horse that ends it past that deadline.

A horse must not depend on its worker being scheduled: a worker that is SIGSTOPped,
swapped out or cut off from Redis stops moving the deadline, and the horse ends itself
when it passes, before the sweep may hand the job to another worker.
"""

from __future__ import annotations

import ctypes
import functools
import math
import mmap
import os
import signal
import struct
import tempfile
import threading
import time
from typing import Any


class HorseDeadline:
    """The local lease deadline of the job a horse runs, in memory shared by the worker
    and its horse (an anonymous shared ``mmap`` made before the fork). The worker writes it
    after each renewal; a thread in the horse SIGKILLs the horse once ``time.monotonic()``
    (CLOCK_MONOTONIC, one clock for every process on a host) has passed it."""

    def __init__(self, path: str | None = None) -> None:
        """Anonymous memory, shared with a forked horse; or, with ``path``, a file's
        (``shared_file``), which a horse started as a new program maps too (``attach``)."""
        self.path = path
        if path is None:
            self._memory = mmap.mmap(-1, 8)  # MAP_SHARED | MAP_ANONYMOUS: survives the fork shared
            self.set(math.inf)
            return
        fd = os.open(path, os.O_RDWR)
        try:
            self._memory = mmap.mmap(fd, 8)  # MAP_SHARED: every process mapping the file sees writes
        finally:
            os.close(fd)

    @classmethod
    def shared_file(cls) -> HorseDeadline:
        """A deadline in a new file (in memory where /dev/shm exists), for a spawned horse."""
        where = "/dev/shm" if os.path.isdir("/dev/shm") else None
        fd, path = tempfile.mkstemp(prefix="rq-emq-horse-deadline-", dir=where)
        try:
            os.ftruncate(fd, 8)
        finally:
            os.close(fd)
        deadline = cls(path)
        deadline.set(math.inf)
        return deadline

    def remove(self) -> None:
        """Delete a ``shared_file``'s file (the worker, as it stops)."""
        if self.path is not None:
            try:
                os.unlink(self.path)
            except FileNotFoundError:
                pass

    def set(self, deadline: float) -> None:
        self._memory[0:8] = struct.pack("d", deadline)

    def get(self) -> float:
        # read until two reads agree: a read torn by a concurrent write is never acted on
        while True:
            first = self._memory[0:8]
            if self._memory[0:8] == first:
                return float(struct.unpack("d", first)[0])

    def guard(self, interval_s: float) -> None:
        """In the horse: start the thread that ends it past the deadline. It runs until
        the horse exits; a kill in the fenced finish writes nothing half-done."""
        thread = threading.Thread(
            target=self._watch, args=(interval_s,), name="rq-emq-horse-fence", daemon=True
        )
        thread.start()

    def _watch(self, interval_s: float) -> None:
        while True:
            if time.monotonic() > self.get():
                os.kill(os.getpid(), signal.SIGKILL)
            time.sleep(interval_s)


_PR_SET_PDEATHSIG = 1


@functools.cache
def libc() -> Any:
    """The C library, loaded once in the worker so that each horse need not load it."""
    try:
        return ctypes.CDLL(None, use_errno=True)
    except OSError:
        return None


def die_with_parent(parent_pid: int) -> None:
    """Ask Linux to SIGKILL this horse when its worker dies, so a lapsed lease means that
    nobody works on the job any more (RQ puts the horse in its own process group)."""
    try:
        libc().prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except AttributeError:  # not Linux (no prctl): the worker's cold stop still kills it
        return
    if os.getppid() != parent_pid:  # the worker died before prctl took effect
        os._exit(1)
