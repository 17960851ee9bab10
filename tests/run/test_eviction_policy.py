"""A Redis that may evict keys is named at startup: each worker class reads the server's
``maxmemory-policy`` as it starts, from the one ``INFO`` it reads the server's version
from (no ``CONFIG``, no round trip of its own), and logs one warning line when the policy
is not ``noeviction``; it starts and works anyway. A server that does not show the field,
or refuses ``INFO``, gets no warning and no error.

Real ``rq worker`` processes against a private redis-server of the test's own (its policy
set with ``CONFIG SET``), and the check itself against such a server and against servers
that hide the field.
"""

from __future__ import annotations

import logging

import pytest
import redis
import rq
from helpers import wait_status
from procs import Processes
from rq import Queue

from rq_emq.run.startup import check_redis
from rq_emq.testing import RedisServer

pytestmark = [pytest.mark.slow, pytest.mark.rq_versions]

#: every worker class of rq_emq (SpawnWorker is RQ 3's)
WORKER_CLASSES = [
    "rq_emq.LeaseWorker",
    "rq_emq.SimpleLeaseWorker",
    *(["rq_emq.SpawnLeaseWorker"] if int(rq.__version__.split(".")[0]) >= 3 else []),
]


def policy_lines(log: str) -> list[str]:
    return [line for line in log.splitlines() if "maxmemory-policy" in line]


def server_with_policy(server: RedisServer, policy: str) -> redis.Redis:
    client = redis.Redis.from_url(server.url)
    client.config_set("maxmemory-policy", policy)
    return client


@pytest.mark.parametrize("worker_class", WORKER_CLASSES)
def test_a_worker_on_an_evicting_redis_says_so_in_one_line_naming_the_policy_and_works(
    own_server: RedisServer, procs: Processes, worker_class: str
) -> None:
    client = server_with_policy(own_server, "allkeys-lru")
    job = Queue(connection=client).enqueue("jobs.noop")
    worker = procs.worker(own_server.url, burst=True, worker_class=worker_class)
    assert worker.wait(timeout=30) == 0, procs.log(worker)
    (line,) = policy_lines(procs.log(worker))
    assert " WARNING " in line and f"Redis at 127.0.0.1:{own_server.port} may evict keys" in line, line
    assert "(maxmemory-policy allkeys-lru)" in line and "reads as a lost lease" in line, line
    assert line.endswith("set maxmemory-policy noeviction (docs/operating.md)"), line
    assert wait_status(client, job.id, "finished") == "finished"


def test_a_worker_on_a_redis_that_never_evicts_says_nothing_of_it(
    own_server: RedisServer, procs: Processes
) -> None:
    client = server_with_policy(own_server, "noeviction")
    job = Queue(connection=client).enqueue("jobs.noop")
    worker = procs.worker(own_server.url, burst=True)
    assert worker.wait(timeout=30) == 0, procs.log(worker)
    assert policy_lines(procs.log(worker)) == []
    assert wait_status(client, job.id, "finished") == "finished"


@pytest.mark.parametrize("policy", ["volatile-lru", "volatile-ttl", "allkeys-random"])
def test_the_check_reads_the_policy_from_its_one_info_without_config(
    own_server: RedisServer, policy: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Every policy but noeviction is warned about (volatile-*: every lease lock has a TTL),
    by a user that may not run CONFIG, with the one INFO the version check sends."""
    admin = server_with_policy(own_server, policy)
    admin.acl_setuser("no-config", enabled=True, passwords=["+pw"], keys=["*"], commands=["+@all", "-config"])
    client = redis.Redis(port=own_server.port, username="no-config", password="pw")
    client.ping()
    admin.config_resetstat()
    with caplog.at_level(logging.WARNING, logger="rq_emq.startup"):
        check_redis(client)
    said = [r.getMessage() for r in caplog.records if "maxmemory-policy" in r.getMessage()]
    assert len(said) == 1 and f"(maxmemory-policy {policy})" in said[0], said
    sent = {name: stats["calls"] for name, stats in admin.info("commandstats").items()}
    # the reset counts itself (Redis 6.2 counts CONFIG's subcommands together): one CONFIG
    resets = sent.pop("cmdstat_config|resetstat", None) or sent.pop("cmdstat_config", None)
    assert resets == 1 and sent == {"cmdstat_info": 1}, sent  # the version's INFO, nothing more


@pytest.mark.parametrize(
    "info",
    [
        {"redis_version": "7.2.4"},  # an old server, or a managed one hiding the field
        {"redis_version": "7.2.4", "maxmemory_policy": ""},
        redis.exceptions.NoPermissionError("NOPERM this user has no permissions to run the 'info' command"),
    ],
    ids=["no field", "empty field", "INFO refused"],
)
def test_a_server_that_does_not_tell_its_policy_gets_no_warning_and_the_worker_starts(
    info: object, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    client = redis.Redis(port=1)  # never contacted: its INFO is the one given

    def answer(*args: object, **kwargs: object) -> object:
        if isinstance(info, Exception):
            raise info
        return info

    monkeypatch.setattr(client, "info", answer)
    with caplog.at_level(logging.WARNING, logger="rq_emq.startup"):
        check_redis(client)  # no error: the worker goes on
    assert [r for r in caplog.records if "maxmemory-policy" in r.getMessage()] == []
