"""A worker's connection budget: three connections at any moment, its horse's included.

Stock RQ holds two while idle (its main connection and its pubsub) and three while a horse
runs (the horse opens its own). A lease worker keeps to three, idle or running, on any
number of queues:

- **pubsub**: RQ's command channel, which also carries the sweeper election's calls and
  the idle watcher's wake-ups (:mod:`rq_emq.intake.watch`);
- **control**: the lock manager's thread and the sweeper's, sharing one connection in turn
  (:func:`control_client`, a pool of one); while a horse runs, the worker's own main thread
  (RQ's heartbeats, a stop command's lookups) uses it too;
- **work**: the main thread's wait and take between runs. A forked horse runs its job on
  it: the connection is *lent* at the fork (:class:`WorkConnectionLender`), so the horse
  opens none of its own (which stock's horse does, at the cost of a connect per job). A
  horse whose run is over hands the socket back (``SCM_RIGHTS``, with its told end:
  :mod:`rq_emq.run.horse_end`), so the worker goes on with the same connection; a horse
  that ends any other way takes it with it, and the worker opens a new one. Only a
  connection proven as lent comes back: whatever its job did to it on the server's side (a
  ``SELECT``, an ``AUTH``, ``HELLO 3``, tracking, a subscription, an open ``MULTI``) must
  not reach the worker or its next job (:mod:`rq_emq.connection.lent_state`).

The lending reads redis-py's pool internals (its list of idle connections), which every
redis-py from 5.0 to 8 keeps for ``ConnectionPool`` and its Sentinel subclass. With another
pool (``BlockingConnectionPool``, a custom one) nothing is lent: the worker closes its idle
connections for the run and the horse opens one, as stock's does.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from redis import BlockingConnectionPool, ConnectionPool, Redis

from .lent_state import LentState, StateProof

logger = logging.getLogger("rq_emq.lease")


def control_client(connection: Redis, timeout_s: float | None = None) -> Redis:
    """A client of ``connection``'s server whose pool holds one connection, shared in
    turn by the threads that use it (each command or pipeline borrows it, and a thread
    that finds it borrowed waits; nothing sent on it blocks in Redis). With ``timeout_s``
    its socket and connect timeouts are that short (RQ's own are minutes), so no renewal
    or sweep call hangs past a tick."""
    pool = connection.connection_pool
    kwargs = dict(pool.connection_kwargs)
    if timeout_s is not None:
        kwargs["socket_timeout"] = timeout_s
        kwargs["socket_connect_timeout"] = timeout_s
    return Redis(connection_pool=RenewalsFirstPool(connection_class=pool.connection_class, **kwargs))


class RenewalsFirstPool(BlockingConnectionPool):
    """A pool of one connection, handed to the thread that called :meth:`serve_first` (the
    lock manager's) before any other that waits for it: a renewal waits at most for the one
    command in flight (a sweep call, a heartbeat), never behind a queue of them, so sharing
    the connection cannot delay a lease's renewal past that."""

    def __init__(self, **kwargs: Any) -> None:
        self._turns()
        super().__init__(max_connections=1, timeout=None, **kwargs)

    def _turns(self) -> None:
        self._turn = threading.Condition()
        self._held = False
        self._holder: int | None = None
        self._first_waiting = 0
        self._first: int | None = getattr(self, "_first", None)

    def reset(self) -> None:
        self._turns()  # a forked process starts with nobody holding or waiting
        super().reset()

    def serve_first(self) -> None:
        """The calling thread's requests go before every other waiting one."""
        self._first = threading.get_ident()

    def get_connection(self, *args: Any, **kwargs: Any) -> Any:
        me = threading.get_ident()
        if self._held and self._holder == me:
            # a signal handler (a stop) interrupted this thread while it held the connection:
            # waiting for itself would never end, so it gets one of its own for the moment
            extra = self.make_connection()
            extra._emq_extra = True
            return extra
        first = me == self._first
        with self._turn:
            self._first_waiting += first
            try:
                while self._held or (not first and self._first_waiting):
                    self._turn.wait()
                self._held = True
                self._holder = me
            finally:
                self._first_waiting -= first
        try:
            return super().get_connection(*args, **kwargs)
        except BaseException:
            self._done()
            raise

    def release(self, connection: Any) -> None:
        if getattr(connection, "_emq_extra", False):
            connection.disconnect()
            if connection in self._connections:
                self._connections.remove(connection)
            return
        try:
            super().release(connection)
        finally:
            self._done()

    def _done(self) -> None:
        with self._turn:
            self._held = False
            self._holder = None
            self._turn.notify_all()


def _lendable(pool: Any) -> bool:
    return (
        isinstance(pool, ConnectionPool)
        and not isinstance(pool, BlockingConnectionPool)
        and isinstance(getattr(pool, "_available_connections", None), list)
        and isinstance(getattr(pool, "_in_use_connections", None), set)
    )


def _close_here(connection: Any) -> None:
    """Close this process's copy of a connection's socket without ending the connection:
    redis-py shuts a socket down (for every process holding it) only in the process that
    opened it, so the close runs as if from another."""
    sock = getattr(connection, "_sock", None)
    if type(sock) is socket.socket:
        # a plain socket: only this process's descriptor goes, and redis-py's state is left
        # as it is until the next connect or hand-back binds its parser anew (its full
        # disconnect, run right after each fork, cost the worker 0.1 ms and 20 page faults
        # a job, the copies of pages it still shared with the horse)
        connection._sock = None
        os.close(sock.detach())
        return
    opened_by = connection.pid
    connection.pid = -1
    try:
        connection.disconnect()
    finally:
        connection.pid = opened_by


class WorkConnectionLender:
    """Lends a forking worker's work connection to its horse for one run.

    In the worker: :meth:`before_fork`, then :meth:`lent` once forked (the worker's copies
    of its idle connections are closed, and its client borrows the control connection until
    :meth:`returned`). In the horse: :meth:`adopt`, first thing, so that the job runs on the
    connection the worker had."""

    def __init__(self, client: Redis, control: Redis) -> None:
        self.client = client
        self.control = control
        self._own_pool: Any = None  # the client's pool while it borrows the control one
        self._lent: Any = None  # the connection the horse was given (the worker's copy closed)
        self.handed_back = 0  # runs whose horse handed the connection back (for the tests)
        self._handing_back: Any = None  # in the horse: the connection it hands back
        self._proof: StateProof | None = None  # in the horse: its lent connection's state, shown

    def before_fork(self) -> None:
        """Pick the idle connection the horse gets: the one the take just used."""
        self.returned()  # a run that ended without telling (an error past the monitor)
        pool = self.client.connection_pool
        self._lent = None
        if _lendable(pool) and pool.pid == os.getpid():
            idle = [c for c in pool._available_connections if getattr(c, "_sock", None) is not None]
            if idle:
                self._lent = idle[-1]

    def adopt(self) -> None:
        """In the horse: its client's pool holds the lent connection, and only it (the
        pubsub's and any other of the worker's are the worker's alone)."""
        pool = self.client.connection_pool
        lent = self._lent
        if lent is None or not _lendable(pool):
            self._lent = None
            return
        # no lock: this process has one thread, and a lock another thread of the worker held
        # at the fork would never be released here
        pool._available_connections[:] = [lent]
        pool._in_use_connections.clear()
        pool._created_connections = 1
        lent.pid = os.getpid()
        pool.pid = os.getpid()  # not reset on first use: it is this process's pool now

    def lent_descriptor(self) -> int | None:
        """In the worker, before a handover to a horse forked ahead: the socket descriptor
        of the connection it gets, if one was picked and it is a plain socket (a TLS
        session's state lives in this process's memory: it cannot be passed)."""
        sock = getattr(self._lent, "_sock", None)
        if self._lent is None or type(sock) is not socket.socket:
            return None
        return int(sock.fileno())

    def ready_for_handover(self) -> Any:
        """In a horse forked ahead, before its job: the client on its own pool again (it
        forked while its worker had lent a connection), and the connection object that
        will get the socket handed over with the job: a closed one of the pool (the
        worker's copy of the one it lent last), else a new one. Nothing is connected."""
        if self._own_pool is not None:
            self.client.connection_pool, self._own_pool = self._own_pool, None
        # the one its worker lent last is no loan of this run: a handover without a socket
        # leaves the horse as a fork with nothing lent leaves it (connected at first use)
        self._lent = None
        pool = self.client.connection_pool
        for connection in getattr(pool, "_available_connections", ()):
            if getattr(connection, "_sock", None) is None:
                return connection
        return pool.connection_class(**pool.connection_kwargs)

    def take_handed(self, connection: Any, fd: int) -> None:
        """In a horse forked ahead: the socket its worker handed over with the job (a
        descriptor now this process's) on ``connection`` (:meth:`ready_for_handover`), as
        the one lent; :meth:`adopt` then makes it the pool's only one. The server's side
        is the one the worker's handshake made: redis-py's parser is bound as at a connect."""
        sock = socket.socket(fileno=fd)
        sock.settimeout(connection.socket_timeout)
        connection._sock = sock
        connection._parser.on_connect(connection)
        self._lent = connection

    def prove_state(self, names: tuple[str, ...] = ()) -> None:
        """In the horse, as its job's code has ended: each round trip on the lent
        connection from now on shows its state (:class:`StateProof`); ``names`` are the
        client names the worker's connection may have (its own)."""
        lent = self._lent
        if lent is None or self._proof is not None:
            return
        self._proof = StateProof(lent, LentState(lent, names))

    def hand_back(self) -> int | None:
        """In the horse, its run over: the lent connection's socket descriptor, to pass to
        the worker, if the connection is as the worker would find it in its pool: connected,
        idle (no pubsub or thread of the job holds it), nothing unread on it, and a plain
        socket (a TLS session's state lives in this process's memory: it is not passed), and
        its last round trip showed it in the state it was lent in (:meth:`prove_state`). It
        leaves this process's pool, so that closing the pool leaves it open; this process's
        copy goes with its exit, without a shutdown. Else None: the horse closes it."""
        pool = self.client.connection_pool
        lent, self._lent = self._lent, None
        proof, self._proof = self._proof, None
        if lent is None or not _lendable(pool) or pool.pid != os.getpid():
            return None
        if proof is None or proof.connection is not lent or not proof.proven:
            return None  # what the job left on it is not known to be nothing: it is closed
        # a thread of the job (an event hook's) may be taking a connection from the pool
        # now; a lock a thread of the worker held at the fork is never released here
        if not pool._lock.acquire(blocking=False):
            return None
        try:
            plain = type(getattr(lent, "_sock", None)) is socket.socket
            if lent not in pool._available_connections or not plain:
                return None
            try:
                # a reply nobody read: the worker would read it as its own (one still in
                # flight is not seen, as redis-py's own check at each checkout misses it)
                if lent.can_read(timeout=0):
                    return None
            except Exception:  # closed by the server, or broken
                return None
            pool._available_connections.remove(lent)
        finally:
            pool._lock.release()
        # kept referenced (redis-py's __del__ disconnects), and never shut down from here: a
        # shutdown would end the connection for the worker too
        self._handing_back = lent
        lent.pid = -1
        return int(lent._sock.fileno())

    def lent(self) -> None:
        """In the worker, once forked: its copies of the idle connections closed (the one
        lent stays open in the horse), and its client on the control connection."""
        pool = self.client.connection_pool
        if _lendable(pool):
            with pool._lock:
                idle = list(pool._available_connections)
            for connection in idle:
                if connection is self._lent:
                    _close_here(connection)
                else:
                    connection.disconnect()
        else:
            try:
                pool.disconnect(inuse_connections=False)
            except TypeError:  # a custom pool
                pool.disconnect()
        self._own_pool = pool
        self.client.connection_pool = self.control.connection_pool

    def returned(self, handed_back: int | None = None) -> None:
        """The run is over (its horse told so, or was reaped): the client's own pool again,
        with the lent connection's socket as the horse handed it back (``handed_back``, a
        descriptor now this worker's), else opened anew at its next command."""
        if self._own_pool is not None:
            self.client.connection_pool, self._own_pool = self._own_pool, None
        lent, self._lent = self._lent, None
        if handed_back is not None and not self._take_back(lent, handed_back):
            os.close(handed_back)

    def _take_back(self, lent: Any, fd: int) -> bool:
        """The lent connection object, still idle in this worker's pool with its socket
        closed here at the fork, gets the horse's socket: redis-py's parser is bound to it
        as at a connect, without the connect's handshake (the server's side of the
        connection is the one the handshake was made on)."""
        pool = self.client.connection_pool
        if lent is None or not _lendable(pool) or getattr(lent, "_sock", None) is not None:
            return False
        with pool._lock:
            if lent not in pool._available_connections:
                return False
            sock = socket.socket(fileno=fd)
            try:
                sock.settimeout(lent.socket_timeout)
                lent._sock = sock
                lent._parser.on_connect(lent)
            except Exception:
                lent._sock = None
                sock.detach()  # the caller closes the descriptor
                return False
        self.handed_back += 1
        return True


@contextmanager
def subscribing_also(
    client: Redis, channels: Mapping[str, Callable[[Any], None]], before: Callable[[Any], None] | None = None
) -> Iterator[None]:
    """Within the block, a pubsub made from ``client`` subscribes ``channels`` (name to
    handler) along with whatever its first ``subscribe`` names: RQ's ``subscribe()``, which
    starts its pubsub thread right after, then carries them on its one connection (and
    redis-py subscribes them again after a reconnect). ``before`` gets the pubsub first,
    while its connection can still run other commands."""
    make = client.pubsub

    def pubsub(**kwargs: Any) -> Any:
        made: Any = make(**kwargs)
        first = made.subscribe

        def subscribe(*args: Any, **handlers: Any) -> Any:
            made.subscribe = first
            if before is not None:
                before(made)
            return first(*args, **handlers, **channels)

        made.subscribe = subscribe
        return made

    client.pubsub = pubsub  # type: ignore[method-assign]
    try:
        yield
    finally:
        del client.pubsub
