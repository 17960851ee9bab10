"""The idle wait on several queues, on one connection: a watcher per queue set, the other
idle workers blocked on a wake list.

Redis has no blocking move from one of several lists, and a ``BLMPOP`` pops a job that a
worker dying at once would lose. So the workers of one set of queues share the wait:

- **the watcher** (one worker of the set, holding the watch as long as it lives): Redis
  tells it of every write to the set's queue lists (``CLIENT TRACKING ... BCAST PREFIX
  rq:queue:<q>`` on its control connection, which outlives its jobs, the invalidations
  redirected to RQ's pubsub connection, which it holds anyway), so a push wakes it without
  a command sent while it waits. Idle, it takes the job itself. Busy with a job, its pubsub
  thread wakes one standby instead, when a queue holds a job and no wake waits already
  (``wake_a_standby``: its own take is such a write, and costs that check);
- **the standbys** (every other worker of the set): idle, ``BLPOP <set>:wake`` on their work
  connection. A ``w`` wakes one to look; the watch token (pushed by the set's sweeper when
  the watch lapsed: a watcher that died or froze, or one that stopped) makes it the watcher.

Each worker looks at its queues once after each of its jobs (``EXISTS``, one command: a
job pushed while every worker was busy, or requeued by its own worker as the job ended).
The watch is a string holding the watcher's token with an expiry (``hold = lease``,
renewed by the lock manager's tick every third of it, ``hold_watch``); one that wakes to
find itself replaced (it froze past its hold) stops watching. A standby's own wait ends
after ``2 lease`` at the latest (then it looks, and takes a vacant watch): the bound when
the set has no sweeper either.

Each worker keeps to its three connections (:mod:`rq_emq.connection.budget`). A job arriving
while the watcher is idle costs three commands beside its take: the check its take's write
sets off (``EVALSHA``, ``EXISTS``) and the look after it (``EXISTS``), where stock RQ's wait
costs one ``BLPOP``. One arriving while it is busy costs ``wake_a_standby`` (four), the
standby's ``BLPOP``, and the same two-command check when the standby's take is heard. A set with a
backlog pays nothing (nobody waits). Where Redis refuses tracking or the invalidation
channel (an ACL, a server before 6.0), the worker waits with a connection per queue
instead (:mod:`rq_emq.intake.wake`), as it says at start.
"""

from __future__ import annotations

import random
import secrets
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from redis import Redis
from redis.exceptions import ResponseError

from .. import reporter, scripts
from ..hold.held import new_token
from ..keys import QueueKeys, sweeper_election_key, wake_key, watch_key

logger = reporter.PathLogger("rq_emq.lease")  # code the lock manager's threads run


class _All(frozenset[str]):
    """Every queue of the set (a look at all of them): true, though it names none."""

    def __bool__(self) -> bool:
        return True


#: Where a look goes: every queue, or none.
ALL: frozenset[str] = _All()
NOWHERE: frozenset[str] = frozenset()
Look = frozenset[str]

#: The channel Redis sends a RESP2 client's invalidations on.
INVALIDATE = "__redis__:invalidate"
#: A watcher's wait wakes this often (no Redis command), so that a stop signal's handler runs.
STOP_POLL_S = 0.25
#: A busy watcher looks (and wakes a standby) at most this often while standbys take the wakes...
WAKE_GAP_S = 0.05
#: ... and this often while a wake it pushed still waits (every standby busy).
WAKE_BACKOFF_S = 0.5
#: A blocked wait's reply is read this much after Redis's own timeout at the latest.
REPLY_MARGIN_S = 1.0


def prefixes(queues: Sequence[QueueKeys]) -> list[str]:
    """The tracking prefixes of the queue lists: Redis refuses two that overlap, and the
    shorter covers the longer (``rq:queue:q1`` covers ``rq:queue:q10``; a write there is
    one spurious look)."""
    names = sorted({q.rq_queue for q in queues})
    kept: list[str] = []
    for name in names:
        if not any(name.startswith(shorter) for shorter in kept):
            kept.append(name)
    return kept


def _resp3(connection: Any) -> bool:
    return str(getattr(connection, "protocol", 2)) == "3"


def can_watch(client: Redis) -> bool | None:
    """Whether this server and user allow the watch (None: they refuse it; else whether the
    client speaks RESP3): ``CLIENT TRACKING``, and on RESP2 (where
    the invalidations come as messages of a channel) a subscription to that channel; an
    ACL may refuse either, and Redis before 6.0 has neither. Asked on one of the client's
    connections, left as it was."""
    pool = client.connection_pool
    try:
        connection = pool.get_connection()
    except TypeError:  # redis-py < 5.3 wants a command name
        connection = pool.get_connection("CLIENT")  # type: ignore[call-arg]
    try:
        connection.send_command("CLIENT", "TRACKING", "OFF")
        connection.read_response()
        if not _resp3(connection):
            connection.send_command("SUBSCRIBE", INVALIDATE)
            connection.read_response()
            connection.send_command("UNSUBSCRIBE", INVALIDATE)
            connection.read_response()
        return _resp3(connection)
    except ResponseError as error:
        logger.warning(
            "Redis refuses the idle watch of several queues (%s): this worker waits with a connection "
            "per queue (docs/fleet.md)",
            error,
        )
        return None
    except BaseException:
        connection.disconnect()
        raise
    finally:
        pool.release(connection)


class PubsubLine:
    """What the watch needs of RQ's pubsub connection: its client id (the redirect target,
    found again by its name after a reconnect), and the invalidations handed to
    ``on_invalidate`` (RESP2: messages of :data:`INVALIDATE`, to subscribe; RESP3: pushes)."""

    def __init__(
        self,
        on_invalidate: Callable[[Any], None],
        resp3: bool,
        on_reconnect: Callable[[], None] | None = None,
    ) -> None:
        self.name = "rq-emq-pubsub-" + secrets.token_hex(8)
        self.client_id: int | None = None
        self.on_invalidate = on_invalidate
        self.resp3 = resp3
        #: Told when the pubsub connection connected again (a Redis restart or failover
        #: that redis-py rode out): the tracking redirected to it ended with the old one.
        self.on_reconnect = on_reconnect

    def channels(self) -> dict[str, Callable[[Any], None]]:
        """The channels to subscribe with RQ's: the invalidations' on RESP2."""
        return {} if self.resp3 else {INVALIDATE: self.on_invalidate}

    def name_it(self, pubsub: Any) -> None:
        """Before RQ's first ``SUBSCRIBE``: the connection named (again at each reconnect,
        by redis-py), its id read, and on RESP3 its invalidation pushes handed over. A
        failure leaves the worker on a connection per queue."""
        try:
            pubsub.execute_command("CLIENT", "SETNAME", self.name)
            pubsub.parse_response(block=True, timeout=5)
            connection = pubsub.connection
            connection.client_name = self.name
            if _resp3(connection):
                connection._parser.set_invalidation_push_handler(self.on_invalidate)
            pubsub.execute_command("CLIENT", "ID")
            self.client_id = int(pubsub.parse_response(block=True, timeout=5))
            # redis-py keeps a weak reference to a bound method: this line lives as long
            # as its worker
            connection.register_connect_callback(self._reconnected)
        except Exception as error:
            logger.warning(
                "RQ's pubsub connection cannot carry the idle watch (%s): this worker waits with a "
                "connection per queue",
                error,
            )
            self.client_id = None

    def _reconnected(self, connection: Any) -> None:
        """redis-py connected the pubsub again (after its own re-subscribe): the watcher
        starts its tracking again now, not at its next keep (a third of a lease later)."""
        try:
            if self.resp3 and _resp3(connection):
                connection._parser.set_invalidation_push_handler(self.on_invalidate)
            if self.on_reconnect is not None:
                self.on_reconnect()
        except Exception as error:  # never in the way of redis-py's reconnect
            logger.info("the idle watch could not hear of a reconnect: %s", error)

    def find(self, client: Redis) -> int | None:
        """The pubsub connection's id now (after a reconnect), by its name."""
        for entry in client.client_list(_type="pubsub"):
            if entry.get("name") == self.name:
                self.client_id = int(entry["id"])
                return self.client_id
        return None


class QueueSetWatch:
    """One worker's part in the idle wait of its queue set (several queues)."""

    def __init__(
        self,
        work: Redis,
        control: Redis,
        worker_name: str,
        queues: Sequence[QueueKeys],
        lease_ms: int,
        line: PubsubLine,
    ) -> None:
        self.work = work
        self.control = control
        self.line = line
        #: The worker was told to stop: the watch's wait ends (rq_emq.intake.take.Taker's own).
        self.stop_requested: Callable[[], bool] = lambda: False
        first = queues[0]
        election = sweeper_election_key([q.queue for q in queues], first.queue_prefix, first.job_prefix)
        self.keys = [watch_key(election), wake_key(election)]
        self.queue_keys = [q.rq_queue for q in queues]
        self.prefixes = prefixes(queues)
        self.token = new_token(worker_name)
        self.hold_ms = max(int(lease_ms), 1000)
        self.standby_s = 2 * self.hold_ms / 1000.0
        #: Set by RQ's pubsub thread on a write to one of the set's queues while idle.
        self.arrived = threading.Event()
        #: The queue lists written since the watcher last looked (None: any of them).
        self._written: set[bytes] | None = set()
        self._lock = threading.Lock()
        self._wake_timer: threading.Timer | None = None
        self._next_wake_at = 0.0
        self.watching = False
        #: A take of the watch was sent: it may be this worker's although ``watching`` is
        #: not yet set (a stop signal that interrupted the take or the tracking's start)
        self.may_hold = False
        #: The watcher's main thread waits (a write then wakes it, not a standby).
        self._idle = False
        self._kept_at = 0.0
        #: Take a vacant watch before the next standby wait: at the first, and after a
        #: standby wait ran out (a fleet's first worker; a token lost with a dead standby).
        self._vacant_maybe = True
        #: Monotonic time before which a watch that could not start is not tried again
        self._retry_at = 0.0
        #: How many times the tracking was lost (:meth:`lost`), watching or not: a start
        #: that a loss overtook redirects to a pubsub connection that may be gone
        self._losses = 0

    # -- RQ's pubsub thread --------------------------------------------------------------

    def heard(self, message: Any) -> None:
        """An invalidation: a RESP2 message (its data the keys) or a RESP3 push
        (``[invalidate, keys]``); no keys means every key (a flush)."""
        if isinstance(message, dict):
            keys = message.get("data")
        elif isinstance(message, (list, tuple)) and len(message) > 1:
            keys = message[1]
        else:
            keys = None
        with self._lock:
            if keys is None or not isinstance(keys, (list, tuple)) or self._written is None:
                self._written = None
            else:
                self._written.update(k if isinstance(k, bytes) else str(k).encode() for k in keys)
            idle = self._idle
        if idle:
            self.arrived.set()
        elif self.watching:
            self._wake_soon()

    def _wake_soon(self) -> None:
        """Wake a standby now, or once the gap after the last wake has passed: a busy
        watcher hears every write to its queues (each take of a backlog among them), and
        one call per gap stands for all of them."""
        with self._lock:
            if self._wake_timer is not None:
                return
            delay = self._next_wake_at - time.monotonic()
            if delay > 0:
                self._wake_timer = threading.Timer(delay, self._wake_a_standby)
                self._wake_timer.daemon = True
                self._wake_timer.start()
                return
        self._wake_a_standby()

    def _wake_a_standby(self) -> None:
        with self._lock:
            self._wake_timer = None
            # the keys stay written: the watcher looks there too once idle (the standby may
            # have taken the job by then: one look for nothing), and where there is no
            # standby at all, that look takes it
            written = ALL if self._written is None else self._match(self._written)
        if not written or self._idle or not self.watching:
            return
        keys = [self.keys[1], *self.queue_keys]
        try:
            woke = int(scripts.load("wake_a_standby")(self.control, keys, []))
        except Exception as error:  # the standbys' own waits end within 2 leases
            logger.info("could not wake an idle worker of %s: %s", self.keys[1], error)
            woke = 2
        # a wake still waiting: no standby is idle, so look again only after a while
        self._next_wake_at = time.monotonic() + (WAKE_BACKOFF_S if woke == 2 else WAKE_GAP_S)

    def _take_written(self) -> Look:
        with self._lock:
            written, self._written = self._written, set()
        return ALL if written is None else self._match(written)

    def _match(self, written: set[bytes]) -> Look:
        return frozenset(k.decode() for k in written) & frozenset(self.queue_keys)

    # -- the main thread -----------------------------------------------------------------

    def after_job(self) -> Look:
        """Where to look after a job: the queues, if one holds a job (``EXISTS``, one
        command: a job this worker requeued itself, or one pushed while every worker
        was busy)."""
        with self._lock:
            self._written = set()
        return ALL if int(self.work.exists(*self.queue_keys)) > 0 else NOWHERE

    def wait(self, timeout: float) -> Look:
        """Wait up to ``timeout`` for a job to arrive. Returns where the caller should look
        (``pop_job``): :data:`ALL` the queues, or some of them (empty: nowhere)."""
        if timeout <= 0:
            return ALL
        if self.watching:
            return self._watch(timeout)
        pause = min(self._retry_at - time.monotonic(), timeout)
        if pause > 0:  # the watch could not start a moment ago (its pubsub reconnecting)
            time.sleep(pause)
            return ALL
        if self._vacant_maybe:
            self._vacant_maybe = False
            if self._hold():
                return self._start_watching()
        woken = self._standby(min(timeout, random.uniform(self.standby_s / 2, self.standby_s)))
        if woken is None:
            self._vacant_maybe = True
            return ALL  # the wait ran out: the set may have had no watcher a while, look
        if woken != "w" and self._hold():  # the watch is vacant: its token came
            return self._start_watching()
        return ALL

    def _watch(self, timeout: float) -> Look:
        deadline = time.monotonic() + timeout
        with self._lock:
            self._idle = True
            written = self._written
        try:
            if written is None or written:  # heard while it looked
                self.arrived.set()
            while True:
                remaining = deadline - time.monotonic()
                if self.arrived.wait(max(0.0, min(remaining, STOP_POLL_S))):
                    self.arrived.clear()
                    look = self._take_written()
                    if look:
                        return look
                    continue  # a list the prefix covers (``rq:queue:q0x``)
                if remaining <= 0 or not self.watching or self.stop_requested():
                    return NOWHERE if self.watching else ALL
        finally:
            with self._lock:
                self._idle = False

    def _start_watching(self) -> Look:
        """With the watch: track the queues on the control connection, and look (one round
        trip). The pubsub connection is found by its name each time (a ``CLIENT LIST`` of the
        pubsub clients, one per worker, as a watch starts): an id kept from before a Redis
        restart may name another client since, ids starting again from 1."""
        losses = self._losses
        redirect = self.line.find(self.control)
        if redirect is None:
            return self._not_now()
        with self._lock:
            self._written = set()
        self.arrived.clear()
        pipe = self.control.pipeline(transaction=False)
        self._track(pipe, redirect)
        pipe.exists(*self.queue_keys)
        _, tracking, waiting = pipe.execute(raise_on_error=False)
        # the pubsub connection gone again meanwhile; or it connected again after the
        # lookup (its loss, told before ``watching`` is set, ends nothing): the redirect may
        # name the connection that is gone, and no keep would see it for a third of a hold
        if isinstance(tracking, Exception) or self._losses != losses:
            return self._not_now()
        self.watching = True
        self._kept_at = time.monotonic()
        logger.debug("watching %s", self.keys[0])
        return ALL if not isinstance(waiting, int) or waiting > 0 else NOWHERE

    def _not_now(self) -> Look:
        """The watch cannot start yet (RQ's pubsub connection is not back after a Redis
        restart): given up for a second, and taken again while still vacant."""
        self.control.delete(self.keys[0])
        self._vacant_maybe = True
        self._retry_at = time.monotonic() + 1.0
        return ALL

    def _track(self, pipe: Any, redirect: int) -> None:
        """Queue the tracking, redirected to ``redirect``: off first, since a tracking left
        on (its redirect broken by a reconnect of the pubsub connection) refuses the same
        prefixes again. Two replies, the second the tracking's."""
        pipe.execute_command("CLIENT", "TRACKING", "OFF")
        args: list[Any] = ["CLIENT", "TRACKING", "ON", "REDIRECT", redirect, "BCAST"]
        for prefix in self.prefixes:
            args += ["PREFIX", prefix]
        pipe.execute_command(*args)

    def _hold(self) -> bool:
        """Take the watch where it is vacant (nobody holds it, and no token waits in the
        wake list: the caller just took it, or there was none)."""
        self.may_hold = True
        held = scripts.load("hold_watch")(self.control, self.keys, [self.token, self.hold_ms])
        return int(held) == 1

    def _standby(self, timeout_s: float) -> str | None:
        """``BLPOP`` on the wake list, on the work connection: what came (``w``, or the
        watch's token), None when nothing did. A stop that interrupts it closes the
        connection (a token lost with it is replaced by the sweeper once the watch lapses)."""
        pool = self.work.connection_pool
        connection = pool.get_connection()
        block = max(round(timeout_s, 3), 0.001)  # Redis reads 0 as "forever"
        try:
            connection.send_command("BLPOP", self.keys[1], block)
            # a stop signal interrupts the select: its handler raises (RQ's StopRequested)
            if not connection.can_read(timeout=block + REPLY_MARGIN_S):
                raise TimeoutError(f"no reply to BLPOP {self.keys[1]} after {block} s")
            reply = connection.read_response()
        except BaseException:
            connection.disconnect()
            raise
        finally:
            pool.release(connection)
        if reply is None:
            return None
        woken = reply[1]
        return woken.decode() if isinstance(woken, bytes) else str(woken)

    # -- the lock manager's tick, and the stop -------------------------------------------

    def lost(self) -> None:
        """Redis trouble on the control connection (a blip, a restart), or RQ's pubsub
        connection connected again (the redirect's target): the tracking is gone with it.
        The watcher stops watching and its wait ends, so that RQ's loop meets the trouble
        (and, after a restart, registers the worker again) and looks at its queues; it
        takes the watch again, vacant or its own, at its next wait."""
        self._losses += 1
        if not self.watching:
            return
        self.watching = False
        self._vacant_maybe = True
        with self._lock:
            self._written = None
        self.arrived.set()

    def keep(self) -> None:
        """Renew the watch every third of its hold (the tracking too, where the control
        connection or the pubsub reconnected); a watcher that was replaced stops."""
        if not self.watching or time.monotonic() - self._kept_at < self.hold_ms / 3000.0:
            return
        sent = time.monotonic()
        pipe = self.control.pipeline(transaction=False)
        scripts.load("hold_watch").queue(pipe, self.keys, [self.token, self.hold_ms])
        pipe.execute_command("CLIENT", "TRACKINGINFO")
        held, info = pipe.execute(raise_on_error=False)
        if scripts.is_noscript(held):
            held = scripts.load("hold_watch")(self.control, self.keys, [self.token, self.hold_ms])
        if isinstance(held, Exception):
            raise held
        if int(held) != 1:
            self.watching = False
            self.arrived.set()  # an idle watcher's wait ends: it looks, then stands by
            self.control.execute_command("CLIENT", "TRACKING", "OFF")
            logger.info("the idle watch of %s passed to another worker", self.keys[0])
            return
        if _untracked(info):
            redirect = self.line.find(self.control)
            if redirect is not None:
                pipe = self.control.pipeline(transaction=False)
                self._track(pipe, redirect)
                pipe.execute()
                # what was pushed while nobody tracked was heard by nobody: look once
                self.heard(None)
        self._kept_at = sent

    def leave(self) -> None:
        """A stopping watcher: the watch given up and its token pushed, for a standby to
        take at once. Also where a stop interrupted the watch's start: the watch is given up
        only while it still holds this worker's token (one WATCH/MULTI transaction)."""
        if not (self.watching or self.may_hold):
            return
        watching, self.watching, self.may_hold = self.watching, False, False
        watch, wake = self.keys

        def hand_on(pipe: Any) -> None:
            held = pipe.get(watch)
            pipe.multi()
            if held in (self.token, self.token.encode()):
                pipe.delete(watch)
                pipe.rpush(wake, self.token)
            if watching:
                pipe.execute_command("CLIENT", "TRACKING", "OFF")

        self.control.transaction(hand_on, watch)


def _untracked(info: Any) -> bool:
    """Whether ``CLIENT TRACKINGINFO`` says the tracking is off (the connection reconnected)
    or its redirect broken (the pubsub connection reconnected)."""
    if not isinstance(info, (list, dict)):
        return False
    if isinstance(info, list):
        info = dict(zip(info[0::2], info[1::2], strict=False))
    flags = info.get(b"flags", info.get("flags", [])) or []
    words = {f.decode() if isinstance(f, bytes) else str(f) for f in flags}
    return bool(words & {"off", "broken_redirect"})
