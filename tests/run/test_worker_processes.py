"""LeaseWorker and SimpleLeaseWorker as operators run them: real ``rq worker -w`` processes,
real signals, a real Redis."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest
import redis
from helpers import FAST, STEADY, lease_state, started_members, stat, status, take_away, wait_status
from jobs import runs
from procs import Processes, pid_alive, unseen, wait_for
from rq import Queue
from rq.registry import StartedJobRegistry

from rq_emq.keys import QueueKeys, job_key, sweeper_election_key, watch_key

WORKERS = ["rq_emq.LeaseWorker", "rq_emq.SimpleLeaseWorker"]


pytestmark = pytest.mark.slow


def test_a_job_running_20_times_the_lease_is_never_reclaimed_and_finishes_once(
    r: redis.Redis, redis_url: str, procs: Processes, tmp_path: Path
) -> None:
    """With a healthy Redis a job 20 leases long keeps its lease all along, though a
    second worker's sweep would take a lapsed one: one run, no self-fencing stop, no
    fenced write, and stock cleanup leaves it alone. Each worker class runs one such job
    on a queue of its own, side by side (it was one test per class, and before that two
    tests, this one and test_self_fencing's "a job twenty leases long runs once with a
    healthy redis"; the twenty leases are the test's whole time, so the classes share it)."""
    twenty_leases_s = 20 * int(FAST["RQ_EMQ_LEASE_MS"]) / 1000
    queue_of = {name: name.rsplit(".", 1)[1].lower() for name in WORKERS}
    logs = {name: str(tmp_path / f"{name}.log") for name in WORKERS}
    jobs = {
        name: Queue(queue_of[name], connection=r).enqueue(
            "jobs.sleep_and_record", logs[name], twenty_leases_s, job_timeout=60
        )
        for name in WORKERS
    }
    holders = {
        name: procs.worker(redis_url, queue_of[name], worker_class=name, burst=True, **FAST)
        for name in WORKERS
    }
    for name in WORKERS:
        wait_for(lambda name=name: runs(logs[name]), what=f"the {name} job to start")
    procs.worker(redis_url, *queue_of.values(), **FAST)  # whose sweep would take a lapsed lease
    scores: dict[str, list[float]] = {name: [] for name in WORKERS}
    beats: dict[str, set[bytes | None]] = {name: set() for name in WORKERS}
    running = set(WORKERS)
    while running:
        for name in sorted(running):
            job, q = jobs[name], QueueKeys(queue_of[name])
            # one snapshot (MULTI): a job seen started has its lease and its pinned entry
            with r.pipeline(transaction=True) as snapshot:
                snapshot.hget(job_key(job.id), "status").zscore(q.leases, job.id).hget(
                    job_key(job.id), "emq_token"
                )
                snapshot.zrange(q.started, 0, -1, withscores=True)
                job_status, indexed, token, entries = snapshot.execute()
            if job_status != b"started":
                running.discard(name)
                continue
            assert indexed is not None and token, (name, indexed, token)
            assert len(entries) == 1 and entries[0][0].decode().startswith(job.id), (name, entries)
            scores[name].append(entries[0][1])
            # RQ's own view of the run (its execution's heartbeat) kept fresh by the worker's
            # ticks: a forked horse's record, sent in its start, is still the worker's to beat
            beats[name].add(r.hget(f"rq:execution:{entries[0][0].decode()}", "last_heartbeat"))
            # stock cleanup (rq info, django-rq, a stock worker) must leave a leased job alone
            StartedJobRegistry(queue_of[name], connection=r).cleanup()
        time.sleep(0.25)
    for name in WORKERS:
        job, q, worker = jobs[name], QueueKeys(queue_of[name]), holders[name]
        assert worker.wait(timeout=30) == 0, procs.log(worker)
        assert status(r, job.id) == "finished", name
        assert [line.split()[0] for line in runs(logs[name])] == ["start", "end"], name
        assert stat(r, q.queue, "lease_lost") == 0 and stat(r, q.queue, "fenced") == 0, name
        assert stat(r, q.queue, "renewed") >= 40, name
        # the started-registry entry was pinned all along: no cleanup could find it due
        assert len(scores[name]) > 20 and set(scores[name]) == {float("inf")}, (name, scores[name])
        # sampled every 250 ms over 16 s and beaten every 100 ms: a fresh beat at nearly each
        # look; half of them is the slack for a loaded host
        assert len(beats[name] - {None}) > len(scores[name]) / 2, (name, sorted(beats[name] - {None}))
        assert not r.exists(q.lock(job.id)) and r.zcard(q.leases) == 0, name
        assert "local lease clock ran out" not in procs.log(worker), name


def test_sigkill_of_the_worker_kills_its_horse(
    r: redis.Redis, redis_url: str, procs: Processes, tmp_path: Path
) -> None:
    log = str(tmp_path / "runs.log")
    job = Queue(connection=r).enqueue("jobs.sleep_and_record", log, 60.0, job_timeout=120)
    worker = procs.worker(redis_url, **FAST)
    lines = wait_for(lambda: runs(log), what="the job to start")
    horse = int(lines[0].split()[1])  # type: ignore[index]
    assert horse != worker.pid and pid_alive(horse)
    os.kill(unseen(worker.pid), signal.SIGKILL)
    wait_for(lambda: not pid_alive(horse), timeout=3, what="the horse to die with its worker")
    # the job is left in flight with its lease running out, for the sweep to recover
    assert status(r, job.id) == "started"
    wait_for(lambda: not r.exists(QueueKeys("default").lock(job.id)), timeout=3, what="the lock to lapse")


@pytest.mark.parametrize("worker_class", WORKERS)
def test_a_worker_whose_lease_is_taken_stops_the_job_and_writes_nothing(
    r: redis.Redis, redis_url: str, procs: Processes, tmp_path: Path, worker_class: str
) -> None:
    log = str(tmp_path / "runs.log")
    job = Queue(connection=r).enqueue("jobs.sleep_and_record", log, 20.0, job_timeout=60)
    worker = procs.worker(redis_url, worker_class=worker_class, burst=True, **FAST)
    wait_for(lambda: runs(log), what="the job to start")
    take_away(r, job.id, status="queued")
    # a SimpleLeaseWorker's stopped run ends its process (exit 1, for its supervisor)
    ended = 1 if worker_class == "rq_emq.SimpleLeaseWorker" else 0
    assert worker.wait(timeout=10) == ended, procs.log(worker)
    assert [line.split()[0] for line in runs(log)] == ["start"]  # stopped, never reached the end
    assert status(r, job.id) == "queued"  # the late finish changed nothing
    assert r.zcard("rq:failed:default") == 0 and r.zcard("rq:finished:default") == 0
    assert stat(r, "default", "lease_lost") == 1
    assert f"job {job.id}" in procs.log(worker) and "lease lost" in procs.log(worker)


def test_with_stop_on_lease_lost_off_the_job_finishes_but_its_outcome_is_fenced(
    r: redis.Redis, redis_url: str, procs: Processes, tmp_path: Path
) -> None:
    log = str(tmp_path / "runs.log")
    job = Queue(connection=r).enqueue("jobs.sleep_and_record", log, 1.5, job_timeout=60)
    worker = procs.worker(redis_url, burst=True, RQ_EMQ_STOP_ON_LEASE_LOST="false", **FAST)
    wait_for(lambda: runs(log), what="the job to start")
    take_away(r, job.id, status="queued", new_owner="taken-by-another")
    assert worker.wait(timeout=10) == 0, procs.log(worker)
    assert [line.split()[0] for line in runs(log)] == ["start", "end"]
    assert status(r, job.id) == "queued"
    assert r.zcard("rq:finished:default") == 0
    assert stat(r, "default", "fenced") >= 1


@pytest.mark.parametrize("worker_class", WORKERS)
@pytest.mark.rq_versions
def test_a_cold_stop_hands_the_job_back_to_the_front_of_its_queue(
    r: redis.Redis, redis_url: str, procs: Processes, tmp_path: Path, worker_class: str
) -> None:
    log = str(tmp_path / "runs.log")
    queue = Queue(connection=r)
    job = queue.enqueue("jobs.sleep_and_record", log, 30.0, job_timeout=60)
    worker = procs.worker(redis_url, worker_class=worker_class, **FAST)
    wait_for(lambda: runs(log), what="the job to start")
    behind = queue.enqueue("jobs.noop")
    worker.send_signal(signal.SIGTERM)  # warm shutdown: would wait for the job
    time.sleep(1.3)  # RQ ignores a second signal within 1 s
    worker.send_signal(signal.SIGTERM)  # stop now
    worker.wait(timeout=10)
    q = QueueKeys("default")
    # a SimpleLeaseWorker's job is handed back by its watchdog, once it has seen it gone
    wait_for(lambda: r.llen(q.rq_queue) == 2, timeout=10, what="the job back in its queue")
    assert [m.decode() for m in r.lrange(q.rq_queue, 0, -1)] == [job.id, behind.id]
    assert status(r, job.id) == "queued"
    assert lease_state(r, "default", job.id) == {
        "lock": None,
        "indexed": False,
        "token": None,
        "attempts": b"0",
    }
    assert started_members(r, "default") == []
    assert stat(r, "default", "returned") == 1


@pytest.mark.rq_versions
def test_rq_semantics_hold_under_the_lease_worker(
    r: redis.Redis, redis_url: str, procs: Processes, tmp_path: Path
) -> None:
    from rq import Retry

    log = str(tmp_path / "runs.log")
    queue = Queue(connection=r)
    ok = queue.enqueue("jobs.add", 2, 3)
    dependent = queue.enqueue("jobs.add", 1, 1, depends_on=ok)
    failing = queue.enqueue("jobs.fail", "bad input")
    retried = queue.enqueue("jobs.fail_and_record", log, retry=Retry(max=2))
    timed_out = queue.enqueue("jobs.sleep_and_record", str(tmp_path / "t.log"), 5.0, job_timeout=1)
    worker = procs.worker(redis_url, burst=True, **STEADY)
    assert worker.wait(timeout=60) == 0, procs.log(worker)
    assert ok.latest_result().return_value == 5  # type: ignore[union-attr]
    assert dependent.latest_result().return_value == 2  # type: ignore[union-attr]
    assert status(r, failing.id) == "failed" and "bad input" in (failing.latest_result().exc_string or "")  # type: ignore[union-attr]
    assert status(r, retried.id) == "failed" and len(runs(log)) == 3 + procs.self_fenced_stops(retried.id)
    assert status(r, timed_out.id) == "failed"
    assert "JobTimeoutException" in (timed_out.latest_result().exc_string or "")  # type: ignore[union-attr]
    assert r.zcard(QueueKeys("default").leases) == 0
    assert stat(r, "default", "taken") == 7 and stat(r, "default", "finished") == 7


@pytest.mark.rq_versions
def test_the_stop_job_command_stops_a_leased_job(
    r: redis.Redis, redis_url: str, procs: Processes, tmp_path: Path
) -> None:
    from rq.command import send_stop_job_command

    log = str(tmp_path / "runs.log")
    job = Queue(connection=r).enqueue("jobs.sleep_and_record", log, 30.0, job_timeout=60)
    worker = procs.worker(redis_url, burst=True, **STEADY)
    wait_for(lambda: runs(log), what="the job to start")
    wait_for(lambda: status(r, job.id) == "started" and r.hget(job_key(job.id), "worker_name"))
    time.sleep(0.3)  # let the worker subscribe to its command channel
    send_stop_job_command(r, job.id)
    assert worker.wait(timeout=15) == 0, procs.log(worker)
    assert status(r, job.id) == "stopped"
    assert not r.exists(QueueKeys("default").lock(job.id))


def test_a_per_job_max_attempts_from_a_stock_producer_is_recorded(
    r: redis.Redis, redis_url: str, procs: Processes
) -> None:
    import rq_emq

    custom = Queue(connection=r).enqueue("jobs.noop", meta=rq_emq.max_attempts(7))
    default = Queue(connection=r).enqueue("jobs.noop")
    worker = procs.worker(redis_url, burst=True, RQ_EMQ_MAX_ATTEMPTS="4", **FAST)
    assert worker.wait(timeout=20) == 0, procs.log(worker)
    assert r.hget(job_key(custom.id), "emq_max_attempts") == b"7"
    assert r.hget(job_key(default.id), "emq_max_attempts") is None  # the worker default applies


@pytest.mark.parametrize(
    ("env", "named"),
    [
        ({"RQ_EMQ_RENEW_INTERVAL_MS": "30000", "RQ_EMQ_LEASE_MS": "30000"}, "renew_interval_ms"),
        ({"RQ_EMQ_LEASE_MS": "soon"}, "lease_ms"),
        ({"RQ_EMQ_MAX_ATTEMPTS": "0"}, "max_attempts"),
    ],
)
def test_bad_settings_stop_the_worker_at_startup_naming_the_setting(
    r: redis.Redis, redis_url: str, procs: Processes, env: dict[str, str], named: str
) -> None:
    job = Queue(connection=r).enqueue("jobs.noop")
    worker = procs.worker(redis_url, burst=True, **env)
    assert worker.wait(timeout=20) != 0
    assert one_line(procs.log(worker)).startswith("rq-emq: invalid setting: " + named)
    assert status(r, job.id) == "queued" and r.llen("rq:queue:default") == 1  # nothing taken, nothing lost


def one_line(log: str) -> str:
    """The worker's output, which must be one line (RQ 2.0 with a newer click adds warnings
    about its own duplicate options: those are not ours)."""
    lines = [line for line in log.splitlines() if line.strip() and not _click_noise(line)]
    assert len(lines) == 1 and "Traceback" not in log, log
    return lines[0]


def _click_noise(line: str) -> bool:
    return "UserWarning: The parameter" in line or line.strip().startswith(("parser =", "self.parse_args"))


def test_an_unreachable_redis_stops_the_worker_with_one_line(procs: Processes) -> None:
    worker = procs.worker("redis://127.0.0.1:1", burst=True)
    assert worker.wait(timeout=20) != 0
    assert "127.0.0.1:1" in one_line(procs.log(worker))


def test_a_redis_older_than_6_2_stops_the_worker_with_one_line(
    r: redis.Redis, redis_url: str, procs: Processes
) -> None:
    job = Queue(connection=r).enqueue("jobs.noop")
    worker = procs.worker(
        redis_url,
        burst=True,
        worker_class="worker_classes.OldRedisLeaseWorker",
        EMQ_TEST_REDIS_VERSION="6.0.16",
    )
    assert worker.wait(timeout=20) != 0
    line = one_line(procs.log(worker))
    assert line.startswith("rq-emq: Redis 6.0.16 at ") and "older than 6.2" in line, line
    assert status(r, job.id) == "queued" and not r.smembers("rq:workers")  # not even registered


@pytest.mark.parametrize("env", [{"RQ_EMQ_LEASE_MS": "2000"}, {"RQ_EMQ_RENEW_INTERVAL_MS": "40000"}])
def test_a_lease_or_renew_interval_set_alone_gives_a_working_worker(
    r: redis.Redis, redis_url: str, procs: Processes, env: dict[str, str]
) -> None:
    job = Queue(connection=r).enqueue("jobs.noop")
    worker = procs.worker(redis_url, burst=True, **env)
    assert worker.wait(timeout=20) == 0, procs.log(worker)
    assert status(r, job.id) == "finished"


def test_deleted_jobs_and_stray_registry_entries_are_skipped_not_fatal(
    r: redis.Redis, redis_url: str, procs: Processes, tmp_path: Path
) -> None:
    queue = Queue(connection=r)
    ghost = queue.enqueue("jobs.noop")
    r.delete(job_key(ghost.id))
    log = str(tmp_path / "runs.log")
    deleted_mid_run = queue.enqueue("jobs.sleep_and_record", log, 20.0, job_timeout=60)
    survivor = queue.enqueue("jobs.add", 20, 22)
    q = QueueKeys("default")
    r.zadd(q.started, {"no-such-job:no-such-execution": 1})  # long overdue
    r.zadd(q.leases, {"no-such-job": 1})
    r.rpush(q.moving, "no-such-job")
    worker = procs.worker(redis_url, burst=True, **FAST)
    wait_for(lambda: runs(log), what="the job to start")
    r.delete(job_key(deleted_mid_run.id))
    assert worker.wait(timeout=20) == 0, procs.log(worker)
    assert status(r, survivor.id) == "finished", procs.log(worker)
    assert survivor.latest_result().return_value == 42  # type: ignore[union-attr]
    assert ghost.id in procs.log(worker)
    assert not r.exists(job_key(deleted_mid_run.id))  # not recreated by a heartbeat


def test_several_queues_are_served_in_order_without_blpop(
    r: redis.Redis, redis_url: str, procs: Processes
) -> None:
    low = Queue("low", connection=r).enqueue("jobs.add", 1, 0)
    high = Queue("high", connection=r).enqueue("jobs.add", 2, 0)
    r.config_resetstat()
    worker = procs.worker(redis_url, "high", "low", burst=True, **STEADY)
    assert worker.wait(timeout=20) == 0, procs.log(worker)
    assert high.latest_result().return_value == 2 and low.latest_result().return_value == 1  # type: ignore[union-attr]
    assert high.latest_result().created_at <= low.latest_result().created_at  # type: ignore[union-attr]
    assert "cmdstat_blpop" not in r.info("commandstats")


def test_an_idle_worker_picks_up_a_new_job_promptly(r: redis.Redis, redis_url: str, procs: Processes) -> None:
    for queues in (("default",), ("a", "b", "default")):
        worker = procs.worker(redis_url, *queues, **FAST)
        wait_for(lambda: r.keys("rq:worker:*"), what="the worker to register")
        time.sleep(0.5)
        job = Queue(connection=r).enqueue("jobs.noop")
        wait_status(r, job.id, "finished", timeout=5)
        worker.send_signal(signal.SIGKILL)
        worker.wait()
        r.flushdb()


@pytest.mark.parametrize("worker_class", WORKERS)
def test_an_idle_worker_on_several_queues_stops_on_sigterm(
    r: redis.Redis, redis_url: str, procs: Processes, worker_class: str
) -> None:
    watch = watch_key(sweeper_election_key(["a", "b"]))
    worker = procs.worker(redis_url, "a", "b", worker_class=worker_class, **FAST)
    wait_for(lambda: r.keys("rq:worker:*"), what="the worker to register")
    # idle, watching its two queues (a lone worker is its set's watcher): RQ's warm-stop
    # signal handler raises in that wait
    wait_for(lambda: r.exists(watch), what="the worker watching")
    worker.send_signal(signal.SIGTERM)
    assert worker.wait(timeout=20) == 0, procs.log(worker)
    # the watch handed on at once, for the next worker to take (not left to lapse)
    assert not r.exists(watch) and r.llen(watch.replace(":watch", ":wake")) == 1


@pytest.mark.rq_versions
def test_worker_pool_runs_lease_workers(r: redis.Redis, redis_url: str, procs: Processes) -> None:
    queue = Queue(connection=r)
    jobs = [queue.enqueue("jobs.add", i, i) for i in range(6)]
    from procs import RQ_BIN

    pool = procs.start(
        [RQ_BIN, "worker-pool", "-w", "rq_emq.LeaseWorker", "--url", redis_url, "-n", "2", "default"],
        env=procs.env(**STEADY),
        name="pool",
    )
    for job in jobs:
        wait_status(r, job.id, "finished", timeout=30)
    assert stat(r, "default", "taken") == 6
    pool.send_signal(signal.SIGINT)
    pool.wait(timeout=15)


@pytest.mark.rq_versions
def test_a_killed_worker_pool_members_job_is_recovered_and_finished_once_and_the_pool_respawns(
    r: redis.Redis, redis_url: str, procs: Processes, tmp_path: Path
) -> None:
    from procs import RQ_BIN

    log = str(tmp_path / "runs.log")
    pool = procs.start(
        [RQ_BIN, "worker-pool", "-w", "rq_emq.LeaseWorker", "--url", redis_url, "-n", "2", "default"],
        # a lease the sweep cannot win against the member's watchdog: its hand-back imports
        # redis-py first, which on a loaded host outlasted FAST's 800 ms lease
        env=procs.env(**{**FAST, "RQ_EMQ_LEASE_MS": "10000"}),
        name="pool",
    )
    wait_for(lambda: r.scard("rq:workers") == 2, timeout=30, what="two pool members to register")
    members = {m.decode() for m in r.smembers("rq:workers")}
    job = Queue(connection=r).enqueue("integration_jobs.slow_on_first_run", log, 120.0, job_timeout=300)
    wait_for(lambda: runs(log), timeout=20, what="the job to start")
    holder = r.hget(job_key(job.id), "worker_name").decode()  # type: ignore[union-attr]
    member_pid = int(r.hget(f"rq:worker:{holder}", "pid"))  # type: ignore[arg-type]
    horse_pid = int(runs(log)[0].split()[1])
    os.kill(member_pid, signal.SIGKILL)  # its horse dies with it
    wait_for(lambda: not pid_alive(horse_pid), timeout=10, what="the horse to die with its worker")
    # the member's watchdog saw it die and hands the job back; it runs again and finishes, once
    wait_status(r, job.id, "finished", timeout=30)
    assert [line.split()[0] for line in runs(log)] == ["start", "start", "end"]
    assert stat(r, "default", "crashed") == 1 and len(job.results()) == 1
    # the pool replaced the dead member with a new one, which is waiting for work
    (newcomer,) = wait_for(  # type: ignore[misc]
        lambda: {m.decode() for m in r.smembers("rq:workers")} - members,
        timeout=30,
        what="the pool to start a new member",
    )
    # (a member signalled before it installed its own handlers, while it still runs the pool's
    # inherited ones, ignores the stop: a stock RQ race, so wait until it is idle)
    wait_for(lambda: r.hget(newcomer, "state") == b"idle", timeout=30, what="the new member to idle")
    assert pool.poll() is None
    pool.send_signal(signal.SIGINT)
    pool.wait(timeout=30)


def test_an_unreadable_job_hash_goes_to_failed_with_a_reason_and_the_worker_goes_on(
    r: redis.Redis, redis_url: str, procs: Processes
) -> None:
    r.hset(job_key("mangled"), mapping={"status": "queued", "origin": "default"})  # no payload at all
    r.rpush("rq:queue:default", "mangled")
    after = Queue(connection=r).enqueue("jobs.add", 1, 2)
    worker = procs.worker(redis_url, burst=True, **FAST)
    assert worker.wait(timeout=20) == 0, procs.log(worker)
    assert r.zscore(QueueKeys("default").failed, "mangled") is not None
    assert status(r, "mangled") == "failed" and b"unreadable" in r.hget(job_key("mangled"), "exc_info")
    assert "mangled" in procs.log(worker)
    assert r.zcard(QueueKeys("default").leases) == 0 and not r.exists(QueueKeys("default").lock("mangled"))
    assert after.latest_result().return_value == 3  # type: ignore[union-attr]


@pytest.mark.rq_versions
def test_a_fenced_failure_is_one_warning_line_not_rqs_traceback(
    r: redis.Redis, redis_url: str, procs: Processes, tmp_path: Path
) -> None:
    log = str(tmp_path / "runs.log")
    job = Queue(connection=r).enqueue("jobs.lose_lease_and_fail", log)
    worker = procs.worker(redis_url, burst=True, RQ_EMQ_STOP_ON_LEASE_LOST="false", **FAST)
    assert worker.wait(timeout=15) == 0, procs.log(worker)
    text = procs.log(worker)
    assert r.hget(job_key(job.id), "status") != b"failed"  # nothing written by the fenced failure
    assert f"job {job.id} on queue default: lease lost, outcome discarded" in text
    assert "failed to persist" not in text and "LeaseLost" not in text, text
