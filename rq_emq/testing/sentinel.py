"""A private Sentinel deployment for tests, benchmarks and the soak: a primary, one replica
and some sentinels, all on free loopback ports, with the two failover kinds an operator
meets (``SENTINEL FAILOVER``, and the primary SIGKILLed).

``SENTINEL FAILOVER`` is *not* write-safe: Sentinel promotes the replica with ``REPLICAOF
NO ONE`` and demotes the old primary only when its next ``INFO`` poll (every 10 s) finds
it still a primary; until then the old primary accepts writes, which its resync then
discards. That window is what docs/guarantees.md#redis-failover is about."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import redis
from redis.sentinel import MasterNotFoundError, Sentinel

from . import RedisServer, free_port, require_server_binary

SERVICE = "rq-emq-primary"


def _wait(predicate: object, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if predicate():  # type: ignore[operator]
                return
        except redis.RedisError:
            pass
        time.sleep(0.05)
    raise TimeoutError(f"timed out after {timeout}s waiting for {what}")


def named_master_port(sentinel: Sentinel, timeout: float = 10.0) -> int:
    """The port of the master ``sentinel``'s sentinels name, waiting up to ``timeout`` for
    one to name it.

    Valkey's ``SENTINEL FAILOVER`` (9.1) flags the master it fails over ``s_down`` itself,
    until the sentinel's next look at it (up to about 0.1 s here), and redis-py's
    ``discover_master`` finds no master meanwhile (``MasterNotFoundError``); Redis's keeps
    naming the old master. A killed master is named by none until its replica is promoted."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return int(sentinel.discover_master(SERVICE)[1])
        except MasterNotFoundError:
            if time.monotonic() >= deadline:
                raise
        time.sleep(0.02)


class SentinelGroup:
    """``count`` sentinels (quorum ``count // 2 + 1``) watching a primary and one replica."""

    def __init__(self, directory: Path, count: int = 1, down_after_ms: int = 1000) -> None:
        binary = require_server_binary()
        directory.mkdir(parents=True, exist_ok=True)
        # no delay before the first sync (Redis 7 waits 5 s for more replicas by default)
        self.primary = RedisServer(extra_args=("--repl-diskless-sync-delay", "0")).start()
        self.replica = RedisServer(
            extra_args=("--replicaof", "127.0.0.1", str(self.primary.port), "--repl-diskless-sync-delay", "0")
        ).start()
        # a replica promoted before its first sync holds no data at all: every job is lost
        _wait(self._replica_synced, 30, "the replica's first sync")
        self.ports = [free_port() for _ in range(count)]
        self.processes: list[subprocess.Popen[bytes]] = []
        for port in self.ports:
            config = directory / f"sentinel-{port}.conf"
            config.write_text(
                f"port {port}\nbind 127.0.0.1\ndir {directory}\n"
                f"sentinel monitor {SERVICE} 127.0.0.1 {self.primary.port} {count // 2 + 1}\n"
                f"sentinel down-after-milliseconds {SERVICE} {down_after_ms}\n"
                f"sentinel failover-timeout {SERVICE} 10000\n"
            )
            self.processes.append(
                subprocess.Popen(
                    [binary, str(config), "--sentinel"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
                )
            )
        #: Monotonic time the first sentinel named a new primary (set by :meth:`wait_switch`).
        self.switched_at = 0.0
        self.sentinel = Sentinel([("127.0.0.1", port) for port in self.ports], socket_timeout=2)
        _wait(self._replica_seen, 30, "the sentinels to see primary and replica")

    @property
    def port(self) -> int:
        """The first sentinel's port."""
        return self.ports[0]

    def _replica_synced(self) -> bool:
        info = redis.Redis.from_url(self.replica.url).info("replication")
        return info.get("master_link_status") == "up" and not info.get("master_sync_in_progress")

    def _replica_seen(self) -> bool:
        return all(
            redis.Redis(port=port, socket_timeout=2).sentinel_slaves(SERVICE) for port in self.ports
        ) and bool(self.sentinel.discover_slaves(SERVICE))

    def primary_port(self, timeout: float = 10.0) -> int:
        """The primary Sentinel names now (:func:`named_master_port`)."""
        return named_master_port(self.sentinel, timeout)

    def client(self) -> redis.Redis:
        return self.sentinel.master_for(SERVICE, socket_timeout=5)

    def settings_text(self) -> str:
        """An RQ settings module (``rq worker -c``) that finds the primary through the sentinels."""
        instances = ", ".join(f"('127.0.0.1', {port})" for port in self.ports)
        return (
            "SENTINEL = {\n"
            f"    'INSTANCES': [{instances}],\n"
            f"    'MASTER_NAME': '{SERVICE}',\n"
            "    'DB': 0,\n"
            "    'SOCKET_TIMEOUT': 5,\n"
            "}\n"
        )

    def failover(self) -> None:
        """``SENTINEL FAILOVER``: the replica is promoted; the old primary stays writable
        until a sentinel's next look demotes it (up to 10 s)."""
        redis.Redis(port=self.port).execute_command("SENTINEL", "FAILOVER", SERVICE)

    def failover_when_possible(self, timeout: float = 30.0) -> None:
        """``SENTINEL FAILOVER`` once a replica can be promoted: after an earlier switch
        the old primary must first be demoted and resynced (Sentinel answers NOGOODSLAVE
        until it sees a replica fit to promote)."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                self.failover()
                return
            except redis.ResponseError as error:
                if time.monotonic() > deadline or not any(s in str(error) for s in ("NOGOODSLAVE", "INPROG")):
                    raise
            time.sleep(0.1)

    def replica_online(self) -> bool:
        """Whether the primary Sentinel names now has a replica online and caught up (what a
        take's ``WAIT 1`` needs): after a switch, the old primary once demoted and resynced."""
        info = redis.Redis(port=self.primary_port(), socket_timeout=2).info("replication")
        replicas = [v for k, v in info.items() if k.startswith("slave") and isinstance(v, dict)]
        return any(r.get("state") == "online" and int(r.get("lag", 99)) <= 1 for r in replicas)

    def wait_replica_online(self, timeout: float = 30.0) -> float:
        """Wait for :meth:`replica_online`; returns the monotonic time it was seen."""
        _wait(self.replica_online, timeout, "a replica of the new primary online")
        return time.monotonic()

    def kill_primary(self) -> None:
        """SIGKILL the primary: the sentinels promote the replica once it is down for
        ``down_after_ms`` and they agree."""
        self.primary.kill()

    def wait_switch(self, old_port: int, timeout: float = 30.0) -> float:
        """Wait until every sentinel names a primary other than ``old_port``; returns the
        monotonic time the first one did."""
        first: float | None = None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            named = []
            for port in self.ports:
                try:
                    sentinel = redis.Redis(port=port, socket_timeout=1)
                    reply = sentinel.execute_command("SENTINEL GET-MASTER-ADDR-BY-NAME", SERVICE)
                    named.append(int(reply[1]) if reply else old_port)
                except redis.RedisError:
                    named.append(old_port)
            if any(p != old_port for p in named) and first is None:
                first = time.monotonic()
            if all(p != old_port for p in named):
                self.switched_at = first if first is not None else time.monotonic()
                return self.switched_at
            time.sleep(0.02)
        raise TimeoutError("the sentinels did not switch")

    def stop(self) -> None:
        for process in self.processes:
            process.kill()
            process.wait()
        self.replica.stop()
        self.primary.stop()
