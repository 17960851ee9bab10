"""A horse's end, told by the horse: its worker goes on as soon as the run is over.

Stock RQ's worker waits for its horse's exit (``os.wait4``), and a forked horse's exit is
slow: the kernel unmaps every page the horse shared with its worker, about 1.5-2 ms on a
worker's 40 MB, all of it after the run is over (its outcome written, its connection
closed, nothing left but ``os._exit(0)``). A ``LeaseWorker`` gives its horse one end of a
pipe instead: once ``perform_job`` has returned, the horse closes its Redis connection and
writes one byte, and the worker, waiting on that pipe and on the horse's pidfd at once,
takes its next job while the kernel tears the old horse down on the other CPU. The old
horse is reaped later (before the next fork, at the next wait, at the worker's end).

Nothing is decided from absence: only the byte says the run is over, and the horse writes
it after its last step but ``os._exit(0)``. A horse that ends any other way (a crash, a
kill, ``os._exit(1)`` when ``perform_job`` raised) writes none, and its pidfd wakes the
worker, which reaps it as RQ does (its exit status then decides, as before). Where Linux
has no ``pidfd_open`` (before 5.3), the worker waits for the exit as stock RQ does.
"""

from __future__ import annotations

import contextlib
import os
import select
import time
from typing import Any

#: what the horse writes once nothing is left of its run but ``os._exit(0)``
DONE = b"."
#: How long a reap that may wait waits for a told horse's exit to complete.
REAP_WAIT_S = 1.0


class HorseEnd:
    """The worker's side and the horse's side of one run's end-of-run pipe."""

    def __init__(self) -> None:
        self._read_fd = -1
        self._write_fd = -1
        self._pidfd = -1
        #: horses that told their end and are still exiting (reaped without waiting)
        self.exiting: list[int] = []

    # -- in the worker --------------------------------------------------------------------
    def before_fork(self) -> None:
        self.close()
        self._read_fd, self._write_fd = os.pipe()  # close-on-exec: no job's exec keeps it

    def forked(self, horse_pid: int) -> None:
        """In the worker, once forked: its copy of the horse's end closed (so that the pipe
        reads as ended once no horse holds it), and a pidfd on the horse."""
        self._close_write()
        try:
            self._pidfd = os.pidfd_open(horse_pid)
        except (AttributeError, OSError):  # Python < 3.9 or Linux < 5.3: wait for the exit
            self.close()

    def wait_told(self, horse_pid: int) -> bool:
        """Wait until the horse says its run is over (True) or it ends without saying so
        (False: reap it as RQ does). A signal's handler that raises (RQ's monitoring
        alarm) interrupts the wait, which RQ then starts again."""
        if self._read_fd < 0 or self._pidfd < 0:
            return False
        ready, _, _ = select.select([self._read_fd, self._pidfd], [], [])
        if self._read_fd not in ready:
            return False  # it ended without a word
        told = os.read(self._read_fd, 1) == DONE
        if told:
            self.exiting.append(horse_pid)
        self.close()
        return told

    def reap_exited(self, block: bool = False) -> None:
        """Reap the horses that told their end, once they have exited; with ``block``,
        waiting for that up to :data:`REAP_WAIT_S` (an exit takes milliseconds; one held
        in the kernel longer is left for a later call)."""
        deadline = time.monotonic() + (REAP_WAIT_S if block else 0.0)
        while self.exiting:
            for pid in list(self.exiting):
                try:
                    done, _ = os.waitpid(pid, os.WNOHANG)
                except ChildProcessError:  # reaped already (by a wait of RQ's own)
                    done = pid
                if done:
                    self.exiting.remove(pid)
            if not self.exiting or time.monotonic() >= deadline:
                return
            time.sleep(0.002)

    def close(self) -> None:
        self._close("_write_fd", "_read_fd", "_pidfd")

    def _close_write(self) -> None:
        self._close("_write_fd")

    def _close(self, *names: str) -> None:
        for name in names:
            fd = getattr(self, name)
            if fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(fd)
                setattr(self, name, -1)

    # -- in the horse ---------------------------------------------------------------------
    def in_horse(self) -> None:
        """First thing in the horse: the worker's side of the pipe is not its own."""
        self._close("_read_fd", "_pidfd")
        self.exiting = []

    def tell_done(self, connection: Any) -> None:
        """In the horse, after its last step but ``os._exit(0)``: its Redis connection
        closed (so that the worker's own, opened next, never makes a fourth), then the
        byte. A worker already gone (EPIPE) has nothing to be told."""
        if self._write_fd < 0:
            return
        with contextlib.suppress(Exception):
            connection.connection_pool.disconnect()
        with contextlib.suppress(OSError):
            os.write(self._write_fd, DONE)
        self._close_write()
