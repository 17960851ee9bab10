"""A horse's end, told by the horse: its worker goes on as soon as the run is over.

Stock RQ's worker waits for its horse's exit (``os.wait4``), and a forked horse's exit is
slow: the kernel unmaps every page the horse shared with its worker, about 1.5-2 ms on a
worker's 40 MB, all of it after the run is over (its outcome written, nothing left but
``os._exit(0)``). A ``LeaseWorker`` gives its horse one end of a Unix socket pair instead:
once ``perform_job`` has returned, the horse writes one byte, and the worker, waiting on
that socket and on the horse's pidfd at once, takes its next job while the kernel tears
the old horse down on the other CPU. The old horse is reaped later (before the next fork,
at the next wait, at the worker's end).

With the byte the horse may hand back the Redis connection its worker lent it
(:class:`rq_emq.connection.budget.WorkConnectionLender`): the socket itself, passed as
``SCM_RIGHTS``, so the worker goes on with the connection it had instead of a connect and a
handshake per job (its own copy was closed at the fork: only one process ever holds it,
and one that dies takes the connection with it).

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
import socket
import time
from typing import Any

#: what the horse writes once nothing is left of its run but ``os._exit(0)``
DONE = b"."
#: the same, with the lent Redis connection's socket passed along (``SCM_RIGHTS``)
DONE_HANDED_BACK = b"+"
#: How long a reap that may wait waits for a told horse's exit to complete.
REAP_WAIT_S = 1.0


class HorseEnd:
    """The worker's side and the horse's side of one run's end-of-run socket pair."""

    def __init__(self) -> None:
        self._ours: socket.socket | None = None
        self._horses: socket.socket | None = None
        self._pidfd = -1
        #: the socket the last horse handed back, not taken yet (its file descriptor)
        self._handed_back = -1
        #: horses that told their end and are still exiting (reaped without waiting)
        self.exiting: list[int] = []

    # -- in the worker --------------------------------------------------------------------
    def before_fork(self) -> None:
        self.close()
        # not inheritable (close-on-exec): no job's exec keeps it
        self._ours, self._horses = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)

    def adopt(self, ours: socket.socket | None, pidfd: int) -> None:
        """In the worker: the pair and pidfd of a horse forked ahead, now this run's
        (:mod:`rq_emq.run.fork_ahead`); without a pidfd it is waited for as RQ does."""
        self.close()
        self._ours, self._pidfd = ours, pidfd
        if ours is None or pidfd < 0:
            self.close()

    def forked(self, horse_pid: int) -> None:
        """In the worker, once forked: its copy of the horse's end closed (so that the pair
        reads as ended once no horse holds it), and a pidfd on the horse."""
        self._close_write()
        try:
            self._pidfd = os.pidfd_open(horse_pid)
        except (AttributeError, OSError):  # Python < 3.9 or Linux < 5.3: wait for the exit
            self.close()

    def over_within(self, timeout_s: float) -> bool:
        """Whether the run ends (told, or the horse gone) within ``timeout_s``; nothing is
        read, so :meth:`wait_told` still finds it."""
        if self._ours is None or self._pidfd < 0:
            return False
        ready, _, _ = select.select([self._ours.fileno(), self._pidfd], [], [], timeout_s)
        return bool(ready)

    def wait_told(self, horse_pid: int) -> bool:
        """Wait until the horse says its run is over (True) or it ends without saying so
        (False: reap it as RQ does). A signal's handler that raises (RQ's monitoring
        alarm) interrupts the wait, which RQ then starts again."""
        if self._ours is None or self._pidfd < 0:
            return False
        ours = self._ours.fileno()
        ready, _, _ = select.select([ours, self._pidfd], [], [])
        if ours not in ready:
            return False  # it ended without a word
        try:
            word, fds, _, _ = socket.recv_fds(self._ours, 1, 1)
        except OSError:
            word, fds = b"", []
        told = word in (DONE, DONE_HANDED_BACK)
        for fd in fds:
            if told and word == DONE_HANDED_BACK and self._handed_back < 0:
                self._handed_back = fd
            else:
                os.close(fd)
        if told:
            self.exiting.append(horse_pid)
        self._close_pair()
        return told

    def take_handed_back(self) -> int | None:
        """The file descriptor of the connection the last horse handed back, now the
        caller's to keep or close; None if it handed none back."""
        fd, self._handed_back = self._handed_back, -1
        return fd if fd >= 0 else None

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
        self._close_pair()
        fd = self.take_handed_back()
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)

    def _close_pair(self) -> None:
        self._close_write()
        self._close_workers_side()

    def _close_workers_side(self) -> None:
        if self._ours is not None:
            self._ours.close()
            self._ours = None
        if self._pidfd >= 0:
            with contextlib.suppress(OSError):
                os.close(self._pidfd)
            self._pidfd = -1

    def _close_write(self) -> None:
        if self._horses is not None:
            self._horses.close()
            self._horses = None

    # -- in the horse ---------------------------------------------------------------------
    def in_horse(self) -> None:
        """First thing in the horse: the worker's side of the pair is not its own."""
        self._close_workers_side()
        self._handed_back = -1  # the worker's (none is open across a fork)
        self.exiting = []

    @classmethod
    def for_spare(cls, horses: socket.socket) -> HorseEnd:
        """In a horse forked ahead: its end of the pair it waits on, and will tell on."""
        end = cls()
        end._horses = horses
        return end

    def tell_done(self, connection: Any, hand_back: int | None = None) -> None:
        """In the horse, after its last step but ``os._exit(0)``: its Redis connections
        closed but the one handed back (``hand_back``, its socket's descriptor: the
        horse's copy goes with its exit, without a shutdown), so that the worker never
        holds a fourth; then the byte. A worker already gone (EPIPE) has nothing to be told."""
        if self._horses is None:
            return
        with contextlib.suppress(Exception):
            connection.connection_pool.disconnect()
        with contextlib.suppress(OSError):
            if hand_back is not None:
                socket.send_fds(self._horses, [DONE_HANDED_BACK], [hand_back])
            else:
                self._horses.sendall(DONE)
        self._close_write()
