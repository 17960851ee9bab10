"""Redis Sentinel failovers, from a worker's side: find out at once, reconnect to the master
Sentinel names *now*, and act with effects outside Redis only on a master so confirmed.

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

- :func:`confirmed_master` asks every sentinel and believes the one with the highest
  ``config-epoch`` (the epoch a failover raises): one sentinel late to hear of a switch
  cannot send a connection back to the old master;
- every reconnect of the worker's Sentinel-managed clients resolves the master that way
  (:func:`watch` wraps the ``Sentinel`` manager's ``discover_master``);
- a :class:`FailoverWatch` thread listens for Sentinel's ``+switch-master`` (and looks
  every ``POLL_S`` in case a message was missed); when the master moved it logs one line
  (``master moved to host:port``) and breaks every connection of the watched pools, idle
  ones closed, busy ones (a blocked ``BLMOVE``, the election's ``BLPOP``) shut down so that
  their own thread gets a connection error and reconnects: back at work within a check
  of Sentinel naming the new master, not after the old one's demotion;
- :class:`TakeConfirmation` is the take's gate: while Sentinel knows a live replica, a
  take counts only once a replica has it (``WAIT 1`` on the take's own connection). After
  ``SENTINEL FAILOVER`` promotes the replica, the old master still grants takes until the
  switch is announced, and none of them reaches the new master, where another worker
  would take the same job: run, the two would overlap. An unconfirmed take is handed back
  at once (harmless on either master), and the worker pauses until the switch is heard;
- :func:`claim_confirmed` is the outbox drain's gate (the one place a sweeper runs user
  code): a claim counts only if it was made on the master Sentinel names (same run id,
  read on the claim's own connection), a replica acknowledged it (``WAIT``), and Sentinel
  still names that master afterwards. A claim on a demoted or soon-demoted master is left
  to lapse; its data goes with the resync.

A client that is not Sentinel-managed is left alone (every function here is a no-op).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import random
import socket
import threading
import time
import weakref
from dataclasses import dataclass
from typing import Any

from redis import Redis
from redis.exceptions import RedisError

logger = logging.getLogger("rq_emq.failover")

#: How long the watch waits for a ``+switch-master`` message before it looks itself.
POLL_S = 5.0
#: Pause before the watch tries the next sentinel after losing one.
RETRY_S = 0.5
#: How long a take waits for a replica's acknowledgement; it takes about one replication
#: round trip on a healthy link, so this is all slack for a loaded host.
TAKE_WAIT_MS = 250
#: A worker whose takes go unacknowledged pauses this long (cut short by a switch).
UNCONFIRMED_PAUSE_S = 0.5
#: Takes unacknowledged this long with no switch announced mean a replica that is slow or
#: gone, not a promotion (Sentinel announces a promotion within a second or two): the
#: worker then takes without the replica's acknowledgement for DEGRADED_S, saying so once.
DEGRADE_AFTER_S = 3.0
DEGRADED_S = 30.0


@dataclass(frozen=True)
class Master:
    """The master as the most recent sentinel knows it."""

    host: str
    port: int
    run_id: str
    epoch: int
    replicas: int

    @property
    def address(self) -> tuple[str, int]:
        return (self.host, self.port)


def sentinel_of(client: Redis) -> tuple[Any, str] | None:
    """The ``Sentinel`` manager and service name behind ``client``'s connections, if any:
    its pool's (RQ's ``SENTINEL`` setting) or, for a pool copied from one
    (:func:`rq_emq.hold.lease.own_client`), the one its connections resolve through."""
    pool = client.connection_pool
    for holder in (pool, pool.connection_kwargs.get("connection_pool")):
        manager = getattr(holder, "sentinel_manager", None)
        service = getattr(holder, "service_name", None)
        if manager is not None and isinstance(service, str):
            return manager, service
    return None


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _state(sentinel: Redis, service: str) -> dict[str, Any]:
    reply = sentinel.execute_command("SENTINEL MASTER", service)
    if isinstance(reply, dict):
        return {_text(k): v for k, v in reply.items()}
    items = list(reply)
    return {_text(k): v for k, v in zip(items[0::2], items[1::2], strict=False)}


def confirmed_master(manager: Any, service: str) -> Master | None:
    """The master named by the sentinel with the highest ``config-epoch``, among those
    that answer and see it up (None when none does)."""
    best: Master | None = None
    for sentinel in list(manager.sentinels):
        try:
            state = _state(sentinel, service)
        except (RedisError, OSError):
            continue
        flags = _text(state.get("flags", "")).replace(",", " ").split()
        if "master" not in flags or "s_down" in flags or "o_down" in flags:
            continue
        master = Master(
            host=_text(state.get("ip", "")),
            port=int(_text(state.get("port", 0))),
            run_id=_text(state.get("runid", "")),
            epoch=int(_text(state.get("config-epoch", 0))),
            replicas=int(_text(state.get("num-slaves", 0))),
        )
        if best is None or master.epoch > best.epoch:
            best = master
    return best


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
                    due = _text(message.get("data", "")).split(" ", 1)[0] == self.service
                if due:
                    self.check()
                    looked = time.monotonic()
        finally:
            pubsub.close()


def live_replicas(manager: Any, service: str) -> int:
    """How many of the service's replicas the first answering sentinel sees up."""
    for sentinel in list(manager.sentinels):
        try:
            replies = sentinel.execute_command("SENTINEL REPLICAS", service)
        except (RedisError, OSError):
            continue
        count = 0
        for reply in replies or []:
            state = (
                {_text(k): v for k, v in reply.items()}
                if isinstance(reply, dict)
                else dict(zip(map(_text, reply[0::2]), reply[1::2], strict=False))
            )
            flags = set(_text(state.get("flags", "")).split(","))
            count += not flags & {"s_down", "o_down", "disconnected"}
        return count
    return 0


class TakeConfirmation:
    """Whether a worker's takes wait for a replica's acknowledgement, and what it learned
    from the last ones (one per watch: every worker thread of the process shares it)."""

    def __init__(self, watch: FailoverWatch) -> None:
        self.watch = watch
        self._unacked_since: float | None = None
        self._unacked_moves = 0
        self._degraded_until = 0.0

    def wanted(self) -> bool:
        return self.watch.live_replicas > 0 and time.monotonic() >= self._degraded_until

    def acked(self) -> None:
        self._unacked_since = None

    def unacked(self, job_id: str) -> None:
        """A take no replica acknowledged (it was handed back): log the first of a run of
        them, and give up waiting for replicas when no switch explains the run."""
        now = time.monotonic()
        if self._unacked_since is None or self._unacked_moves != self.watch.moves:
            self._unacked_since, self._unacked_moves = now, self.watch.moves
            logger.warning(
                "job %s: no replica acknowledged its take within %d ms (a failover under way?): "
                "handed back; takes resume once the switch is heard or a replica answers",
                job_id,
                TAKE_WAIT_MS,
                extra={"job_id": job_id},
            )
        elif now - self._unacked_since > DEGRADE_AFTER_S:
            self._unacked_since, self._degraded_until = None, now + DEGRADED_S
            logger.warning(
                "no replica has acknowledged a take for %.0f s and Sentinel announced no switch: "
                "taking without a replica's acknowledgement for %.0f s",
                DEGRADE_AFTER_S,
                DEGRADED_S,
            )
        self.watch.pause(UNCONFIRMED_PAUSE_S)


def take_confirmation(client: Redis) -> TakeConfirmation | None:
    """The take gate of ``client``'s watch, when its takes should wait for a replica now."""
    found = sentinel_of(client)
    current = _watches.get(id(found[0])) if found is not None and _watches_pid == os.getpid() else None
    if current is None or not current.takes.wanted():
        return None
    return current.takes


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


# -- acting only on a confirmed master --------------------------------------------------


def claim_checks(client: Redis, pipe: Any, timeout_ms: int) -> Master | None:
    """Before a claim whose holder will run user code: the master Sentinel names now, and
    the checks queued on ``pipe`` after the claim (the claim's own connection): the
    server's run id, and ``WAIT`` for one replica when Sentinel sees one up. None for a
    client that is not Sentinel-managed (nothing is queued)."""
    found = sentinel_of(client)
    if found is None:
        return None
    master = confirmed_master(*found)
    if master is not None:
        # a replica Sentinel knows but sees down (a killed master that has not rejoined)
        # acknowledges nothing: waiting for it would hold every failure callback until it
        # is back, however long (the Sentinel soak's seed 3 never got them run)
        master = dataclasses.replace(master, replicas=live_replicas(*found))
    pipe.execute_command("INFO", "server")
    if master is not None and master.replicas > 0:
        pipe.execute_command("WAIT", 1, max(timeout_ms, 1))
    return master


def claim_confirmed(client: Redis, before: Master | None, replies: list[Any]) -> bool:
    """Whether a claim made on the connection that answered ``replies`` (those queued by
    :func:`claim_checks`) may be acted on: it was made on the master Sentinel named,
    replicated, and Sentinel names the same master still."""
    found = sentinel_of(client)
    if found is None:
        return True
    if before is None or not replies or not isinstance(replies[0], dict):
        return False
    if _text(replies[0].get("run_id", "")) != before.run_id:
        return False
    if before.replicas > 0 and (len(replies) < 2 or not isinstance(replies[1], int) or replies[1] < 1):
        return False
    after = confirmed_master(*found)
    return after is not None and after.run_id == before.run_id and after.epoch == before.epoch


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
