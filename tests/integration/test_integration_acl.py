"""A Redis ACL user limited to RQ's and our keys (``~rq:* ~emq:*``), RQ's pub/sub channels
and the smallest command set that works runs everything end to end: producer, both worker
kinds (one queue and several), the reaper, ``rq info``, a crash recovery and a failure
at max attempts, with not one command refused."""

from __future__ import annotations

import os
import signal
import subprocess
from datetime import timedelta
from pathlib import Path

import pytest
import redis
from helpers import FAST, stat, wait_status
from integration_scenarios import kill_mid_job, reaper, starts
from jobs import runs
from procs import RQ_BIN, Processes, wait_for
from rq import Queue, Retry
from rq.job import Job

import rq_emq
from rq_emq.keys import QueueKeys, sweeper_deputy_key, sweeper_election_key
from rq_emq.testing import RedisServer

pytestmark = pytest.mark.slow

USER, PASSWORD = "rq-emq", "lease-me"

#: What the user may run. RQ's own needs (producer, workers, ``rq info``) and ours
#: (scripts, the lock manager, the sweep, the multi-queue idle wait) together.
COMMANDS = (
    # connection; RQ names its connection and reads its address back
    # (RQ 3: CLIENT INFO, RQ 2: CLIENT LIST); the idle watch of several queues: CLIENT
    # TRACKING, TRACKINGINFO, and ID, SETNAME and LIST for its pubsub connection; the wait
    # per queue where the watch is refused: CLIENT ID, UNBLOCK
    *"ping info client|setname client|info client|list client|id client|unblock".split(),
    *"client|tracking client|trackinginfo".split(),
    # our Lua scripts (the commands they run are checked too) and RQ's transactions
    *"evalsha script|load script|exists multi exec watch unwatch time".split(),
    # RQ's worker channel (its commands: stop job, shutdown), on which a worker also hears
    # its sweeper election's call (PUBLISH, from hold_sweeper) and, on RESP2, the watch's
    # invalidations
    *"subscribe unsubscribe publish".split(),
    *"get mget set del exists expire persist pttl".split(),
    *"hget hmget hgetall hset hsetnx hdel hincrby hincrbyfloat".split(),
    # blpop: an idle standby's wait on its queue set's wake list (never on a queue)
    *"llen lindex lpush rpush lpop lrange lrem lpos blmove blpop".split(),
    *"sadd srem smembers".split(),
    *"zadd zcard zcount zrange zrangebyscore zrem zremrangebyscore zscore".split(),
    *"xadd xrevrange".split(),  # RQ's job results
    "wait",  # the outbox drain's Sentinel-confirmed claim (a replica has it)
)

#: The ACL rule for that user: the line docs/operating.md gives (checked below).
ACL_RULES = (
    "on",
    f">{PASSWORD}",
    "resetkeys",
    "~rq:*",
    "~emq:*",
    "resetchannels",
    "&rq:*",
    "&emq:*",
    "&__redis__:invalidate",
    "-@all",
    *(f"+{command}" for command in COMMANDS),
)


def acl_url(server: RedisServer, user: str = USER) -> str:
    return f"redis://{user}:{PASSWORD}@127.0.0.1:{server.port}/0"


#: Subcommands redis-py probes on connect (and shrugs off when refused) that Redis 6.2 does
#: not know. Redis 7 rejects an unknown subcommand before the ACL check and refuses to name
#: one in a rule; Redis 6.2 checks the ACL first and logs a denial, so there the rule names them.
REDIS_PY_HANDSHAKE_PROBES = ("+client|setinfo", "+client|maint_notifications")


def create_user(admin: redis.Redis, rules: tuple[str, ...] = ACL_RULES) -> None:
    if int(str(admin.info("server")["redis_version"]).split(".")[0]) < 7:
        rules = (*rules, *REDIS_PY_HANDSHAKE_PROBES)
    admin.execute_command("ACL", "SETUSER", USER, "reset", *rules)


def denials(admin: redis.Redis) -> list[str]:
    return [
        f"{entry['reason']} {entry['object']} ({entry['context']})"
        for entry in admin.acl_log()
        if entry["username"] == USER
    ]


def worker_state(r: redis.Redis, pid: int) -> bytes | None:
    for key in r.smembers("rq:workers"):
        if r.hget(key, "pid") == str(pid).encode():
            return r.hget(key, "state")  # type: ignore[return-value]
    return None


def run_everything(server: RedisServer, procs: Processes, tmp_path: Path) -> redis.Redis:
    """Everything an operator runs, as the ACL user; returns that user's client."""
    url = acl_url(server)
    r = redis.Redis.from_url(url)
    queue = Queue(connection=r)

    # producer, and a forking LeaseWorker killed mid-job
    log = str(tmp_path / "recovered.log")
    job = queue.enqueue("integration_jobs.slow_on_first_run", log, 120.0, job_timeout=300)
    kill_mid_job(r, procs, url, job, log, 0)

    # a SimpleLeaseWorker on several queues, with RQ's scheduler, sweeps, recovers and runs
    # it, then runs what else RQ offers: a delayed job, Retry, a dependency
    simple = procs.worker(
        url, "other", "default", worker_class="rq_emq.SimpleLeaseWorker", args=("--with-scheduler",), **FAST
    )
    wait_status(r, job.id, "finished", timeout=30)
    assert starts(log) == 2 and stat(r, "default", "recovered") == 1
    later = Queue("other", connection=r).enqueue("jobs.add", 2, 3)  # wakes the idle multi-queue wait
    delayed = queue.enqueue_in(timedelta(seconds=1), "jobs.add", 3, 4)
    retry_log = str(tmp_path / "retried.log")
    retried = queue.enqueue("jobs.fail_and_record", retry_log, retry=Retry(max=1))
    child = queue.enqueue("jobs.add", 4, 5, depends_on=later)
    for done in (later, delayed, child):
        wait_status(r, done.id, "finished", timeout=20)
    wait_status(r, retried.id, "failed", timeout=20)
    assert len(runs(retry_log)) == 2 + procs.self_fenced_stops(retried.id)
    os.kill(simple.pid, signal.SIGTERM)
    assert simple.wait(timeout=30) == 0, procs.log(simple)

    # the reaper fails a job that stalled on its last attempt, and writes RQ's Result
    doomed_log = str(tmp_path / "failed.log")
    doomed = queue.enqueue(
        "integration_jobs.slow_on_first_run", doomed_log, 120.0, job_timeout=300, meta=rq_emq.max_attempts(1)
    )
    kill_mid_job(r, procs, url, doomed, doomed_log, 0)
    sweeper = reaper(procs, url)
    wait_status(r, doomed.id, "failed", timeout=20)
    wait_for(lambda: Job.fetch(doomed.id, connection=r).results(), timeout=15, what="the failure Result")
    sweeper.send_signal(signal.SIGTERM)
    assert sweeper.wait(timeout=15) == 0, procs.log(sweeper)

    # an idle forking LeaseWorker on one queue blocks (BLMOVE) until a job arrives; a
    # second one on the same queue waits in the election's line (BLPOP), then is its deputy
    idle = procs.worker(url, "default", **FAST)
    # a worker's start (a new interpreter, its imports, its watchdog) waited on a loaded host
    wait_for(lambda: worker_state(r, idle.pid) == b"idle", timeout=30, what="an idle worker")
    second = procs.worker(url, "default", **FAST)
    wait_for(lambda: worker_state(r, second.pid) == b"idle", timeout=30, what="a second idle worker")
    wait_for(lambda: r.exists(sweeper_deputy_key(sweeper_election_key(["default"]))), what="a deputy")
    plain = queue.enqueue("jobs.add", 1, 2)
    wait_status(r, plain.id, "finished", timeout=15)
    for process in (idle, second):
        os.kill(process.pid, signal.SIGTERM)
        assert process.wait(timeout=30) == 0, procs.log(process)

    # rq info
    info = subprocess.run(
        [RQ_BIN, "info", "--url", url], capture_output=True, text=True, timeout=60, env=procs.env()
    )
    assert info.returncode == 0 and "default" in info.stdout, info.stdout + info.stderr
    for process in procs.started:
        log_text = procs.log(process)
        assert "NOPERM" not in log_text and "refused" not in log_text, log_text
    return r


def test_an_acl_user_limited_to_rq_and_emq_keys_runs_everything(
    own_server: RedisServer, procs: Processes, tmp_path: Path
) -> None:
    admin = redis.Redis.from_url(own_server.url)
    create_user(admin)
    run_everything(own_server, procs, tmp_path)
    assert denials(admin) == []


def test_the_acl_user_is_really_limited(own_server: RedisServer) -> None:
    admin = redis.Redis.from_url(own_server.url)
    create_user(admin)
    r = redis.Redis.from_url(acl_url(own_server))
    r.set("emq:{q}:mine", 1)
    with pytest.raises(redis.exceptions.NoPermissionError):
        r.set("elsewhere", 1)
    with pytest.raises(redis.exceptions.NoPermissionError):
        r.flushdb()
    with pytest.raises(redis.exceptions.NoPermissionError):
        r.eval("return 1", 0)  # EVAL is not needed: scripts run by SHA


def test_without_client_tracking_nor_unblock_an_idle_worker_on_several_queues_waits_per_queue(
    own_server: RedisServer, procs: Processes
) -> None:
    """Refused the idle watch, a worker says so and waits with a connection per queue;
    refused CLIENT UNBLOCK too, it ends its other waits by closing them, and still works."""
    admin = redis.Redis.from_url(own_server.url)
    rules = tuple(rule for rule in ACL_RULES if rule not in ("+client|unblock", "+client|tracking"))
    create_user(admin, rules)
    url = acl_url(own_server)
    r = redis.Redis.from_url(url)
    worker = procs.worker(url, "other", "default", **FAST)
    waits = lambda: sum(c.get("cmd") == "blmove" for c in admin.client_list())  # noqa: E731
    wait_for(lambda: waits() == 2, timeout=15, what="the worker's two waits")
    first = Queue("other", connection=r).enqueue("jobs.add", 1, 1)  # wakes it: the other wait is cancelled
    wait_status(r, first.id, "finished", timeout=15)
    wait_for(lambda: denials(admin), timeout=15, what="the refused CLIENT UNBLOCK")
    wait_for(lambda: waits() == 2, timeout=15, what="the closed wait gone, both queues waited on again")
    job = Queue("default", connection=r).enqueue("jobs.add", 1, 1)
    wait_status(r, job.id, "finished", timeout=15)
    worker.send_signal(signal.SIGTERM)
    assert worker.wait(timeout=20) == 0, procs.log(worker)
    # Redis 7 names the subcommand (client|unblock); 6.2 logs the command alone (client)
    assert all(d.startswith("command client") for d in denials(admin)), denials(admin)
    assert "Redis refuses the idle watch of several queues" in procs.log(worker)
    assert not any(r.llen(QueueKeys(q).moving) for q in ("other", "default"))


def test_the_documented_acl_rule_is_the_tested_one() -> None:
    """docs/operating.md's ``ACL SETUSER`` line grants exactly what this file tests."""
    doc = (Path(__file__).resolve().parents[2] / "docs" / "operating.md").read_text()
    lines = [line for line in doc.splitlines() if line.startswith("ACL SETUSER rq-emq ")]
    assert len(lines) == 1, lines
    documented = lines[0].split()[3:]
    assert documented == [rule if rule != f">{PASSWORD}" else ">PASSWORD" for rule in ACL_RULES]
