"""Redis Sentinel: LeaseWorkers started the RQ way (``rq worker -c settings`` with
``SENTINEL = {...}``) find the primary through a sentinel, recover a killed worker's job,
and keep going through a failover to the replica.

``SENTINEL FAILOVER`` is not write-safe: Sentinel promotes the replica, and the old
primary stays writable (its writes later discarded by its resync) until Sentinel demotes
it, up to 10 s on. Here a lease longer than that window keeps the one job's run alive
across it; what a failover may cost with short leases (reruns, never a lost job or a
failure callback for a finished one) is tests/connection/test_failover.py's, for both failover kinds.

The same on Valkey (its ``valkey-server --sentinel``), whose sentinel names no master for a
moment as ``SENTINEL FAILOVER`` starts: the failover test breaks the worker's connections
then, so that they reconnect in it."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from helpers import FAST, stat, wait_status
from integration_scenarios import starts
from jobs import runs
from procs import RQ_BIN, TESTS_DIR, Processes, wait_for
from redis.sentinel import Sentinel
from redis_server import require_redis_server
from rq import Queue

from rq_emq.keys import sweeper_election_key, watch_key
from rq_emq.testing import RedisServer, free_port
from rq_emq.testing.sentinel import named_master_port

pytestmark = pytest.mark.slow
SERVICE = "rq-emq-primary"


class SentinelSetup:
    """A primary, one replica and one sentinel watching them, all private."""

    def __init__(self, directory: Path, binary: str) -> None:
        # (no delay before the first sync: Redis 7 waits 5 s for more replicas by default)
        self.primary = RedisServer(extra_args=("--repl-diskless-sync-delay", "0")).start()
        self.replica = RedisServer(extra_args=("--replicaof", "127.0.0.1", str(self.primary.port))).start()
        # A replica promoted before its first sync has no data at all: every job would be lost.
        # That is the async-failover limit docs/guarantees.md states, not what this test is about.
        wait_for(self._replica_synced, timeout=30, what="the replica's first sync")
        self.port = free_port()
        config = directory / "sentinel.conf"
        config.write_text(
            f"port {self.port}\nbind 127.0.0.1\ndir {directory}\n"
            f"sentinel monitor {SERVICE} 127.0.0.1 {self.primary.port} 1\n"
            f"sentinel down-after-milliseconds {SERVICE} 1000\n"
            f"sentinel failover-timeout {SERVICE} 10000\n"
        )
        self.process = subprocess.Popen(
            [binary, str(config), "--sentinel"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        self.sentinel = Sentinel([("127.0.0.1", self.port)], socket_timeout=2)
        wait_for(self._replica_seen, timeout=30, what="the sentinel to see primary and replica")

    def _replica_synced(self) -> bool:
        info = redis.Redis.from_url(self.replica.url).info("replication")
        return info.get("master_link_status") == "up" and not info.get("master_sync_in_progress")

    def _replica_seen(self) -> bool:
        try:
            return bool(self.sentinel.discover_slaves(SERVICE))
        except redis.RedisError:
            return False

    def primary_port(self) -> int:
        # waits out the moment after SENTINEL FAILOVER in which Valkey's sentinel names no master
        return named_master_port(self.sentinel)

    def client(self) -> redis.Redis:
        return self.sentinel.master_for(SERVICE, socket_timeout=5)

    def settings_module(self, directory: Path) -> str:
        (directory / "sentinel_settings.py").write_text(
            "SENTINEL = {\n"
            f"    'INSTANCES': [('127.0.0.1', {self.port})],\n"
            f"    'MASTER_NAME': '{SERVICE}',\n"
            "    'DB': 0,\n"
            "    'SOCKET_TIMEOUT': 5,\n"
            "}\n"
        )
        return "sentinel_settings"

    def stop(self) -> None:
        self.process.kill()
        self.process.wait()
        self.replica.stop()
        self.primary.stop()


@pytest.fixture
def sentinel(tmp_path: Path) -> Iterator[SentinelSetup]:
    binary = require_redis_server()
    directory = tmp_path / "sentinel"
    directory.mkdir()
    setup = SentinelSetup(directory, binary)
    yield setup
    setup.stop()


def break_client_connections(port: int) -> int:
    """Close every client connection of the server on ``port`` but the sentinels' links and
    the replicas'; returns how many were closed."""
    server = redis.Redis(port=port, socket_timeout=2)
    own = server.client_id()
    closed = 0
    for client in server.client_list():
        if int(client["id"]) == own or client["name"].startswith("sentinel-") or "S" in client["flags"]:
            continue
        closed += server.execute_command("CLIENT KILL ID", client["id"])
    return closed


def sentinel_worker(
    procs: Processes, settings: str, directory: Path, *queues: str, **lease_env: str
) -> subprocess.Popen[bytes]:
    env = procs.env(PYTHONPATH=os.pathsep.join([str(TESTS_DIR), str(directory)]), **{**FAST, **lease_env})
    return procs.start(
        [RQ_BIN, "worker", "-w", "rq_emq.LeaseWorker", "-c", settings, *(queues or ("default",))],
        env=env,
        name="worker",
    )


def test_lease_workers_through_a_sentinel_recover_a_killed_workers_job(
    sentinel: SentinelSetup, procs: Processes, tmp_path: Path
) -> None:
    settings = sentinel.settings_module(tmp_path)
    r = sentinel.client()
    log = str(tmp_path / "runs.log")
    job = Queue(connection=r).enqueue("integration_jobs.slow_on_first_run", log, 120.0, job_timeout=300)
    first = sentinel_worker(procs, settings, tmp_path)
    wait_for(lambda: starts(log) == 1, timeout=30, what="the job to start")
    os.kill(first.pid, signal.SIGKILL)
    survivor = sentinel_worker(procs, settings, tmp_path, "other", "default")
    wait_status(r, job.id, "finished", timeout=30)
    assert starts(log) == 2 and stat(r, "default", "recovered") == 1
    # its idle wait on two queues: the set's watch (tracking on its Sentinel-managed control
    # connection, redirected to its pubsub), which a push to either queue wakes
    watch = watch_key(sweeper_election_key(["other", "default"]))
    wait_for(lambda: r.exists(watch), timeout=10, what="the survivor watching its queues")
    woken = Queue("other", connection=r).enqueue("jobs.add", 2, 3)
    wait_status(r, woken.id, "finished", timeout=15)
    assert survivor.poll() is None, procs.log(survivor)


def test_a_sentinel_failover_during_a_job_outlived_by_its_lease_leaves_it_finished_once(
    sentinel: SentinelSetup, procs: Processes, tmp_path: Path
) -> None:
    settings = sentinel.settings_module(tmp_path)
    r = sentinel.client()
    log = str(tmp_path / "runs.log")
    old_primary = sentinel.primary_port()
    job = Queue(connection=r).enqueue("jobs.sleep_and_record", log, 4.0, job_timeout=300)
    # a lease that outlives the failover, as docs/faq.md advises: with one shorter than the
    # failover the job may be recovered and run again (at-least-once), which is not this test
    worker = sentinel_worker(
        procs,
        settings,
        tmp_path,
        RQ_EMQ_LEASE_MS="8000",
        RQ_EMQ_RENEW_INTERVAL_MS="400",
        RQ_EMQ_SWEEP_INTERVAL_MS="1000",
    )
    wait_for(lambda: starts(log) == 1, timeout=30, what="the job to start")
    redis.Redis(port=sentinel.port).execute_command("SENTINEL", "FAILOVER", SERVICE)
    # Valkey's sentinel flags the master s_down as the failover starts and names no master
    # until its next look at it; the worker's connections, broken now, reconnect in that
    # moment (its pubsub at once) and must take it as a blip, as they do on Redis, whose
    # sentinel sends them back to the old master until the switch
    assert break_client_connections(old_primary) > 0
    wait_for(lambda: sentinel.primary_port() != old_primary, timeout=30, what="the failover")
    assert sentinel.primary_port() == sentinel.replica.port
    wait_status(r, job.id, "finished", timeout=60)
    # and it goes on taking jobs, on the new primary
    after = Queue(connection=r).enqueue("jobs.add", 2, 3)
    wait_status(r, after.id, "finished", timeout=30)
    time.sleep(1.0)  # a few more renew and sweep rounds on the new primary
    assert [line.split()[0] for line in runs(log)] == ["start", "end"]
    assert stat(r, "default", "recovered") == 0
    assert worker.poll() is None, procs.log(worker)
    assert "Traceback" not in procs.log(worker), procs.log(worker)
