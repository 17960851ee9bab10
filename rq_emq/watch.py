"""Wakes an idle worker that listens on several queues as soon as one of them changes.

RQ blocks on several queues with ``BLPOP``, which can lose a job; no Redis command blocks
on several lists without popping. So a LeaseWorker on several queues takes with a script
(no blocking) and waits here: Redis's client-side-caching invalidations in broadcast mode
(``CLIENT TRACKING ON REDIRECT <id> BCAST PREFIX rq:queue:<q> ... NOLOOP``) tell a
subscribed connection whenever any of those keys is written. That needs no server
configuration and costs nothing while nothing happens. A wait never outlasts
``safety_s``; after one that ends quietly the tracking connection is checked, so a
dropped connection costs at most that much latency. Where the server refuses tracking
(an ACL without ``client``), the worker falls back to short blocking waits.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from redis import Redis
from redis.connection import Connection
from redis.exceptions import RedisError

from .compat import StopRequested

logger = logging.getLogger("rq_emq.lease")
CHANNEL = b"__redis__:invalidate"
# Only connection trouble is handled here. Anything else, notably RQ's StopRequested that
# its SIGTERM/SIGINT handler raises while the worker waits, must reach the worker loop.
_CONNECTION_TROUBLE = (RedisError, OSError)


def _prefixes(keys: Sequence[str]) -> list[str]:
    # Redis refuses overlapping broadcast prefixes; a shorter one already covers a longer one.
    unique = sorted(set(keys))
    return [k for k in unique if not any(k != other and k.startswith(other) for other in unique)]


class QueueWatch:
    """A subscription that fires when any of ``keys`` (or a key they prefix) is written."""

    def __init__(self, client: Redis, keys: Sequence[str], safety_s: float = 5.0) -> None:
        pool = client.connection_pool
        self._connection_class: type[Connection] = pool.connection_class
        # RESP2, for plain pub/sub messages; without redis-py 8's RESP3-only extras
        self._kwargs: dict[str, Any] = {
            k: v
            for k, v in pool.connection_kwargs.items()
            if not k.startswith(("maint_notifications", "orig_"))
        }
        self._kwargs.update(protocol=2, client_name=None)
        self.prefixes = _prefixes(keys)
        self.safety_s = safety_s
        self._listener: Connection | None = None
        self._tracker: Connection | None = None
        self.available = True

    @property
    def armed(self) -> bool:
        return self._listener is not None

    def _command(self, connection: Connection, *args: Any) -> Any:
        connection.send_command(*args)
        return connection.read_response()

    def arm(self) -> bool:
        """Subscribe and start tracking; False when the server will not track for us."""
        self.close()
        try:
            listener = self._connection_class(**self._kwargs)
            listener.connect()
            listener_id = self._command(listener, "CLIENT", "ID")
            self._command(listener, "SUBSCRIBE", CHANNEL)
            tracker = self._connection_class(**self._kwargs)
            tracker.connect()
            args: list[Any] = ["CLIENT", "TRACKING", "ON", "REDIRECT", listener_id, "BCAST", "NOLOOP"]
            for prefix in self.prefixes:
                args += ["PREFIX", prefix]
            self._command(tracker, *args)
        except StopRequested:
            self.close()
            raise
        except _CONNECTION_TROUBLE as error:
            if "NOPERM" in str(error) or "unknown" in str(error).lower():
                if self.available:
                    logger.warning("Redis refused CLIENT TRACKING (%s); idle workers will poll", error)
                self.available = False
            self.close()
            return False
        except Exception as error:  # a connection class we cannot clone (e.g. Sentinel-managed)
            logger.warning("cannot watch the queues for changes (%r); idle workers will poll", error)
            self.available = False
            self.close()
            return False
        self._listener, self._tracker = listener, tracker
        return True

    def drain(self) -> None:
        """Forget notifications already received (call before looking at the queues)."""
        listener = self._listener
        try:
            while listener is not None and listener.can_read(timeout=0):
                listener.read_response()
        except _CONNECTION_TROUBLE:
            self.close()

    def wait(self, timeout: float) -> bool:
        """Block until a watched key changes or ``timeout`` passes; True when notified.

        Returns False at once (so the caller polls) when the watch is not armed and cannot
        be armed."""
        if self._listener is None and not self.arm():
            return False
        listener, tracker = self._listener, self._tracker
        assert listener is not None and tracker is not None
        try:
            if listener.can_read(timeout=min(timeout, self.safety_s)):
                listener.read_response()
                return True
            self._command(tracker, "PING")  # quiet: make sure tracking is still on
        except _CONNECTION_TROUBLE:
            self.close()
        return False

    def close(self) -> None:
        for connection in (self._listener, self._tracker):
            if connection is not None:
                try:
                    connection.disconnect()
                except _CONNECTION_TROUBLE:
                    pass
        self._listener = self._tracker = None
