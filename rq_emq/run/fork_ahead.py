"""A horse forked ahead: the fork taken off each job's path.

Stock RQ forks its horse once it has taken a job, and the fork is slow: some 1 ms in the
worker, and 2 ms more before the new process reaches the job, as it faults in the pages
it touches. All of it lies between one job's end and the next one's start. A
``LeaseWorker`` forks the *next* horse while the current one runs (the worker only waits
then), and the new horse waits on a socket pair for its job. Once the worker has taken
that job, it hands it over, in one message: the job, its queue, its lease and execution
record as the worker holds them, and the Redis connection the take used (its socket, as
``SCM_RIGHTS``). Each job still runs in a process of its own, forked from the worker.

What the message carries is pickled, but nothing in it is read from Redis or from anyone
but the worker: the worker's own objects, which the horse, a fork of the worker, holds
at the same addresses (:class:`Shared`), travel as references, never as copies; any other
client object is a stale spare (the worker changed its connections since), which the
worker then ends, forking for the job as RQ does.

A spare holds nothing: no job, no lease, no connection of its own. The worker ends it as
it stops, and a spare whose worker is gone (its socket closed) exits.

A spare is a copy of the worker's memory as of its fork, and a job run by it sees the
worker's state as of then, where stock RQ's horse sees it as of the take. So a spare is
used only while it is at most ``spare_max_age_ms`` old (1 s by default): an older one is
ended (killed and reaped) at the take, and the job forked as RQ does. And none is kept
past that age, idle or not: a thread of the worker's (:class:`SpareExpiry`) kills the
spare as it reaches it, so that an idle worker holds no old copy of its memory (after a
``gc.collect()`` or a reload, a copy of every page it wrote) and its footprint is stock's.
The worker forks its spare as a job starts (the next job's) and as it goes idle after a
job; once a spare of an idle worker has expired, the next job is forked as RQ does.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import pickle
import select
import signal
import socket
import struct
import threading
import time
from collections.abc import Iterable
from typing import Any, NoReturn

from redis import Redis
from redis.client import Pipeline
from redis.connection import AbstractConnection, ConnectionPool, SSLConnection
from rq import job as rq_job
from rq.job import Job
from rq.queue import Queue

from .. import compat
from .horse_end import HorseEnd
from .process_tree import become_subreaper, lead_own_session, libc

logger = logging.getLogger("rq_emq.lease")

_HEADER = struct.Struct("!I")
_NOT_SHARED = object()


class StaleSpare(Exception):
    """The handover names a client object the spare does not hold: fork as RQ does."""


class Shared:
    """The worker's objects that a spare holds too, at the same addresses (it is a fork
    taken while they lived; the table keeps them alive, so no address is reused). They
    travel in a handover as their address alone: pickle's dispatch table, looked up by
    exact type in C, sends them so (a ``persistent_id`` method would call Python for every
    object pickled: 0.6 ms a job)."""

    def __init__(self, objects: Iterable[Any]) -> None:
        self.by_id: dict[int, Any] = {id(obj): obj for obj in objects if obj is not None}
        self._dispatch: dict[type, Any] = {kind: _stale for kind in _CLIENT_TYPES}
        for obj in self.by_id.values():
            self._dispatch[type(obj)] = self._by_address

    def _by_address(self, obj: Any) -> tuple[Any, tuple[int]]:
        if self.by_id.get(id(obj), _NOT_SHARED) is not obj:
            if isinstance(obj, _CLIENT_TYPES):
                _stale(obj)
            return obj.__reduce_ex__(pickle.HIGHEST_PROTOCOL)  # type: ignore[no-any-return]
        return _shared_object, (id(obj),)

    def dumps(self, value: Any) -> bytes:
        buffer = io.BytesIO()
        pickler = pickle.Pickler(buffer, protocol=pickle.HIGHEST_PROTOCOL)
        pickler.dispatch_table = self._dispatch
        pickler.dump(value)
        return buffer.getvalue()

    def loads(self, data: bytes) -> Any:
        global _loading
        _loading = self.by_id
        try:
            return pickle.loads(data)
        finally:
            _loading = {}


_CLIENT_TYPES = (Redis, ConnectionPool, AbstractConnection, Pipeline)
#: the table of the handover being read (in a spare, one at a time)
_loading: dict[int, Any] = {}


def _stale(obj: Any) -> Any:
    raise StaleSpare(f"{type(obj).__name__} made since the spare's fork")


def _shared_object(key: int) -> Any:
    try:
        return _loading[key]
    except KeyError:
        raise pickle.UnpicklingError(f"no shared object {key}") from None


class SpareHorse:
    """The worker's side of one horse forked ahead, waiting for its job."""

    def __init__(self, pid: int, ours: socket.socket, shared: Shared) -> None:
        self.pid = pid
        #: when it was forked: the moment of the worker's memory a job run by it sees
        self.born = time.monotonic()
        #: killed by the expiry (reaped by the worker's main thread, which owns the reaps)
        self.expired = False
        self.ours: socket.socket | None = ours
        self.shared = shared
        try:
            self.pidfd = os.pidfd_open(pid)
        except (AttributeError, OSError):
            self.pidfd = -1

    def waiting(self) -> bool:
        """It lives and waits (it exits only when its worker's side closes, or killed)."""
        if self.ours is None:
            return False
        if self.pidfd < 0:
            return True
        ready, _, _ = select.select([self.pidfd], [], [], 0)
        return not ready

    def hand_over(self, payload: bytes, connection_fd: int | None) -> bool:
        """The job's handover, with the lent connection's socket; False if the spare is
        gone (the caller forks as RQ does)."""
        if self.ours is None:
            return False
        message = _HEADER.pack(len(payload)) + payload
        try:
            fds = [connection_fd] if connection_fd is not None else []
            sent = socket.send_fds(self.ours, [message], fds)
            if sent < len(message):
                self.ours.sendall(message[sent:])
        except OSError:
            return False
        return True

    def age_s(self) -> float:
        return time.monotonic() - self.born

    def expire(self) -> None:
        """Killed for its age and reaped, by the expiry thread (no zombie beside an idle
        worker): it waits, holding nothing. Its socket and pidfd are closed by the main
        thread as it next looks (:meth:`end`), which sends no signal to the reaped pid
        (the kernel may have given it to another process since)."""
        self.expired = True
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGKILL)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(self.pid, 0)

    def take_end(self) -> tuple[socket.socket | None, int]:
        """The socket and pidfd, now the run's (its end is told on them)."""
        ours, pidfd = self.ours, self.pidfd
        self.ours, self.pidfd = None, -1
        return ours, pidfd

    def end(self) -> None:
        """Never handed a job: closed (it exits on its own) and reaped."""
        ours, pidfd = self.take_end()
        if ours is not None:
            ours.close()
        if pidfd >= 0:
            with contextlib.suppress(OSError):
                os.close(pidfd)
        if self.expired:
            return  # killed and reaped by the expiry
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGKILL)  # it holds nothing: no reason to let it finish
        with contextlib.suppress(ChildProcessError):
            os.waitpid(self.pid, 0)


class SpareExpiry:
    """One thread per worker, started with its first spare: it kills the spare as it
    reaches the age limit, unless the main thread has handed it a job first. Both sides
    take the spare under one lock (:attr:`turn`); the thread sleeps until the current
    spare's limit, and without a spare until the main thread forks one (only then is it
    woken: a spare forked while it sleeps towards an older one's limit waits for that)."""

    def __init__(self, owner: ForkAheadMixin, limit_s: float) -> None:
        self.turn = threading.Condition()
        self.limit_s = limit_s
        self._owner = owner
        self._idle = False
        self._thread: threading.Thread | None = None

    def forked(self) -> None:
        """In the main thread, under :attr:`turn`, its new spare set: watched."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="rq-emq-spare-expiry", daemon=True)
            self._thread.start()
        elif self._idle:
            self.turn.notify()

    def _run(self) -> None:
        with self.turn:
            while True:
                spare = self._owner._spare
                if spare is None or spare.expired:
                    self._idle = True
                    self.turn.wait()
                    self._idle = False
                    continue
                left = spare.born + self.limit_s - time.monotonic()
                if left > 0:
                    self.turn.wait(left)
                    continue
                spare.expire()
                self._owner._spare_expired = True


def wait_for_handover(horses: socket.socket) -> tuple[bytes, int | None] | None:
    """In the spare: the handover and the connection's descriptor, or None once its
    worker's side is closed with nothing sent (the spare then exits). A handover cut
    short raises: its worker counts the job handed, and the horse's exit is a crash."""
    try:
        data, fds, _, _ = socket.recv_fds(horses, 1 << 16, 1)
    except OSError:
        return None
    if not data:
        return None
    fd = fds[0] if fds else None
    while len(data) < _HEADER.size:
        data += _received(horses, _HEADER.size - len(data))
    (size,) = _HEADER.unpack_from(data)
    chunks = [data[_HEADER.size :]]
    got = len(chunks[0])
    while got < size:
        chunks.append(_received(horses, min(1 << 20, size - got)))
        got += len(chunks[-1])
    return b"".join(chunks), fd


def _received(horses: socket.socket, most: int) -> bytes:
    chunk = horses.recv(most)
    if not chunk:
        raise EOFError("the handover was cut short")
    return chunk


#: The worker's steps between a take and its fork: a class of the user's that overrides
#: one may leave state in the worker's memory for its horse, which a horse forked before
#: the take would not have; such a class forks once the job is taken, as RQ does.
_BEFORE_THE_FORK = ("execute_job", "prepare_execution", "fork_work_horse", "dequeue_job_and_maintain_ttl")


_SAFE: dict[type, bool] = {}


def forks_ahead_safely(worker_class: type) -> bool:
    """Whether no class of the user's in ``worker_class`` overrides a step between the
    take and the fork (:data:`_BEFORE_THE_FORK`)."""
    safe = _SAFE.get(worker_class)
    if safe is None:
        safe = _SAFE[worker_class] = not any(
            name in vars(klass)
            for klass in worker_class.__mro__
            if (getattr(klass, "__module__", "") or "").split(".")[0] not in ("rq", "rq_emq", "builtins")
            for name in _BEFORE_THE_FORK
        )
    return safe


class ForkAheadMixin:
    """Put right before RQ's ``Worker``, after every part with a step of its own before
    the fork: its :meth:`fork_work_horse` stands in for RQ's fork alone."""

    #: A class whose horse is a fork of the worker (off where it is spawned)
    _forks_ahead = True
    _spare: SpareHorse | None = None
    #: In a horse: it was forked ahead (its session and subreaper were set as it forked)
    _forked_ahead = False
    #: the worker runs its loop (RQ's own tests call the fork and the monitor alone)
    _working = False
    _spare_expiry: SpareExpiry | None = None
    #: the expiry ended a spare since the last job ended (an idle worker forks no other)
    _spare_expired = False

    def _spare_limit_s(self) -> float:
        me: Any = self
        return float(me.lease_settings.spare_max_age_ms) / 1000.0

    def _young(self, spare: SpareHorse) -> bool:
        return not spare.expired and spare.age_s() < self._spare_limit_s()

    def _take_spare(self) -> SpareHorse | None:
        """The spare, now the caller's alone (the expiry no longer sees it)."""
        expiry = self._spare_expiry
        if expiry is None:
            spare, self._spare = self._spare, None
            return spare
        with expiry.turn:
            spare, self._spare = self._spare, None
        return spare

    def _spares_wanted(self) -> bool:
        me: Any = self
        if not forks_ahead_safely(type(self)):
            return False
        if not (
            self._forks_ahead and me._horse_tells_its_end and me.lease_settings.fork_ahead and self._working
        ):
            return False
        if me.is_horse or getattr(me, "_stop_requested", False):
            return False
        pool = me.connection.connection_pool
        return not issubclass(getattr(pool, "connection_class", object), SSLConnection)

    def _shared_with_spare(self) -> list[Any]:
        me: Any = self
        lender = me._lender
        objects: list[Any] = [self, me.connection, me.connection.connection_pool, me._horse_deadline]
        if lender is not None:
            control = lender.control
            objects += [lender, lender.client, control, control.connection_pool, lender._own_pool]
        objects += list(me.queues)
        # RQ's sentinels are compared by identity (a job's data not yet unpickled)
        objects += [getattr(rq_job, "UNEVALUATED", None)]
        return objects

    def _fork_spare(self) -> None:
        """In the worker, while its horse runs or before it waits idle: the next horse,
        waiting for its job."""
        me: Any = self
        spare = self._take_spare()
        if spare is not None:
            if self._young(spare) and spare.waiting():
                self._spare = spare
                return
            # killed while it waited (its age, an operator, the OOM killer), or too old to
            # take a job: another
            spare.end()
        if not self._spares_wanted():
            return
        # what the horse finds in its memory, as a horse forked for its job does
        me._lifeline_for_horses()
        libc()
        if me._horse_deadline is None:
            me._horse_deadline = me._new_run_deadline()
        shared = Shared(self._shared_with_spare())
        ours, horses = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            pid = os.fork()
        except OSError as error:  # no process to be had now: the next job forks as RQ does
            logger.warning("could not fork a horse ahead: %s", error)
            ours.close()
            horses.close()
            return
        if pid == 0:
            ours.close()
            self._wait_as_spare(horses, shared)
        horses.close()
        if self._spare_expiry is None:
            self._spare_expiry = SpareExpiry(self, self._spare_limit_s())
        with self._spare_expiry.turn:
            self._spare = SpareHorse(pid, ours, shared)
            self._spare_expiry.forked()

    def fork_work_horse(self, job: Job, queue: Queue) -> None:
        """RQ's fork, or the handover to the horse forked ahead; with its end's socket
        pair (:mod:`rq_emq.run.horse_end`) either way."""
        me: Any = self
        if self._hand_to_spare(job, queue):
            return
        end = me._horse_end
        if end is not None:
            end.before_fork()
        super().fork_work_horse(job, queue)  # type: ignore[misc]
        if end is not None:
            end.forked(me.horse_pid)

    def _end_spare(self) -> None:
        spare = self._take_spare()
        if spare is not None:
            spare.end()

    def _hand_to_spare(self, job: Job, queue: Queue) -> bool:
        """In the worker, for a job taken: hand it to the horse forked ahead, if one waits
        and holds what the handover names; else (False) it is forked as RQ does."""
        me: Any = self
        spare = self._take_spare()
        if spare is None:
            return False
        if not self._young(spare):
            # it would run the job on the worker's memory as of its fork, more than the
            # limit before the take: the job is forked as RQ does
            spare.end()
            return False
        lender = me._lender
        fd = lender.lent_descriptor() if lender is not None else None
        try:
            if lender is not None and lender._lent is not None and fd is None:
                raise StaleSpare("the connection it would get cannot be passed")
            payload = spare.shared.dumps(
                (job, queue, me.lock_manager.get(job.id), me._held_back_record)
                + (compat.execution_state(self),)
            )
        except Exception as error:  # noqa: BLE001 - whatever will not travel, the job forks as RQ does
            logger.debug("the horse forked ahead is not used for job %s: %s", job.id, error)
            spare.end()
            return False
        if not spare.waiting() or not spare.hand_over(payload, fd):
            spare.end()
            return False
        me._horse_end.adopt(*spare.take_end())
        os.environ["RQ_WORKER_ID"] = me.name
        os.environ["RQ_JOB_ID"] = job.id
        me._horse_pid = spare.pid
        me.procline(f"Forked {spare.pid} at {time.time()}")
        return True

    def _wait_as_spare(self, horses: socket.socket, shared: Shared) -> NoReturn:
        """In the spare: set up as a horse, wait for the job, run it as a horse does."""
        me: Any = self
        code = 1
        try:
            self._forked_ahead = True
            self._spare = None  # not under the expiry's lock: its thread is the worker's alone
            self._spare_expiry = None
            me._horse_pid = 0
            me.setup_work_horse_signals()  # a stop of its worker is no stop of a spare's
            os.setpgrp()
            lead_own_session()
            become_subreaper()
            me._horse_end = HorseEnd.for_spare(horses)
            # armed from its fork, as a horse forked for its job is from its start: the
            # kernel ends it once its worker and watchdog are both gone, even where another
            # process forked from the worker since (RQ's scheduler, restarted) holds a copy
            # of the socket it waits on, whose end it would then never read
            me._arm_lifeline()
            # what needs no job is made before it comes: off the job's path
            manager = me._new_lock_manager(me.connection)  # never started: it fences the run
            lender = me._lender
            connection = lender.ready_for_handover() if lender is not None else None
            handed = wait_for_handover(horses)
            if handed is None:
                os._exit(0)  # its worker stopped, or ended it
            data, fd = handed
            job, queue, lease, held_back, executions = shared.loads(data)
            os.environ["RQ_WORKER_ID"] = me.name
            os.environ["RQ_JOB_ID"] = job.id
            me._horse_job_id = job.id
            me._held_back_record = held_back
            compat.restore_execution_state(self, executions)
            if lease is not None:
                manager.add(lease)
            me.lock_manager = manager
            if fd is not None and lender is not None:
                lender.take_handed(connection, fd)
            me.main_work_horse(job, queue)  # RQ's ends the process
            code = 0
        except BaseException:  # noqa: BLE001 - a horse ends with its process, whatever it raised
            logger.exception("a horse forked ahead failed before its job ran")
        finally:
            os._exit(code)
