"""Where the tests' Redis comes from: our own private server, or REDIS_URL."""

from __future__ import annotations

import os

from rq_emq.testing import RedisServer

__all__ = ["ExternalRedis", "RedisServer", "in_ci"]


class ExternalRedis:
    """A server named by REDIS_URL: used as is, never paused or killed."""

    controllable = False

    def __init__(self, url: str) -> None:
        self.url = url

    def stop(self) -> None:
        pass


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")
