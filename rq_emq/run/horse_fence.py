"""The self-fencing horse: the local lease deadline of the job a horse runs, in memory
the worker shares with it, and the thread in the horse that ends it past that deadline.

A horse must not depend on its worker being scheduled: a worker that is SIGSTOPped,
swapped out or cut off from Redis stops moving the deadline, and the horse ends itself
when it passes, before the sweep may hand the job to another worker.

The same memory tells the worker's watchdog (:mod:`rq_emq.run.watchdog`), a process of its
own, which run to end and when: it does not depend on the horse's thread getting the GIL
(a job in C code holds it) nor on the worker being scheduled. The horse's thread stays as
a second line (a watchdog killed on its own, its worker frozen); a horse whose worker and
watchdog are both gone is ended by the kernel (:mod:`rq_emq.run.lifeline`).

A horse frozen together with its worker (SIGSTOP of both) is ended by the watchdog while
frozen; frozen with its watchdog too (a paused container), it must not run on after it is
resumed past its deadline: its SIGCONT handler checks the deadline before the job's next
Python instruction, and the thread covers freezes that send no SIGCONT (a cgroup
freezer, a VM pause) within one check interval.

Every end this module makes is of the whole run: the horse's group and descendants
(:func:`rq_emq.run.process_tree.kill_tree`).
"""

from __future__ import annotations

import _thread
import fcntl
import math
import mmap
import os
import signal
import struct
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

if __package__:
    from .process_tree import kill_tree, parent_and_group
else:  # imported by the watchdog's own interpreter (rq_emq/run/watchdog.py run as a script)
    from process_tree import kill_tree, parent_and_group  # type: ignore[no-redef]

# bytes 0-7 the deadline (double), 8 settled, 9 stopping, 10 ended at its deadline, 11 the
# held lease's mode (1: a cold stop, handed back; 0: recovered), 12-15 the watchdog's pid
# (int32; 0: none), 16-23 the pid of the run (int64; 0: none), 24-31 when the watchdog
# reads this memory again at the latest (double, monotonic; inf: only when poked); then
# the job's newest report: 32-39 its number (even once written whole), 40-43 its length,
# 44- its JSON text (the horse writes, the worker's ticks read); then the lease the worker
# holds, for its watchdog to hand back should the worker die (rq_emq/run/seen_death.py):
# its number (even once written whole), its length, its JSON text (the worker writes)
REPORT_LIMIT_BYTES = 1024
LEASE_LIMIT_BYTES = 4096
#: the signal that tells the watchdog to read this memory again (a run began)
POKE = signal.SIGUSR2
_WAKES_AT = 24
_REPORT_AT = 32
_LEASE_AT = _REPORT_AT + 12 + REPORT_LIMIT_BYTES + 4  # 8-byte aligned
#: when the watchdog sent the last renewal it made in a SimpleLeaseWorker's place that
#: Redis granted (double, monotonic; 0: none for the lease held: rq_emq/run/stand_in.py)
_STAND_IN_AT = (_LEASE_AT + 12 + LEASE_LIMIT_BYTES + 7) // 8 * 8
_SIZE = _STAND_IN_AT + 8


class HorseDeadline:
    """The local lease deadline of the job a horse runs, in memory shared by the worker
    and its horse (an anonymous shared ``mmap`` made before the fork). The worker writes it
    after each renewal; a thread in the horse SIGKILLs the horse once ``time.monotonic()``
    (CLOCK_MONOTONIC, one clock for every process on a host) has passed it."""

    def __init__(self, path: str | None = None, fd: int | None = None) -> None:
        """Anonymous memory, shared with a forked horse; or, with ``path``, a file's
        (``shared_file``), which a horse started as a new program maps too; or, with
        ``fd``, that file's (``in_memfd``: the worker's, which its watchdog maps).
        Bytes 0-7 hold the deadline, which the worker writes; byte 8 is set by the horse
        once its outcome has landed; byte 10 by whoever ends the run at its deadline (the
        watchdog, or the horse's own fence) just before the kill; bytes 16-23 the pid of
        the run (the horse, or a ``SimpleLeaseWorker`` itself), which the watchdog ends past
        the deadline."""
        self.path = path
        self.fd = fd
        self._report_lock = threading.Lock()
        if path is None and fd is None:
            self._memory = mmap.mmap(-1, _SIZE)  # MAP_SHARED | MAP_ANONYMOUS: survives the fork shared
            self.reset(math.inf)
            self.wakes_at = math.inf
            return
        opened = os.open(path, os.O_RDWR) if path is not None else fd
        assert opened is not None
        try:
            self._memory = mmap.mmap(opened, _SIZE)  # MAP_SHARED: every process mapping the file sees writes
        finally:
            if path is not None:
                os.close(opened)

    @classmethod
    def in_memfd(cls) -> HorseDeadline:
        """A deadline in an anonymous in-memory file (``memfd``): shared with forked horses
        like anonymous memory, and with the worker's watchdog, a program of its own, by its
        descriptor. Where there is no ``memfd`` (not Linux), a ``shared_file``."""
        try:
            fd = os.memfd_create("rq-emq-run-deadline", os.MFD_CLOEXEC)
        except (AttributeError, OSError):
            return cls.shared_file()
        os.ftruncate(fd, _SIZE)
        deadline = cls(fd=fd)
        deadline.reset(math.inf)
        deadline.wakes_at = math.inf
        return deadline

    def open_fd(self) -> int:
        """A new descriptor of this memory's file, to hand a program that maps it too."""
        if self.path is not None:
            return os.open(self.path, os.O_RDWR)
        if self.fd is None:
            raise ValueError("anonymous memory has no descriptor")
        return os.dup(self.fd)

    @classmethod
    def shared_file(cls) -> HorseDeadline:
        """A deadline in a new file (in memory where /dev/shm exists), for a spawned horse."""
        import tempfile  # here: the watchdog's interpreter imports this module, and never needs it

        where = "/dev/shm" if os.path.isdir("/dev/shm") else None
        fd, path = tempfile.mkstemp(prefix="rq-emq-horse-deadline-", dir=where)
        try:
            os.ftruncate(fd, _SIZE)
        finally:
            os.close(fd)
        deadline = cls(path)
        deadline.reset(math.inf)
        deadline.wakes_at = math.inf
        return deadline

    def remove(self) -> None:
        """Delete a ``shared_file``'s file (the worker, as it stops)."""
        if self.path is not None:
            try:
                os.unlink(self.path)
            except FileNotFoundError:
                pass

    def reset(self, deadline: float, pid: int = 0) -> None:
        """Before each run: a new deadline, not settled (and the run's pid, once known).
        The pid is written last, so a reader that sees it sees its deadline."""
        self.pid = 0
        self._memory[8] = 0
        self._memory[9] = 0
        self._memory[10] = 0
        self._memory[_REPORT_AT : _REPORT_AT + 8] = bytes(8)
        self.set(deadline)
        self.pid = pid

    def clear(self) -> None:
        """The run has ended (its process reaped): nothing to end any more."""
        self.pid = 0
        self.set(math.inf)

    @property
    def pid(self) -> int:
        return int(struct.unpack("q", self._memory[16:24])[0])

    @pid.setter
    def pid(self, pid: int) -> None:
        self._memory[16:24] = struct.pack("q", pid)

    @property
    def watchdog_pid(self) -> int:
        return int(struct.unpack("i", self._memory[12:16])[0])

    @watchdog_pid.setter
    def watchdog_pid(self, pid: int) -> None:
        self._memory[12:16] = struct.pack("i", pid)

    @property
    def wakes_at(self) -> float:
        """When the watchdog reads this memory again at the latest (monotonic): the time
        its wait ends, or inf while it waits for a poke only (or may not have read the
        run just written: a poker that reads inf always pokes)."""
        return float(struct.unpack("d", self._memory[_WAKES_AT : _WAKES_AT + 8])[0])

    @wakes_at.setter
    def wakes_at(self, when: float) -> None:
        self._memory[_WAKES_AT : _WAKES_AT + 8] = struct.pack("d", when)

    @contextmanager
    def locked(self) -> Iterator[bool]:
        """This memory's lock (a POSIX record lock on its file, which the kernel releases
        when its holder dies), never waited for: True when held. Between the watchdog
        and whoever tells it of a run, it makes "the watchdog read the run, or will read
        it by ``wakes_at``" a fact rather than a guess about two processes' timing. Anonymous
        memory (no file) is never locked."""
        fd = self.fd
        if fd is None:
            yield False
            return
        try:
            fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, 0, os.SEEK_SET)
        except OSError:  # held by the other side (a moment, or it is frozen): not waited for
            yield False
            return
        try:
            yield True
        finally:
            fcntl.lockf(fd, fcntl.LOCK_UN, 1, 0, os.SEEK_SET)

    def start_run(self, pid: int) -> bool:
        """The run's pid written (its deadline already is), and whether its watchdog must
        be woken to read it: not while the watchdog is sure to read this memory again
        before the run's deadline anyway (it sleeps until an earlier run's deadline, which
        is no later: back-to-back jobs then poke it about once per lease, not once a job,
        where each poke cost the poker some 0.1-0.2 ms and the watchdog as much)."""
        # the lock taken here rather than through locked(): a generator's machinery is more
        # code for a fresh horse to touch (copy-on-write faults) at every start
        fd = self.fd
        try:
            if fd is None:
                raise OSError("anonymous memory: no lock")
            fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, 0, os.SEEK_SET)
        except OSError:  # not held: the watchdog may be reading, tell it
            self.pid = pid
            return True
        try:
            self.pid = pid
            return self.wakes_at > self.get()
        finally:
            fcntl.lockf(fd, fcntl.LOCK_UN, 1, 0, os.SEEK_SET)

    def run_started_here(self) -> None:
        """In the horse, as it starts: its own pid, and its worker's watchdog woken
        (:data:`POKE`) to read it if it would not read it by the run's deadline anyway
        (:meth:`start_run`). The worker writes the pid after the fork returns too, but a
        starved worker may be frozen before it does while the horse already runs the job,
        and a watchdog never told of the run would sleep through its deadline."""
        if not self.start_run(os.getpid()):
            return
        watchdog = self.watchdog_pid
        # the watchdog is this horse's sibling (the worker started both): a pid that names
        # any other process is one reused since that watchdog died, and is left alone
        if watchdog and parent_and_group(watchdog)[0] == os.getppid():
            try:
                os.kill(watchdog, POKE)
            except (ProcessLookupError, PermissionError):
                pass

    def set(self, deadline: float) -> None:
        self._memory[0:8] = struct.pack("d", deadline)

    def settle(self) -> None:
        """The run's outcome is committed: what the horse does after it (RQ enqueuing the
        dependents, its bookkeeping) is no run of the job, and must not be cut short."""
        self._memory[8] = 1

    @property
    def settled(self) -> bool:
        return self._memory[8] == 1

    @property
    def ended_at_deadline(self) -> bool:
        """The run was ended at its deadline by its watchdog or its own fence: its death
        is the lease clock's stop, never a crash, even if a renewal landed after the kill
        and the worker trusts the lease again (it stays so until the next run's reset)."""
        return self._memory[10] == 1

    def end_at_deadline(self) -> None:
        """Said by whoever ends the run at its deadline, before the kill."""
        self._memory[10] = 1

    @property
    def stopping(self) -> bool:
        """The worker was asked to stop (a warm shutdown) while this run goes on: the job
        may read it (``rq_emq.current_lease().stopping``) and end early."""
        return self._memory[9] == 1

    def request_stop(self) -> None:
        self._memory[9] = 1

    def post_report(self, text: str) -> None:
        """In the horse: the job's newest report (JSON text, at most
        :data:`REPORT_LIMIT_BYTES`). Its number is odd while the text is written, so the
        worker never sends a report torn by a concurrent write."""
        data = text.encode()
        if len(data) > REPORT_LIMIT_BYTES:
            raise ValueError(f"a report is at most {REPORT_LIMIT_BYTES} bytes as JSON, got {len(data)}")
        with self._report_lock:  # the job's own threads may report side by side
            self._write_numbered(_REPORT_AT, data)

    def read_report(self) -> tuple[int, str] | None:
        """In the worker: (number, text) of the newest report written whole; None if
        none, or while one is being written (the next tick reads it)."""
        found = self._read_numbered(_REPORT_AT, REPORT_LIMIT_BYTES)
        return None if found is None else (found[0], found[1].decode(errors="replace"))

    def hold_lease(self, text: str) -> None:
        """In the worker: the lease it now holds (JSON text, at most
        :data:`LEASE_LIMIT_BYTES`; an empty text: none). Its number is odd while the text is
        written, so a worker that died in the middle of it leaves nothing to act on."""
        data = text.encode()
        if len(data) > LEASE_LIMIT_BYTES:
            data = b""  # a job id or key of kilobytes: left to the sweep
        self._memory[11] = 0  # a new lease, recovered as a crash unless a cold stop says so
        self.stand_in_renewed = 0.0  # no renewal of the watchdog's is this lease's yet
        self._write_numbered(_LEASE_AT, data)

    @property
    def stand_in_renewed(self) -> float:
        """When the watchdog sent its last renewal of the held lease that Redis granted,
        in the worker's place (monotonic; 0: none): :mod:`rq_emq.run.stand_in`."""
        while True:  # two reads that agree: a torn read is never acted on
            first = self._memory[_STAND_IN_AT : _STAND_IN_AT + 8]
            if self._memory[_STAND_IN_AT : _STAND_IN_AT + 8] == first:
                return float(struct.unpack("d", first)[0])

    @stand_in_renewed.setter
    def stand_in_renewed(self, sent_at: float) -> None:
        self._memory[_STAND_IN_AT : _STAND_IN_AT + 8] = struct.pack("d", sent_at)

    def hand_back_on_death(self) -> None:
        """In the worker, a cold stop: its death hands the held lease back, no attempt
        counted (``return_job_to_queue``), where any other death recovers it as a crash."""
        self._memory[11] = 1

    @property
    def hands_back(self) -> bool:
        return self._memory[11] == 1

    def held_lease(self) -> str | None:
        """The lease text the worker wrote last, whole; None if none or torn."""
        found = self._read_numbered(_LEASE_AT, LEASE_LIMIT_BYTES)
        return found[1].decode(errors="replace") if found is not None and found[1] else None

    def _write_numbered(self, at: int, data: bytes) -> None:
        """``data`` at ``at``: its number (odd while written, then the next even), its
        length, its bytes. One writer at a time."""
        number = struct.unpack("Q", self._memory[at : at + 8])[0]
        number += 2 - number % 2
        self._memory[at : at + 8] = struct.pack("Q", number - 1)
        self._memory[at + 8 : at + 12] = struct.pack("I", len(data))
        self._memory[at + 12 : at + 12 + len(data)] = data
        self._memory[at : at + 8] = struct.pack("Q", number)

    def _read_numbered(self, at: int, limit: int) -> tuple[int, bytes] | None:
        """(number, bytes) last written whole at ``at``; None if never, or while (or if
        ever after: a writer that died) being written."""
        number = struct.unpack("Q", self._memory[at : at + 8])[0]
        if number == 0 or number % 2:
            return None
        length = min(struct.unpack("I", self._memory[at + 8 : at + 12])[0], limit)
        data = self._memory[at + 12 : at + 12 + length]
        if struct.unpack("Q", self._memory[at : at + 8])[0] != number:
            return None  # rewritten while read
        return number, data

    def get(self) -> float:
        if self.settled:
            return math.inf
        # read until two reads agree: a read torn by a concurrent write is never acted on
        while True:
            first = self._memory[0:8]
            if self._memory[0:8] == first:
                return float(struct.unpack("d", first)[0])

    def guard(self, interval_s: float) -> None:
        """In the horse (its main thread): start the thread that ends it past the
        deadline, and check the deadline the moment the horse is resumed from a stop. The
        thread runs until the horse exits; a kill in the fenced finish writes nothing
        half-done. (A horse whose worker and watchdog are gone is ended by the kernel:
        :mod:`rq_emq.run.lifeline`.)"""
        # Python runs a signal's handler in the main thread before that thread's next
        # instruction (a sleep is interrupted for it): a resumed horse past its deadline
        # ends before any more of the job's code runs, however the scheduler orders its
        # threads after the resume (the thread alone left up to a check interval)
        signal.signal(signal.SIGCONT, self._on_resume)
        # a bare thread: threading.Thread.start() waits until the new thread has run, some
        # 0.4 ms of every horse's start; nothing here needs it to have started (it lives
        # until the horse exits, as a daemon thread would)
        _thread.start_new_thread(self._watch, (interval_s,))

    def check(self) -> None:
        """End this process and its whole tree (SIGKILL) if the deadline has passed."""
        if time.monotonic() > self.get():
            self.end_at_deadline()
            kill_tree(os.getpid(), group=os.getpgrp() == os.getpid())

    def _on_resume(self, signum: int, frame: object) -> None:
        self.check()

    def _watch(self, interval_s: float) -> None:
        while True:
            self.check()
            time.sleep(interval_s)
