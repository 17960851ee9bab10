"""Fixtures: a private redis-server per test session (or REDIS_URL; which server binary:
``redis_server.py``), clean data per test,
and real worker processes that are always reaped.

Under pytest-xdist (``-n auto``, README's test line: 4 processes on 2 CPUs) every worker
process is its own session, so it has its own private redis-server: tests that count
Redis-wide (INFO commandstats, CLIENT LIST, idle-fleet costs) see only their own process's
tests, one at a time, as in a serial run. A REDIS_URL server is one shared database, so
``-n auto`` then runs one worker process."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
import redis
from procs import Processes
from redis_server import ExternalRedis, RedisServer, in_ci, require_redis_server, server_problem

from rq_emq.events import LeaseEvent, subscribe, unsubscribe

#: Test processes per usable CPU under ``-n auto``. The suite mostly waits (on leases,
#: sweeps, real worker processes starting): one process per CPU left half the CPU idle
#: (470 s for the suite on 2 cores); three processes on 2 cores took 282 s (1.2 CPUs busy);
#: four took 245 s (2026-12-02, 723 tests, with work stealing below). Beside two CPU
#: burners (.ci/stress) four once starved a worker's renewals past the 800 ms test lease,
#: before the tests that count runs learned to credit a worker's own self-fenced stop
#: (procs.self_fenced_stops); .ci/stress is the check that four still holds.
PROCESSES_PER_CPU = 2

#: Tests that take 15 s or more (the model-based tests, 10,000 dependents, a wheel built
#: and installed, idle-fleet windows): they start first, so that no test process is left
#: running one of them alone at the end of the run (a long tail under -n).
LONG_TESTS = (
    "test_state_machine_lifecycle.py::",
    "test_state_machine.py::",
    "test_lifecycle_processes.py::test_a_parent_with_10000_dependents",
    "test_packaging.py::",
    "test_lifecycle_processes.py::test_jobs_that_delete_themselves",
    "test_fleet_processes.py::test_nothing_piles_up",
    "test_examples.py::test_each_line_of_the_crash_demos_narration",
    "test_fleet_sweep.py::",
    "test_failover.py::test_a_failover_costs_at_most_reruns",
    "test_worker_processes.py::test_a_job_running_20_times",
    "test_dashboard_browser_safety.py::",
)


@pytest.hookimpl(optionalhook=True)  # (a pytest-xdist hook: no error where it is not installed)
def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """``-n auto``: two test processes per usable CPU, or one when REDIS_URL names
    a shared server (two processes would flush each other's data and count each other's
    commands)."""
    if os.environ.get("REDIS_URL"):
        return 1
    return max(1, int(PROCESSES_PER_CPU * len(os.sched_getaffinity(0))))


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    """Under ``-n`` the idle test processes steal queued tests from busy ones (xdist's
    ``worksteal``) instead of each keeping the share it was dealt (``load``): the long tests
    come first, and with ``load`` a process could be left with a queue of short ones while
    the others idle (282 s against 297 s for three processes). An explicit ``--dist`` wins."""
    option = config.option
    if getattr(option, "dist", None) == "load" and not any(
        a.startswith("--dist") for a in config.invocation_params.args
    ):
        option.dist = "worksteal"


def pytest_sessionstart(session: pytest.Session) -> None:
    """No server to be had: under ``CI=true`` the run stops here, failed, in one line (not
    one error per test); elsewhere the tests that need one skip, with that line as their
    reason, and the others run."""
    if os.environ.get("REDIS_URL"):
        return
    problem = server_problem()
    if problem is None:
        return
    if in_ci():
        pytest.exit(f"{problem}; CI=true requires one", returncode=pytest.ExitCode.USAGE_ERROR)
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:  # shown under -q too, before the first test
        reporter.write_line(f"{problem}: the tests that need one skip")


def pytest_report_header(config: pytest.Config) -> str:
    """Which server the tests start (first line of the run)."""
    if os.environ.get("REDIS_URL"):
        return "server: REDIS_URL"
    from rq_emq.testing import find_redis_server

    problem = server_problem()
    return f"server: {problem}" if problem else f"server: {find_redis_server()}"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The long tests first (stable otherwise): xdist hands out tests in this order."""
    items.sort(key=lambda item: not any(part in item.nodeid for part in LONG_TESTS))


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
def r(redis_server: RedisServer | ExternalRedis) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(redis_server.url)
    client.flushdb()
    client.script_flush()
    if isinstance(redis_server, RedisServer):
        # The private server outlives each test: a worker an earlier test SIGKILLed while it
        # waited in BLMOVE may still be blocked there until Redis reads its closed socket,
        # and would take this test's first job into its moving list (a stock rq.Worker
        # then never sees the job). Not on a REDIS_URL server:
        # its other clients are someone else's.
        client.client_kill_filter(_type="normal", skipme=True)
        client.client_kill_filter(_type="pubsub", skipme=True)
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
    from rq_emq.recover.registries import unpatch_stock_started_registry

    unpatch_stock_started_registry()
    yield
    unpatch_stock_started_registry()


@pytest.fixture
def procs(tmp_path: object, request: pytest.FixtureRequest) -> Iterator[Processes]:
    processes = Processes(str(tmp_path))
    request.node.started_processes = processes
    yield processes
    processes.stop_all()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """A failed test that started processes reports each one's state and log tail: a CI
    failure then names what its workers did (their logs go with the temporary directory)."""
    outcome = yield
    report = outcome.get_result()  # type: ignore[attr-defined]
    processes = getattr(item, "started_processes", None)
    if report.when == "call" and report.failed and processes is not None and processes.started:
        report.sections.append(("processes this test started", processes.describe()))


@pytest.fixture
def seen() -> Iterator[list[LeaseEvent]]:
    """Every lease event this process delivers while the test runs, in order. Hooks run on
    a thread of their own: read it after ``events.flush()``."""
    received: list[LeaseEvent] = []
    hook = subscribe(received.append)
    yield received
    unsubscribe(hook)
