"""The idle wait: one blocked ``BLMOVE`` per queue, so each push wakes one worker.

An idle worker (every queue empty) sends ``BLMOVE rq:queue:<q> emq:{<q>}:moving
LEFT RIGHT <timeout>`` on each of its queues, each on a connection of its own taken from
the client's pool (TLS, ACL users and Sentinel-managed connections come as configured),
without waiting for the replies, and watches their sockets together with ``select``.
Redis hands a pushed job to the one client that blocked first on that list: a push wakes
one worker however many wait, and a worker that is busy waits on nothing, so Redis keeps
nothing for it (no client-side-caching invalidations piling up in an output buffer).

When one wait returns a job, the others are cancelled with ``CLIENT UNBLOCK`` and their
replies read, so a job that a second queue moved at the same moment is known; the caller
claims the job of the worker's first queue and hands the others back (``return_moved_job``).
A cancelled or timed-out wait returns nil, and its connection goes back to the pool.

Where an ACL refuses ``CLIENT ID`` or ``CLIENT UNBLOCK``, a wait is cancelled by
half-closing its connection: Redis frees the client on the end of its input, and a reply
it wrote in an earlier pass of its event loop (it served the wait just before) is still
read from the open half and handed back. What is left (a wait served in the very pass in
which Redis reads the end of input; TLS connections, which cannot half-close and are
closed) is a job without a lock in the moving list, where the sweep finds it, as it
finds the job of a worker that died between its ``BLMOVE`` and its claim.

The moving list is ours, not RQ's ``rq:queue:<q>:intermediate``: a stock worker's job in a
mixed fleet is never in it (our sweep recovers only what is there), and RQ's
intermediate-list cleanup, which fails what it finds, never sees one of ours.

**The connection budget.** A worker on ``k`` queues holds ``k + 3`` connections while idle
(one wait per queue, its main connection, the lock manager's, the sweeper election's line)
plus RQ's pubsub. Where Redis refuses one of the waits' connections (``maxclients``
reached: many workers on many queues), the worker does not keep what it got: every wait
connection is closed again, and :class:`WaitRefused` tells the taker to wait with its one
main connection instead (it polls, :mod:`rq_emq.intake.take`), so it still takes jobs and leaves
the server's slots to other clients.

No ``BLPOP``/``BLMPOP`` on a queue: they pop without a trace, and a worker dying just after
loses the job. (The sweeper election's line, :mod:`rq_emq.recover.election`, is the one
``BLPOP``: it holds no job.)
"""

from __future__ import annotations

import logging
import selectors
import socket
import ssl
import weakref
from collections.abc import Sequence
from typing import Any

from redis import Redis
from redis.connection import ConnectionPool
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from .. import scripts
from ..keys import QueueKeys

logger = logging.getLogger("rq_emq.lease")

#: The select outlasts the BLMOVE timeout by this much: Redis's own timeout normally ends the wait.
SELECT_MARGIN_S = 1.0


class WaitRefused(RedisConnectionError):
    """Redis refused a connection for one of the waits (its client limit): every wait
    connection of this spell was closed again."""


def _refused_for_clients(error: Exception) -> bool:
    return "max number of clients" in str(error).lower()


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _borrow(pool: ConnectionPool) -> Any:
    try:
        return pool.get_connection()
    except TypeError:  # redis-py < 5.3 wants a command name
        return pool.get_connection("BLMOVE")  # type: ignore[call-arg]


class _Blocked:
    """One queue's wait: its connection, and whether its reply is still to read."""

    def __init__(self, index: int, queue: QueueKeys, connection: Any, client_id: int | None) -> None:
        self.index = index
        self.queue = queue
        self.connection = connection
        self.client_id = client_id
        self.pending = True
        #: cancelled by closing our half of the connection: its end of input is no trouble
        self.half_closed = False


class Waiting:
    """The waits of one idle spell, from sending them to reading every reply back."""

    def __init__(self, owner: QueueWait, blocked: list[_Blocked]) -> None:
        self._owner = owner
        self._blocked = blocked
        self.done = False

    def ready(self, timeout: float) -> bool:
        """Block until a reply can be read (True) or ``timeout`` passes. A signal handler
        that raises (RQ's StopRequested on SIGTERM) interrupts it."""
        waiting = [b for b in self._blocked if b.pending]
        if any(b.connection.can_read(timeout=0) for b in waiting):
            return True
        with selectors.DefaultSelector() as selector:
            for b in waiting:
                selector.register(b.connection._sock, selectors.EVENT_READ)
            return bool(selector.select(timeout))

    def collect(self) -> list[tuple[int, str]]:
        """End every wait: read the replies at hand, cancel the others and read theirs.
        Returns the jobs moved into moving lists, as (queue index, job id), in the
        worker's queue order. Connection trouble is raised only when nothing was moved
        (a job moved by a broken connection is left to the sweep)."""
        self.done = True
        moved: list[tuple[int, str]] = []
        trouble: Exception | None = None
        ready = [b for b in self._blocked if b.pending and self._readable(b)]
        for b in ready:
            trouble = self._read(b, moved) or trouble
        rest = [b for b in self._blocked if b.pending]
        if rest:
            self._owner.cancel(rest, [b.connection for b in self._blocked if not b.pending])
            for b in rest:
                trouble = self._read(b, moved) or trouble
        for b in self._blocked:
            self._owner.release(b.connection)
        if trouble is not None and not moved:
            raise trouble
        return sorted(moved)

    @staticmethod
    def _readable(b: _Blocked) -> bool:
        try:
            return bool(b.connection.can_read(timeout=0))
        except (RedisError, OSError):
            return True  # reading will raise the trouble

    @staticmethod
    def _read(b: _Blocked, moved: list[tuple[int, str]]) -> Exception | None:
        b.pending = False
        try:
            if b.connection._sock is None:
                # redis-py dropped it when its readiness check failed (a reset): a read now
                # would hit its torn-down parser (AttributeError), not a connection error
                raise RedisConnectionError("the wait's connection was closed while it waited")
            reply = b.connection.read_response()
        except (RedisConnectionError, RedisTimeoutError, OSError) as error:
            b.connection.disconnect()
            return None if b.half_closed else error
        if b.half_closed:
            b.connection.disconnect()
        if reply is not None:
            moved.append((b.index, _text(reply)))
        return None


class QueueWait:
    """A worker's idle wait on its queues (one instance per worker, reused)."""

    def __init__(self, client: Redis) -> None:
        self.client = client
        self.pool: ConnectionPool = client.connection_pool
        #: CLIENT ID per pooled connection, with the socket it was read on (a reconnect changes it)
        self._client_ids: weakref.WeakKeyDictionary[Any, tuple[Any, int]] = weakref.WeakKeyDictionary()
        #: False once the server refused CLIENT ID or CLIENT UNBLOCK: cancel by closing instead
        self.can_unblock = True

    def start(self, queues: Sequence[QueueKeys], timeout: float) -> Waiting:
        """Send one ``BLMOVE`` per queue, each on its own connection, without waiting."""
        block = max(timeout, 0.001)  # Redis reads 0 as "forever"
        blocked: list[_Blocked] = []
        try:
            for index, queue in enumerate(queues):
                try:
                    connection = _borrow(self.pool)
                except RedisConnectionError as error:
                    if not _refused_for_clients(error):
                        raise
                    self._close_waits(queues, blocked)
                    raise WaitRefused(str(error)) from error
                try:
                    client_id = self._client_id(connection)
                    connection.send_command("BLMOVE", queue.rq_queue, queue.moving, "LEFT", "RIGHT", block)
                except BaseException:
                    connection.disconnect()
                    self.release(connection)
                    raise
                blocked.append(_Blocked(index, queue, connection, client_id))
        except BaseException:  # a stop or a broken connection halfway: end the waits already sent
            try:
                for index, job_id in Waiting(self, blocked).collect():
                    self.hand_back(queues[index], job_id)
            except Exception:
                pass  # what a broken connection moved is left to the sweep
            raise
        return Waiting(self, blocked)

    def _close_waits(self, queues: Sequence[QueueKeys], blocked: list[_Blocked]) -> None:
        """End the waits sent so far, hand back what they moved, and close their
        connections (released to the pool unconnected: no server slot kept)."""
        try:
            for index, job_id in Waiting(self, blocked).collect():
                self.hand_back(queues[index], job_id)
        except Exception:
            pass  # what a broken connection moved is left to the sweep
        for b in blocked:
            b.connection.disconnect()
        blocked.clear()

    def _client_id(self, connection: Any) -> int | None:
        if not self.can_unblock:
            return None
        connection.connect()
        cached = self._client_ids.get(connection)
        if cached is not None and cached[0] is connection._sock:
            return cached[1]
        try:
            connection.send_command("CLIENT", "ID")
            client_id = int(connection.read_response())
        except ResponseError as error:
            self._refused(error)
            return None
        self._client_ids[connection] = (connection._sock, client_id)
        return client_id

    def _refused(self, error: Exception) -> None:
        if self.can_unblock:
            logger.warning(
                "Redis refused %s; an idle worker's waits are cancelled by closing their connections",
                error,
            )
        self.can_unblock = False

    def cancel(self, blocked: Sequence[_Blocked], free: Sequence[Any]) -> None:
        """Cancel ``blocked`` waits; their replies (nil, or a job moved just before) are
        then read by the caller. ``free`` are connections with no reply pending."""
        ids = [b.client_id for b in blocked]
        if self.can_unblock and all(i is not None for i in ids):
            control = free[0] if free else _borrow(self.pool)
            try:
                for client_id in ids:
                    control.send_command("CLIENT", "UNBLOCK", client_id)
                for _ in ids:
                    control.read_response()
                return
            except ResponseError as error:  # an ACL without client|unblock
                while control.can_read(timeout=0):  # the other refusals
                    try:
                        control.read_response()
                    except ResponseError:
                        pass
                self._refused(error)
            finally:
                if not free:
                    self.release(control)
        for b in blocked:
            self._half_close(b)

    @staticmethod
    def _half_close(b: _Blocked) -> None:
        """End a blocked wait by closing our half of its connection: Redis frees the
        client, and a reply it had already written can still be read (then EOF)."""
        b.half_closed = True
        sock = b.connection._sock
        try:
            if sock is not None and not isinstance(sock, ssl.SSLSocket):
                sock.shutdown(socket.SHUT_WR)
                return
        except OSError:
            pass
        b.connection.disconnect()  # TLS: a reply in flight is lost; the job waits for the sweep

    def release(self, connection: Any) -> None:
        try:
            self.pool.release(connection)
        except Exception:  # a pool that refuses a broken connection: drop it
            connection.disconnect()

    def hand_back(self, queue: QueueKeys, job_id: str) -> bool:
        """Put a job that one of our waits moved, and that we will not claim, back at the
        head of its queue (where another idle worker's wait takes it)."""
        return bool(scripts.load("return_moved_job")(self.client, [queue.moving, queue.rq_queue], [job_id]))
