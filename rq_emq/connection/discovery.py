"""Which master Redis Sentinel names now, asked so that one sentinel late to hear of a
switch cannot send a connection back to the old master.

``SENTINEL FAILOVER`` raises the service's ``config-epoch``; :func:`confirmed_master` asks
every sentinel and believes the one with the highest epoch among those that see the
master up. :func:`live_replicas` counts the replicas Sentinel sees up (a take or a claim
waits for one of them only). :func:`sentinel_of` finds the ``Sentinel`` manager behind a
client; a client without one is not Sentinel-managed, and every caller leaves it alone.
The watch that acts on a switch is :mod:`rq_emq.connection.failover`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from redis import Redis
from redis.exceptions import RedisError


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
    (:func:`rq_emq.connection.budget.control_client`), the one its connections resolve through."""
    pool = client.connection_pool
    for holder in (pool, pool.connection_kwargs.get("connection_pool")):
        manager = getattr(holder, "sentinel_manager", None)
        service = getattr(holder, "service_name", None)
        if manager is not None and isinstance(service, str):
            return manager, service
    return None


def text_of(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _state(sentinel: Redis, service: str) -> dict[str, Any]:
    reply = sentinel.execute_command("SENTINEL MASTER", service)
    if isinstance(reply, dict):
        return {text_of(k): v for k, v in reply.items()}
    items = list(reply)
    return {text_of(k): v for k, v in zip(items[0::2], items[1::2], strict=False)}


def confirmed_master(manager: Any, service: str) -> Master | None:
    """The master named by the sentinel with the highest ``config-epoch``, among those
    that answer and see it up (None when none does)."""
    best: Master | None = None
    for sentinel in list(manager.sentinels):
        try:
            state = _state(sentinel, service)
        except (RedisError, OSError):
            continue
        flags = text_of(state.get("flags", "")).replace(",", " ").split()
        if "master" not in flags or "s_down" in flags or "o_down" in flags:
            continue
        master = Master(
            host=text_of(state.get("ip", "")),
            port=int(text_of(state.get("port", 0))),
            run_id=text_of(state.get("runid", "")),
            epoch=int(text_of(state.get("config-epoch", 0))),
            replicas=int(text_of(state.get("num-slaves", 0))),
        )
        if best is None or master.epoch > best.epoch:
            best = master
    return best


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
                {text_of(k): v for k, v in reply.items()}
                if isinstance(reply, dict)
                else dict(zip(map(text_of, reply[0::2]), reply[1::2], strict=False))
            )
            flags = set(text_of(state.get("flags", "")).split(","))
            count += not flags & {"s_down", "o_down", "disconnected"}
        return count
    return 0
