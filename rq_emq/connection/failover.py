"""Redis Sentinel failovers, from a worker's side: find out at once, and reconnect to the
master Sentinel names *now*.

Why it is needed. ``SENTINEL FAILOVER`` promotes the replica and demotes the old master
only when a sentinel's next ``INFO`` poll finds it still a master (every 10 s); a killed
master that comes back is the same. Until then the old master accepts every write, which
its resync then discards. A connection that stays on it takes jobs there, recovers them
there, fails them at max attempts there, and the outbox drain runs their failure
callbacks: real effects (an email, a refund) for jobs that finish on the new master.
redis-py's Sentinel pool re-resolves only when a connection breaks (or a reply says
``READONLY``), and then asks the first sentinel that answers, which may not have heard
of the switch yet.

What this module does, per worker process and Sentinel service:

- every reconnect of the worker's Sentinel-managed clients resolves the master by epoch
  (:func:`watch` wraps the ``Sentinel`` manager's ``discover_master`` with
  :func:`rq_emq.connection.discovery.confirmed_master`);
- a :class:`FailoverWatch` thread listens for Sentinel's ``+switch-master`` (and looks
  every ``POLL_S`` in case a message was missed); when the master moved it logs one line
  (``master moved to host:port``) and breaks every connection of the watched pools, idle
  ones closed, busy ones (a blocked ``BLMOVE``, the election's ``BLPOP``) shut down so that
  their own thread gets a connection error and reconnects: back at work within a check
  of Sentinel naming the new master, not after the old one's demotion;
- each watch holds its process's take gate (:func:`take_confirmation`; what a take and an
  outbox claim must pass is :mod:`rq_emq.connection.confirm`), and :func:`pause` cuts a
  retry's sleep short when the master moves.

A client that is not Sentinel-managed is left alone (every function here is a no-op).
"""

from __future__ import annotations

import logging
import os
import random
import socket
import threading
import time
import weakref
from typing import Any

from redis import Redis
from redis.exceptions import RedisError

from .confirm import TakeConfirmation
from .discovery import Master, confirmed_master, live_replicas, sentinel_of, text_of

logger = logging.getLogger("rq_emq.failover")

#: How long the watch waits for a ``+switch-master`` message before it looks itself.
POLL_S = 5.0
#: Pause before the watch tries the next sentinel after losing one.
RETRY_S = 0.5


# -- re-resolving connections -----------------------------------------------------------


def _discover_confirmed(manager: Any, original: Any, service: str) -> Any:
    master = confirmed_master(manager, service)
    if master is None:
        return original(service)  # raises MasterNotFoundError, as redis-py does
    return master.address


def _resolve_by_epoch(manager: Any) -> None:
    """Make every reconnect of ``manager``'s clients ask all sentinels (once per manager)."""
    if getattr(manager, "_rq_emq_by_epoch", False):
        return
    original = manager.discover_master
    manager.discover_master = lambda service: _discover_confirmed(manager, original, service)
    manager._rq_emq_by_epoch = True


def reconnect_through_sentinel() -> None:
    """Make a closed Sentinel-managed connection reopen through Sentinel (once per process).

    redis-py 8's ``send_packed_command`` reopens a closed socket itself, to the address the
    connection last used, without ``SentinelManagedConnection.connect`` (which asks
    Sentinel). So a command retried after the watch broke its connection (redis-py retries
    on a connection error), or sent on a connection held outside its pool (the election's
    line, RQ's pubsub), went back to the old master and stayed there until its demotion
    (found by the Sentinel soak). Reconnecting through ``connect()`` first is what
    redis-py before 8 did."""
    from redis.sentinel import SentinelManagedConnection

    if getattr(SentinelManagedConnection, "_rq_emq_reconnects", False):
        return
    send = SentinelManagedConnection.send_packed_command

    def send_packed_command(self: Any, command: Any, check_health: bool = True) -> None:
        if not self._sock:
            self.connect()
        send(self, command, check_health)

    SentinelManagedConnection.send_packed_command = send_packed_command  # type: ignore[method-assign]
    SentinelManagedConnection._rq_emq_reconnects = True  # type: ignore[attr-defined]


def break_connections(pool: Any) -> None:
    """Close ``pool``'s idle connections, and shut the sockets of those in use so that the
    thread using each gets a connection error and reconnects itself (closing them under
    it would race its parser)."""
    pool.disconnect(inuse_connections=False)
    getter = getattr(pool, "_get_in_use_connections", None)
    in_use = list(getter()) if callable(getter) else list(getattr(pool, "_in_use_connections", ()))
    for connection in in_use:
        sock = getattr(connection, "_sock", None)
        if sock is None:
            continue
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass


class FailoverWatch:
    """One per process and Sentinel manager: hears of switches and breaks the watched
    pools' connections when the master moved."""

    def __init__(self, manager: Any, service: str) -> None:
        self.manager = manager
        self.service = service
        self.pools: weakref.WeakSet[Any] = weakref.WeakSet()
        self.current: Master | None = None
        self.moves = 0
        #: replicas Sentinel sees up (not down, not disconnected): a take waits for one of them
        self.live_replicas = 0
        self.takes = TakeConfirmation(self)
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name=f"rq-emq-failover:{service}", daemon=True)
        self._stop = threading.Event()
        self._moved = threading.Event()

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def check(self) -> bool:
        """Ask the sentinels; when the master moved, log it once and break the watched
        connections. Returns whether it moved."""
        master = confirmed_master(self.manager, self.service)
        self.live_replicas = live_replicas(self.manager, self.service)
        with self._lock:
            if master is None or (self.current is not None and master.epoch < self.current.epoch):
                return False
            before, self.current = self.current, master
            if before is None or before.address == master.address:
                return False
            self.moves += 1
        logger.warning(
            "master moved to %s:%s (Sentinel service %s, epoch %d); reconnecting",
            master.host,
            master.port,
            self.service,
            master.epoch,
        )
        for pool in list(self.pools):
            break_connections(pool)
        moved, self._moved = self._moved, threading.Event()
        moved.set()  # wakes every pause() waiting out an unreachable master
        return True

    def pause(self, seconds: float) -> None:
        """Sleep ``seconds``, or less if the master moves meanwhile."""
        self._moved.wait(seconds)

    def _run(self) -> None:
        sentinels = list(self.manager.sentinels)
        offset = random.randrange(len(sentinels)) if sentinels else 0
        failures = 0
        while not self._stop.is_set() and sentinels:
            sentinel = sentinels[(offset + failures) % len(sentinels)]
            try:
                self._listen(sentinel)
            except (RedisError, OSError, ValueError):
                failures += 1  # that sentinel is gone: the next one (quietly; it is normal)
                self._stop.wait(RETRY_S)

    def _listen(self, sentinel: Redis) -> None:
        pubsub = sentinel.pubsub()
        try:
            pubsub.subscribe("+switch-master")
            self.check()  # a switch missed while not listening
            looked = time.monotonic()
            while not self._stop.is_set():
                message = pubsub.get_message(timeout=1.0)
                due = time.monotonic() - looked > POLL_S
                if message is not None and message.get("type") == "message":
                    due = text_of(message.get("data", "")).split(" ", 1)[0] == self.service
                if due:
                    self.check()
                    looked = time.monotonic()
        finally:
            pubsub.close()


_watches: dict[int, FailoverWatch] = {}
_watches_pid = os.getpid()
_watches_lock = threading.Lock()


def watch(client: Redis) -> FailoverWatch | None:
    """Watch ``client``'s master (Sentinel-managed clients only): its reconnects resolve
    by epoch, and a switch breaks its connections at once. None for any other client."""
    global _watches_pid
    found = sentinel_of(client)
    if found is None:
        return None
    manager, service = found
    _resolve_by_epoch(manager)
    reconnect_through_sentinel()
    with _watches_lock:
        if _watches_pid != os.getpid():  # a forked child: the parent's threads are not here
            _watches.clear()
            _watches_pid = os.getpid()
        current = _watches.get(id(manager))
        if current is None:
            current = _watches[id(manager)] = FailoverWatch(manager, service)
            current.start()
    current.pools.add(client.connection_pool)
    return current


def take_confirmation(client: Redis) -> TakeConfirmation | None:
    """The take gate of ``client``'s watch, when its takes should wait for a replica now,
    or, degraded, ask the master whether one is online again (``TakeConfirmation.probing``)."""
    found = sentinel_of(client)
    current = _watches.get(id(found[0])) if found is not None and _watches_pid == os.getpid() else None
    if current is None or not (current.takes.wanted() or current.takes.probing()):
        return None
    return current.takes


def pause(client: Redis, seconds: float) -> None:
    """A retry's sleep after ``client`` failed to reach Redis: cut short when Sentinel
    names a new master, so that a worker resumes within a check of the switch, not after
    the rest of a backoff."""
    found = sentinel_of(client)
    current = _watches.get(id(found[0])) if found is not None and _watches_pid == os.getpid() else None
    if current is None:
        time.sleep(seconds)
    else:
        current.pause(seconds)
