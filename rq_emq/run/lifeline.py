"""The lifeline: a horse whose worker and watchdog are both gone dies by the kernel's hand.

A horse is ended whole by its watchdog when its worker dies, and by its own fence thread
past its deadline. Neither covers a double fault within one check: the watchdog killed
(an operator, a stray ``pkill``), then the worker, while the job holds the GIL in C code,
where the horse's thread cannot run. A parent-death signal would not do either: it fires
when the worker dies even though its watchdog lives (and must first find the horse's
descendants), and it fires when the *thread* that forked exits.

So the worker makes a pipe. Its write end is held by the worker and by its watchdog
(handed over with the watchdog's other descriptor) and by no other process: every fork of
the worker closes its copy at once (``os.register_at_fork``), and exec closes it anywhere
else. A horse opens a read of the pipe of its own (a new open file description, through
``/proc/self/fd``) and arms it: ``O_ASYNC``, owned by the horse's process group, with
``SIGKILL`` as its signal. When the last write end closes, whatever closed it (an exit, a
SIGKILL, the OOM killer), the kernel signals every armed reader's owner: the horse's group
is killed then and there, no thread of it needed. While either holder lives nothing fires.

Each horse's read is its own description, so a horse forked ahead arms beside the horse
still running the previous job, and a description closed with its horse takes its owner
with it (an owner is held by reference, never by a number a later process may reuse).

Limits: a job's process that left the horse's process group (``setsid``, ``setpgid``) is
out of this signal's reach; the watchdog's whole-tree end covers it in every fault but the
double one. Linux only; elsewhere :meth:`Lifeline.arm` does nothing.
"""

from __future__ import annotations

import fcntl
import os
import select
import signal

#: fcntl's F_SETSIG (Linux): the signal sent in SIGIO's place
_F_SETSIG = 10
#: where a spawned horse finds the read end's number (the worker's environment)
ENV_LIFELINE = "RQ_EMQ_HORSE_LIFELINE_FD"


#: the write ends this process holds: closed in each of its forks
_WRITE_ENDS: set[int] = set()


def _close_write_ends() -> None:
    """In every fork: only the worker and its watchdog hold a write end."""
    for fd in _WRITE_ENDS:
        try:
            os.close(fd)
        except OSError:
            pass
    _WRITE_ENDS.clear()


os.register_at_fork(after_in_child=_close_write_ends)


class Lifeline:
    """One worker's pipe: the write end held by it and its watchdog, read by its horses."""

    def __init__(self) -> None:
        self.read_fd, self.write_fd = os.pipe()
        # a spawned horse inherits the read end (and only it: the write end stays close-on-exec)
        os.set_inheritable(self.read_fd, True)
        _WRITE_ENDS.add(self.write_fd)

    def close(self) -> None:
        """As the worker stops for good (a worker object's ``work()`` may run again)."""
        _WRITE_ENDS.discard(self.write_fd)
        for fd in (self.write_fd, self.read_fd):
            try:
                os.close(fd)
            except OSError:
                pass


def arm(read_fd: int) -> None:
    """In a horse leading its process group: the kernel SIGKILLs that group the moment the
    pipe's last write end closes. If it closed already (the worker and its watchdog died
    before this), the group ends now."""
    try:
        mine = os.open(f"/proc/self/fd/{read_fd}", os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return  # no /proc (not Linux), or no lifeline handed down
    fcntl.fcntl(mine, fcntl.F_SETOWN, -os.getpgrp())
    fcntl.fcntl(mine, _F_SETSIG, signal.SIGKILL)
    fcntl.fcntl(mine, fcntl.F_SETFL, fcntl.fcntl(mine, fcntl.F_GETFL) | os.O_ASYNC)
    # kept open for the horse's life: the description is what holds the arming
    poller = select.poll()
    poller.register(mine, select.POLLIN)
    if poller.poll(0):  # hung up already: no signal will come for a close that has happened
        os.killpg(os.getpgrp(), signal.SIGKILL)
