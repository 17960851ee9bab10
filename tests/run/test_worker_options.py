"""Every RQ worker option and class works under leases, or is refused at startup.

One test per row of the README's "Works with" table: real ``rq worker`` processes
(``tests/procs.py``) against a real redis-server; crash tests SIGKILL the worker and check
that its job is recovered and finished by another.
"""

from __future__ import annotations

import inspect
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import redis
import rq
from helpers import FAST, STEADY
from jobs import runs
from procs import RQ_BIN, Processes, pid_alive, wait_for
from rq import Queue
from rq.job import Job
from rq.worker_pool import WorkerPool
from worker_classes import CustomNamespaceJob, CustomNamespaceQueue

from rq_emq import lease_worker
from rq_emq.intake.take import Taker
from rq_emq.keys import QueueKeys, sweeper_election_key
from rq_emq.recover.sweep import Sweeper
from rq_emq.settings import LeaseSettings

pytestmark = [pytest.mark.slow, pytest.mark.rq_versions]

CUSTOM = (
    "--job-class",
    "worker_classes.CustomNamespaceJob",
    "--queue-class",
    "worker_classes.CustomNamespaceQueue",
)
HAS_SPAWN = hasattr(__import__("rq.worker", fromlist=["x"]), "SpawnWorker")
HAS_KEY_PREFIX = hasattr(__import__("rq.defaults", fromlist=["x"]), "RQ_KEY_PREFIX")
# RQ 2's pools take --queue-class but their workers build RQ's Queue anyway (stock workers too)
POOL_HONOURS_QUEUE_CLASS = (
    "queue_class" in inspect.signature(WorkerPool.__init__).parameters
    and int(rq.__version__.split(".")[0]) >= 3
)


def starts(log: str) -> list[int]:
    return [int(line.split()[1]) for line in runs(log) if line.startswith("start")]


def tags(log: str) -> list[str]:
    """The tag of each ``jobs.record`` line, in run order."""
    return [line.split()[0] for line in runs(log)]


def refusal(output: str) -> str:
    """The one line a refused worker prints (RQ 2.0's CLI adds click's warnings about its
    own duplicate options to every command's output: those are not ours)."""
    ours = [line for line in output.splitlines() if "UserWarning" not in line and not line.startswith(" ")]
    assert len(ours) == 1 and ours[0].startswith("rq-emq: "), output
    return ours[0]


def status_of(r: redis.Redis, key: str) -> str | None:
    value = r.hget(key, "status")
    return value.decode() if value else None


def wait_finished(r: redis.Redis, key: str, timeout: float = 30.0) -> None:
    wait_for(lambda: status_of(r, key) == "finished", timeout=timeout, what=f"{key} finished")


def kill_worker_mid_job(r: redis.Redis, procs: Processes, victim: subprocess.Popen[bytes], log: str) -> int:
    """SIGKILL ``victim`` (the worker alone, as the OOM killer would) once its job runs;
    returns the pid that ran the job, which must die with it."""
    wait_for(lambda: starts(log), timeout=20, what="the job to start")
    runner = starts(log)[0]
    os.kill(victim.pid, signal.SIGKILL)
    victim.wait(timeout=10)
    wait_for(lambda: not pid_alive(runner), timeout=5, what="the run to die with its worker")
    return runner


def assert_recovered_once(r: redis.Redis, procs: Processes, log: str, layout: QueueKeys, job_id: str) -> None:
    """The killed worker's run and the survivor's: two runs and one recovery (its watchdog
    saw it die and handed the job back: a crash counted), plus one of each for a run its
    worker stopped on its local lease clock (a host starved under .ci/stress; the sweep
    recovers it), which may end before its horse logs its start (a spawned horse is slow)."""
    stops = procs.self_fenced_stops(job_id)
    assert 2 <= len(starts(log)) <= 2 + stops, (starts(log), stops)
    counted = [int(r.hget(layout.stats, name) or 0) for name in ("crashed", "recovered")]
    assert counted == [1, stops], (counted, stops)


# -- custom job and queue namespaces ------------------------------------------------------
# Tests that count runs and need no recovery run under STEADY (see ``_run_order``).


def test_job_class_and_queue_class_with_their_own_namespaces_run_every_job(
    r: redis.Redis, redis_url: str, procs: Processes, tmp_path: Path
) -> None:
    log = str(tmp_path / "runs.log")
    queue = CustomNamespaceQueue("default", connection=r, job_class=CustomNamespaceJob)
    jobs = [queue.enqueue("jobs.record", log, f"job-{i}") for i in range(3)]
    assert r.llen("custom:queue:default") == 3 and not r.exists("rq:queue:default")
    worker = procs.worker(redis_url, burst=True, args=CUSTOM, **STEADY)
    assert worker.wait(timeout=60) == 0, procs.log(worker)
    for job in jobs:
        assert status_of(r, f"custom:job:{job.id}") == "finished", procs.log(worker)
        assert not r.exists(f"rq:job:{job.id}")  # nothing looked for (or written) at RQ's default
    assert sorted(tags(log)) == ["job-0", "job-1", "job-2"]
    # the custom queue's leases have keys of their own, apart from RQ's "default" queue's
    layout = QueueKeys("default", "custom:queue:", "custom:job:")
    assert int(r.hget(layout.stats, "taken") or 0) == 3 and not r.exists(QueueKeys("default").stats)


def test_a_custom_job_class_alone_is_never_dropped_by_the_take(
    r: redis.Redis, redis_url: str, procs: Processes, tmp_path: Path
) -> None:
    """The take used to look for ``rq:job:<id>``, find nothing, and drop the job as deleted."""
    log = str(tmp_path / "runs.log")
    job = Queue("default", connection=r, job_class=CustomNamespaceJob).enqueue("jobs.record", log, "once")
    worker = procs.worker(
        redis_url, burst=True, args=("--job-class", "worker_classes.CustomNamespaceJob"), **STEADY
    )
    assert worker.wait(timeout=60) == 0, procs.log(worker)
    assert status_of(r, f"custom:job:{job.id}") == "finished", procs.log(worker)
    assert tags(log) == ["once"]
    assert "hash is gone" not in procs.log(worker)


def test_custom_namespaces_a_killed_workers_job_is_recovered_and_finished(
    r: redis.Redis, redis_url: str, procs: Processes, tmp_path: Path
) -> None:
    log = str(tmp_path / "runs.log")
    queue = CustomNamespaceQueue("default", connection=r, job_class=CustomNamespaceJob)
    job = queue.enqueue("jobs.sleep_and_record", log, 2.0, job_timeout=60)
    victim = procs.worker(redis_url, name="victim", args=CUSTOM, **FAST)
    kill_worker_mid_job(r, procs, victim, log)
    procs.worker(redis_url, name="survivor", args=CUSTOM, **FAST)
    wait_finished(r, f"custom:job:{job.id}")
    assert_recovered_once(r, procs, log, QueueKeys("default", "custom:queue:", "custom:job:"), job.id)
    assert r.hget(f"custom:job:{job.id}", "worker_name") == b"survivor"


def test_worker_pool_with_custom_namespaces_runs_every_job(
    r: redis.Redis, redis_url: str, procs: Processes, tmp_path: Path
) -> None:
    log = str(tmp_path / "runs.log")
    # RQ 2.0's pool takes --queue-class but builds RQ's Queue anyway (stock workers too)
    queue_class = CustomNamespaceQueue if POOL_HONOURS_QUEUE_CLASS else Queue
    queue = queue_class("default", connection=r, job_class=CustomNamespaceJob)
    jobs = [queue.enqueue("jobs.record", log, f"job-{i}") for i in range(4)]
    cmd = [RQ_BIN, "worker-pool", "-w", "rq_emq.LeaseWorker", "--url", redis_url, "-n", "2", "--burst"]
    classes = CUSTOM if POOL_HONOURS_QUEUE_CLASS else CUSTOM[:2]
    pool = procs.start([*cmd, *classes, "default"], env=procs.env(**STEADY), name="pool")
    assert pool.wait(timeout=90) == 0, procs.log(pool)  # burst: its workers are gone too
    for job in jobs:
        assert status_of(r, f"custom:job:{job.id}") == "finished", procs.log(pool)
    assert sorted(tags(log)) == [f"job-{i}" for i in range(4)], procs.log(pool)


def test_reaper_sweeps_custom_namespaces_given_the_classes_and_refuses_without(
    r: redis.Redis, redis_url: str, procs: Processes
) -> None:
    queue = CustomNamespaceQueue("default", connection=r, job_class=CustomNamespaceJob)
    job = queue.enqueue("jobs.noop")
    layout = QueueKeys.of(queue)
    settings = LeaseSettings(lease_ms=200, renew_interval_ms=50, sweep_interval_ms=100)
    assert Taker(r, "dead-worker", settings).pop([layout]) is not None  # its holder then dies
    r.set(layout.jobs_at, "custom:job:")  # as the queue's workers record it
    env = procs.env(RQ_EMQ_SWEEP_INTERVAL_MS="100", RQ_EMQ_RENEW_INTERVAL_MS="50", RQ_EMQ_LEASE_MS="200")
    reaper = [str(Path(RQ_BIN).parent / "rq-emq"), "reaper", "--once", "--url", redis_url, "default"]
    wait_for(lambda: not r.exists(layout.lock(job.id)), timeout=5, what="the lease to lapse")
    # RQ's default job class would read the job as deleted: refused, in one line, nothing changed
    wrong = subprocess.run([*reaper, *CUSTOM[2:]], capture_output=True, text=True, env=env, timeout=60)
    assert wrong.returncode == 2 and "custom:job:" in wrong.stderr, wrong
    assert len(wrong.stderr.strip().splitlines()) == 1, wrong.stderr
    assert r.zscore(layout.leases, job.id) is not None
    # with the workers' classes: marked, then recovered a grace later
    for _ in range(2):
        subprocess.run([*reaper, *CUSTOM], check=True, env=env, timeout=60)
        if r.lindex("custom:queue:default", 0) == job.id.encode():
            break
        time.sleep(0.3)  # past the grace
    assert r.lrange("custom:queue:default", 0, -1) == [job.id.encode()]
    assert status_of(r, f"custom:job:{job.id}") == "queued"


def test_an_idle_take_on_custom_namespace_queues_wakes_for_a_job_pushed_to_its_second_queue(
    r: redis.Redis,
) -> None:
    """The idle wait blocks on each queue's own list (``custom:queue:<q>``), not RQ's default
    one: a job pushed while the worker waits is taken at once, not at the wait's end."""
    a, b = (CustomNamespaceQueue(name, connection=r, job_class=CustomNamespaceJob) for name in "ab")
    pushed: list[str] = []
    pusher = threading.Timer(0.5, lambda: pushed.append(b.enqueue("jobs.noop").id))
    pusher.start()
    started = time.monotonic()
    taken = Taker(r, "w", LeaseSettings()).take([QueueKeys.of(a), QueueKeys.of(b)], timeout=10.0)
    waited = time.monotonic() - started
    pusher.join()
    assert taken is not None and [taken.job_id] == pushed and taken.queue_index == 1
    assert waited < 5.0  # woken by the push (the wait would have lasted 10 s)
    assert r.zscore(QueueKeys.of(b).leases, taken.job_id) is not None


def test_a_custom_namespace_queue_set_has_a_sweeper_election_of_its_own(r: redis.Redis) -> None:
    """RQ's ``default`` and a custom class's ``default`` are different queues: a sweeper
    elected for one must not leave the other unswept."""
    settings = LeaseSettings()
    stock = Sweeper(r, ["default"], settings, elect=True)
    custom = Sweeper(
        r, ["default"], settings, job_class=CustomNamespaceJob, queue_class=CustomNamespaceQueue, elect=True
    )
    assert stock.election is not None and custom.election is not None
    assert stock.election.key == sweeper_election_key(["default"])  # RQ's layout keeps its key
    assert stock.election.hold() and custom.election.hold()


def test_status_and_leases_read_custom_namespaces_given_the_classes(
    r: redis.Redis, redis_url: str, procs: Processes
) -> None:
    queue = CustomNamespaceQueue("default", connection=r, job_class=CustomNamespaceJob)
    job = queue.enqueue("jobs.noop")
    queue.enqueue("jobs.noop")
    assert Taker(r, "worker-1", LeaseSettings()).pop([QueueKeys.of(queue)]) is not None
    cli = str(Path(RQ_BIN).parent / "rq-emq")

    def run(command: str, *args: str) -> subprocess.CompletedProcess[str]:
        cmd = [cli, command, "--url", redis_url, "--json", *args]
        return subprocess.run(cmd, capture_output=True, text=True, env=procs.env(), timeout=60)

    def read(command: str, *args: str) -> dict:
        out = run(command, *args)
        assert out.returncode == 0, out.stderr
        return dict(json.loads(out.stdout)["queues"][0])

    leases = read("leases", *CUSTOM, "default")
    assert [lease["job_id"] for lease in leases["leases"]] == [job.id]
    assert leases["leases"][0]["status"] == "queued" and leases["leases"][0]["attempts"] == 1
    status = read("status", *CUSTOM, "default")
    assert status["waiting"] == 1 and status["in_flight"] == 1 and status["counters"]["taken"] == 1
    # RQ's default layout is another queue, which nobody has used
    unknown = run("leases", "default")
    assert unknown.returncode == 2 and "unknown queue(s): default" in unknown.stderr


@pytest.mark.skipif(not HAS_KEY_PREFIX, reason="this RQ has no RQ_KEY_PREFIX")
def test_rq_key_prefix_a_killed_workers_job_is_recovered_and_rqs_view_cleaned(
    r: redis.Redis, redis_url: str, procs: Processes, tmp_path: Path
) -> None:
    """RQ 3's RQ_KEY_PREFIX moves every RQ key (jobs, queues, registries, executions)."""
    log = str(tmp_path / "runs.log")
    env = procs.env(RQ_KEY_PREFIX="alt", **FAST)
    enqueue = (
        "import sys; from redis import Redis; from rq import Queue; "
        "print(Queue(connection=Redis.from_url(sys.argv[1])).enqueue("
        "'jobs.sleep_and_record', sys.argv[2], 2.0, job_timeout=60).id)"
    )
    made = subprocess.run(
        [sys.executable, "-c", enqueue, redis_url, log], env=env, capture_output=True, text=True, check=True
    )
    job_id = made.stdout.strip()
    assert r.exists(f"alt:job:{job_id}") and r.llen("alt:queue:default") == 1
    cmd = [RQ_BIN, "worker", "-w", "rq_emq.LeaseWorker", "--url", redis_url]
    victim = procs.start([*cmd, "--name", "victim", "default"], env=env, name="worker")
    kill_worker_mid_job(r, procs, victim, log)
    procs.start([*cmd, "--name", "survivor", "default"], env=env, name="worker")
    wait_finished(r, f"alt:job:{job_id}")
    assert_recovered_once(r, procs, log, QueueKeys("default", "alt:queue:", "alt:job:"), job_id)
    # the recovery took the dead run out of RQ's view: nothing left in flight, and nothing
    # written under RQ's default prefix (RQ's scheduler keys aside: a scheduler process of
    # another test on this session's server wrote them once, after this test's flush)
    stray = [key for key in r.keys("rq:*") if not key.startswith(b"rq:scheduler")]
    assert r.zcard("alt:wip:default") == 0 and not stray, stray


def test_rqs_started_registry_cleanup_keeps_a_custom_namespace_queues_leased_entries(
    r: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """RQ names its started registry by queue name alone (``rq:wip:default`` for every
    namespace), and RQ's clean_registries() builds it from that name: the cleanup must
    still find a custom namespace queue's leases."""
    from rq.registry import StartedJobRegistry

    from rq_emq.recover import registries
    from rq_emq.recover.registries import lease_queue_class

    monkeypatch.setattr(registries, "_NAMESPACES", {})  # this process's namespaces: this test's only

    lease_queue = lease_queue_class(CustomNamespaceQueue)(
        "default", connection=r, job_class=CustomNamespaceJob
    )
    leased, other = lease_queue.enqueue("jobs.noop"), Queue(connection=r).enqueue("jobs.noop")
    layout = QueueKeys.of(lease_queue)
    assert Taker(r, "w", LeaseSettings()).pop([layout]) is not None
    due = time.time() - 10
    r.zadd("rq:wip:default", {f"{leased.id}:exec-1": due, f"{other.id}:exec-2": due})
    stock = StartedJobRegistry("default", connection=r)
    assert [j.split(":")[0] for j in stock.get_expired_job_ids()] == [other.id]


# -- dequeue strategies -------------------------------------------------------------------

ORDER_JOBS = 12


def _fill_two_queues(r: redis.Redis, log: str) -> None:
    for name in ("q1", "q2"):
        queue = Queue(name, connection=r)
        for _ in range(ORDER_JOBS):
            queue.enqueue("jobs.record", log, name)


def _run_order(
    procs: Processes, redis_url: str, worker_class: str, args: tuple[str, ...], log: str
) -> list[str]:
    # an order of takes needs no recovery: under FAST's 800 ms lease a starved host made the
    # worker stop a run on its lease clock, and the sweep's rerun came out of order (RQ
    # 2.12's suite beside another on 2 cores): a lease far longer than the run instead
    worker = procs.worker(redis_url, "q1", "q2", worker_class=worker_class, burst=True, args=args, **STEADY)
    assert worker.wait(timeout=120) == 0, procs.log(worker)
    order = tags(log)
    assert len(order) == 2 * ORDER_JOBS, procs.log(worker)
    return order


@pytest.mark.parametrize(
    "worker_class,args",
    [("rq_emq.LeaseWorker", ()), ("rq_emq.LeaseWorker", ("--dequeue-strategy", "default"))],
)
def test_dequeue_strategy_default_drains_the_first_queue_first(
    r: redis.Redis, redis_url: str, procs: Processes, tmp_path: Path, worker_class: str, args: tuple[str, ...]
) -> None:
    log = str(tmp_path / "runs.log")
    _fill_two_queues(r, log)
    assert _run_order(procs, redis_url, worker_class, args, log) == ["q1"] * ORDER_JOBS + ["q2"] * ORDER_JOBS


@pytest.mark.parametrize(
    "worker_class,args",
    [
        ("rq_emq.LeaseWorker", ("--dequeue-strategy", "round_robin")),
        ("rq_emq.SimpleLeaseWorker", ("--dequeue-strategy", "round_robin")),
        ("worker_classes.LeaseRoundRobinWorker", ()),
    ],
)
def test_dequeue_strategy_round_robin_alternates_the_queues(
    r: redis.Redis, redis_url: str, procs: Processes, tmp_path: Path, worker_class: str, args: tuple[str, ...]
) -> None:
    log = str(tmp_path / "runs.log")
    _fill_two_queues(r, log)
    assert _run_order(procs, redis_url, worker_class, args, log) == ["q1", "q2"] * ORDER_JOBS


@pytest.mark.parametrize(
    "worker_class,args",
    [
        ("rq_emq.LeaseWorker", ("--dequeue-strategy", "random")),
        ("worker_classes.LeaseRandomWorker", ()),
    ],
)
def test_dequeue_strategy_random_takes_from_both_queues_in_a_shuffled_order(
    r: redis.Redis, redis_url: str, procs: Processes, tmp_path: Path, worker_class: str, args: tuple[str, ...]
) -> None:
    log = str(tmp_path / "runs.log")
    _fill_two_queues(r, log)
    order = _run_order(procs, redis_url, worker_class, args, log)
    # the default order has a chance of 2**-12 under a fair shuffle after each take
    assert order != ["q1"] * ORDER_JOBS + ["q2"] * ORDER_JOBS
    assert "q2" in order[:ORDER_JOBS], order


# -- other worker classes and users' own --------------------------------------------------


@pytest.mark.parametrize(
    "worker_class,served_by",
    [
        ("worker_classes.LeaseAuditingWorker", "LeaseAuditingWorker"),
        ("worker_classes.LeaseAuditingSimpleWorker", "LeaseAuditingSimpleWorker"),
        ("worker_classes.LeaseHerokuWorker", None),
    ],
)
def test_a_user_worker_class_with_lease_worker_runs_jobs_under_leases(
    r: redis.Redis, redis_url: str, procs: Processes, tmp_path: Path, worker_class: str, served_by: str | None
) -> None:
    log, audit = str(tmp_path / "runs.log"), str(tmp_path / "audit.log")
    job = Queue(connection=r).enqueue("jobs.record", log, "ran")
    worker = procs.worker(
        redis_url, worker_class=worker_class, burst=True, EMQ_TEST_AUDIT_LOG=audit, **STEADY
    )
    assert worker.wait(timeout=60) == 0, procs.log(worker)
    assert status_of(r, f"rq:job:{job.id}") == "finished" and tags(log) == ["ran"]
    assert r.hget(QueueKeys("default").stats, "taken") == b"1"  # taken under a lease
    if served_by:  # the user's own override ran, inside the lease worker
        assert Path(audit).read_text().split() == ["execute", job.id, served_by]


@pytest.mark.parametrize(
    "worker_class", ["worker_classes.LeaseAuditingWorker", "worker_classes.LeaseHerokuWorker"]
)
def test_a_user_forking_worker_class_horse_dies_with_it_and_its_job_is_recovered(
    r: redis.Redis, redis_url: str, procs: Processes, tmp_path: Path, worker_class: str
) -> None:
    log, audit = str(tmp_path / "runs.log"), str(tmp_path / "audit.log")
    job = Queue(connection=r).enqueue("jobs.sleep_and_record", log, 2.0, job_timeout=60)
    victim = procs.worker(
        redis_url, worker_class=worker_class, name="victim", EMQ_TEST_AUDIT_LOG=audit, **FAST
    )
    kill_worker_mid_job(r, procs, victim, log)  # the horse died with it: no second run overlaps
    procs.worker(redis_url, worker_class=worker_class, name="survivor", EMQ_TEST_AUDIT_LOG=audit, **FAST)
    wait_finished(r, f"rq:job:{job.id}")
    assert_recovered_once(r, procs, log, QueueKeys("default"), job.id)


def test_lease_worker_returns_one_class_per_base_and_leaves_lease_classes_alone() -> None:
    import worker_classes

    from rq_emq import LeaseWorker, SimpleLeaseWorker

    assert lease_worker(worker_classes.AuditingWorker) is worker_classes.LeaseAuditingWorker
    assert lease_worker(LeaseWorker) is LeaseWorker
    assert issubclass(worker_classes.LeaseAuditingSimpleWorker, SimpleLeaseWorker)
    with pytest.raises(TypeError):
        lease_worker(Job)


def test_the_lease_mixin_by_hand_before_a_forking_class_is_refused_in_one_line(
    redis_url: str, procs: Processes
) -> None:
    worker = procs.worker(redis_url, worker_class="worker_classes.HandMixedWorker", burst=True, **FAST)
    assert worker.wait(timeout=60) == 1
    assert refusal(procs.log(worker)).endswith("use rq_emq.lease_worker(Worker)")


# -- SpawnWorker (RQ 3) -------------------------------------------------------------------

RQ_3 = int(rq.__version__.split(".")[0]) >= 3
spawn_only = pytest.mark.skipif(
    not (HAS_SPAWN and RQ_3), reason="leases for SpawnWorker need RQ 3 (RQ 2 refuses at startup)"
)


@spawn_only
@pytest.mark.parametrize("worker_class", ["rq_emq.SpawnLeaseWorker", "worker_classes.LeaseSpawnWorker"])
def test_spawn_worker_runs_jobs_under_leases(
    r: redis.Redis, redis_url: str, procs: Processes, tmp_path: Path, worker_class: str
) -> None:
    log = str(tmp_path / "runs.log")
    jobs = [Queue(connection=r).enqueue("jobs.record", log, f"job-{i}") for i in range(2)]
    worker = procs.worker(redis_url, worker_class=worker_class, burst=True, **FAST)
    assert worker.wait(timeout=90) == 0, procs.log(worker)
    for job in jobs:
        assert status_of(r, f"rq:job:{job.id}") == "finished", procs.log(worker)
        # the spawned horse's outcome was fenced: the finish released the lease
        assert (r.hget(f"rq:job:{job.id}", "emq_token") or b"").startswith(b"done:")
    assert int(r.hget(QueueKeys("default").stats, "finished") or 0) == 2


@spawn_only
def test_spawn_worker_with_custom_job_and_queue_namespaces_runs_every_job(
    r: redis.Redis, redis_url: str, procs: Processes, tmp_path: Path
) -> None:
    log = str(tmp_path / "runs.log")
    queue = CustomNamespaceQueue("default", connection=r, job_class=CustomNamespaceJob)
    jobs = [queue.enqueue("jobs.record", log, f"job-{i}") for i in range(2)]
    worker = procs.worker(
        redis_url, worker_class="rq_emq.SpawnLeaseWorker", burst=True, args=CUSTOM, **STEADY
    )
    assert worker.wait(timeout=90) == 0, procs.log(worker)
    for job in jobs:
        assert status_of(r, f"custom:job:{job.id}") == "finished", procs.log(worker)
    assert sorted(tags(log)) == ["job-0", "job-1"]


@spawn_only
def test_spawn_worker_horse_dies_with_its_worker_and_the_job_is_recovered(
    r: redis.Redis, redis_url: str, procs: Processes, tmp_path: Path
) -> None:
    log = str(tmp_path / "runs.log")
    job = Queue(connection=r).enqueue("jobs.sleep_and_record", log, 2.0, job_timeout=60)
    victim = procs.worker(redis_url, worker_class="rq_emq.SpawnLeaseWorker", name="victim", **FAST)
    kill_worker_mid_job(r, procs, victim, log)
    procs.worker(redis_url, worker_class="rq_emq.SpawnLeaseWorker", name="survivor", **FAST)
    wait_finished(r, f"rq:job:{job.id}")
    assert_recovered_once(r, procs, log, QueueKeys("default"), job.id)


@spawn_only
def test_spawn_worker_horse_ends_itself_at_its_local_lease_deadline_when_the_worker_freezes(
    r: redis.Redis, redis_url: str, procs: Processes, tmp_path: Path
) -> None:
    log = str(tmp_path / "runs.log")
    Queue(connection=r).enqueue("jobs.sleep_and_record", log, 30.0, job_timeout=60)
    worker = procs.worker(redis_url, worker_class="rq_emq.SpawnLeaseWorker", **FAST)
    wait_for(lambda: starts(log), timeout=20, what="the job to start")
    horse = starts(log)[0]
    os.kill(worker.pid, signal.SIGSTOP)  # frozen: it renews nothing, and stays alive
    try:
        # the horse reads the deadline the worker no longer moves, and ends itself
        wait_for(lambda: not pid_alive(horse), timeout=5, what="the spawned horse to fence itself")
    finally:
        os.kill(worker.pid, signal.SIGCONT)


@spawn_only
def test_spawn_worker_without_the_spawn_parts_is_refused_in_one_line(
    redis_url: str, procs: Processes
) -> None:
    procs_dir = Path(procs.log_dir)
    (procs_dir / "hand_spawn.py").write_text(
        "from rq.worker import SpawnWorker\nfrom rq_emq import LeaseWorker\n\n\n"
        "class HandSpawn(LeaseWorker, SpawnWorker):\n    pass\n"
    )
    env = procs.env(PYTHONPATH=f"{procs_dir}{os.pathsep}{procs.env()['PYTHONPATH']}", **FAST)
    cmd = [RQ_BIN, "worker", "-w", "hand_spawn.HandSpawn", "--url", redis_url, "--burst", "default"]
    worker = procs.start(cmd, env=env, name="worker")
    assert worker.wait(timeout=60) == 1
    assert refusal(procs.log(worker)).endswith("use rq_emq.lease_worker(SpawnWorker)")


@pytest.mark.skipif(not HAS_SPAWN or RQ_3, reason="RQ 2.x with a SpawnWorker only")
def test_spawn_lease_worker_on_rq_2_is_refused_in_one_line(redis_url: str, procs: Processes) -> None:
    """RQ 2's spawned horse is started differently: it would run without its lease's
    fence, so the worker refuses to start rather than run jobs unfenced."""
    cmd = [RQ_BIN, "worker", "-w", "rq_emq.SpawnLeaseWorker", "--url", redis_url, "--burst", "default"]
    worker = procs.start(cmd, env=procs.env(**FAST), name="worker")
    assert worker.wait(timeout=60) == 1
    assert "need RQ 3" in refusal(procs.log(worker))
