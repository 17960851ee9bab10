"""A Redis ACL user limited to RQ's and our keys (``~rq:* ~emq:*``), RQ's pub/sub channels
and the smallest command set that works runs everything end to end: producer, both worker
kinds (one queue and several), the reaper, ``rq info``, ``rq-emq status``, a crash recovery
and a failure at max attempts, with not one command refused. The user is created exactly
as docs/operating.md says (its lines are read from there), on whichever server the tests
run: Redis 7 here, Redis 6.2 and Valkey in CI's stages of their own."""

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
from rq_emq.run.startup import parse_version
from rq_emq.testing import RedisServer

pytestmark = pytest.mark.slow

USER, PASSWORD = "rq-emq", "lease-me"
RQ_EMQ_BIN = str(Path(RQ_BIN).parent / "rq-emq")

#: The section of docs/operating.md that gives the user's rule: the tests run exactly that.
DOCS = Path(__file__).resolve().parents[2] / "docs" / "operating.md"
SECTION = "### A least-privilege ACL user"


def documented_lines() -> list[str]:
    """Each ``ACL SETUSER rq-emq`` line of the section, as written."""
    text = DOCS.read_text()
    section = text[text.index(SECTION) :].split("\n## ", 1)[0]
    return [line.strip() for line in section.splitlines() if line.startswith(f"ACL SETUSER {USER} ")]


def documented_rule() -> tuple[str, ...]:
    """The rule every server takes (the line that creates the user), with this test's password."""
    (line,) = [line for line in documented_lines() if " on >PASSWORD " in line]
    return tuple(f">{PASSWORD}" if rule == ">PASSWORD" else rule for rule in line.split()[3:])


def documented_additions(version: tuple[int, ...]) -> tuple[str, ...]:
    """What the section adds for a server of ``version`` (``redis_version``; Valkey says 7.2.4),
    each addition's line naming its servers after ``#``."""
    for line in documented_lines():
        rules, _, servers = line.partition("#")
        if not servers:
            continue
        if ("Redis 6.2" in servers and version[:2] == (6, 2)) or (
            "Redis 7.2 and later" in servers and version >= (7, 2)
        ):
            return tuple(rules.split()[3:])
    return ()


ACL_RULES = documented_rule()


def acl_url(server: RedisServer, user: str = USER) -> str:
    return f"redis://{user}:{PASSWORD}@127.0.0.1:{server.port}/0"


def create_user(admin: redis.Redis, rules: tuple[str, ...] = ACL_RULES) -> None:
    """The user as docs/operating.md creates it: its rule, then its server's additions."""
    admin.execute_command("ACL", "SETUSER", USER, *rules)
    version = parse_version(str(admin.info("server")["redis_version"]))
    additions = documented_additions(version)
    if additions:
        admin.execute_command("ACL", "SETUSER", USER, *additions)


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

    # rq info, and rq-emq status
    info = subprocess.run(
        [RQ_BIN, "info", "--url", url], capture_output=True, text=True, timeout=60, env=procs.env()
    )
    assert info.returncode == 0 and "default" in info.stdout, info.stdout + info.stderr
    status = subprocess.run(
        [RQ_EMQ_BIN, "status", "--url", url], capture_output=True, text=True, timeout=60, env=procs.env()
    )
    assert status.returncode == 0 and "default" in status.stdout, status.stdout + status.stderr
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


def test_the_documented_rule_creates_the_user_on_every_server_with_its_additions() -> None:
    """docs/operating.md's lines, as this file reads them: one rule for every server, then
    CLIENT SETINFO (and on 6.2 MAINT_NOTIFICATIONS) for the servers that know them."""
    assert ACL_RULES[:2] == ("on", f">{PASSWORD}") and "+client|setinfo" not in ACL_RULES  # 7.0 refuses it
    assert documented_additions((6, 2, 14)) == ("+client|setinfo", "+client|maint_notifications")
    assert documented_additions((7, 0, 15)) == ()
    assert documented_additions((7, 2, 4)) == ("+client|setinfo",)  # Valkey 8 and 9 say 7.2.4
    assert documented_additions((8, 0, 2)) == ("+client|setinfo",)
