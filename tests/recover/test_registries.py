"""The registry classes: wherever RQ's started-registry cleanup runs through them (``rq
info``, a worker's maintenance, django-rq), a job that holds a lease is left to the sweep,
however long its worker has been dead; a job without one (a stock worker's) keeps RQ's
handling. Real Redis, real ``rq`` processes, real SIGKILLs."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import redis
import rq
from helpers import FAST, started_members, status, wait_status
from jobs import runs
from procs import RQ_BIN, TESTS_DIR, Processes, pid_alive, unseen, wait_for
from rq import Queue, Retry
from rq.job import Job
from rq.registry import BaseRegistry, FailedJobRegistry, StartedJobRegistry

import rq_emq
from rq_emq.keys import PINNED_FIELD, QueueKeys
from rq_emq.recover import registries
from rq_emq.recover.registries import LeaseQueue, LeaseStartedJobRegistry, lease_queue_class
from rq_emq.recover.sweep import Sweeper
from rq_emq.settings import LeaseSettings

pytestmark = [pytest.mark.slow, pytest.mark.rq_versions]
Q = QueueKeys("default")
HOUR = 3600.0


def starts(log: str) -> list[int]:
    return [int(line.split()[1]) for line in runs(log) if line.startswith("start")]


def ends(log: str) -> int:
    return sum(line.startswith("end") for line in runs(log))


def kill_mid_job(
    r: redis.Redis,
    procs: Processes,
    url: str,
    log: str,
    queue: str = "default",
    worker_class: str = "rq_emq.LeaseWorker",
) -> None:
    """Start a worker, wait until its horse runs the job logging to ``log``, SIGKILL the
    worker's process group and the horse (RQ puts the horse in a group of its own)."""
    before = len(starts(log))
    worker = procs.worker(url, queue, worker_class=worker_class, **FAST)
    wait_for(lambda: len(starts(log)) > before, timeout=20, what="the job to start")
    horse = starts(log)[-1]
    os.killpg(unseen(worker.pid), signal.SIGKILL)
    try:
        os.kill(horse, signal.SIGKILL)
    except ProcessLookupError:
        pass
    worker.wait(timeout=10)
    wait_for(lambda: not pid_alive(horse), timeout=10, what="the horse to die")


def dead_leased_job(r: redis.Redis, procs: Processes, url: str, log: str, queue: str = "default") -> Job:
    """A long job whose LeaseWorker was SIGKILLed mid-run, its lease lapsed, no sweep run
    (the job returns at once when it runs again)."""
    job = Queue(queue, connection=r).enqueue(
        "integration_jobs.slow_on_first_run", log, 120.0, job_timeout=300
    )
    kill_mid_job(r, procs, url, log, queue)
    wait_for(lambda: not r.exists(QueueKeys(queue).lock(job.id)), timeout=10, what="the lease to lapse")
    assert status(r, job.id) == "started" and r.zscore(QueueKeys(queue).leases, job.id) is not None
    return job


def outlived_grace(r: redis.Redis, queue: str = "default") -> None:
    """What the clock does to a dead worker's started-registry entries once the grace
    (lease + 2 sweeps + 60 s) is over: they fall due. Scored into the past here, so that
    cleanup running at the real time (``rq info``, a worker's maintenance) sees them due."""
    key = QueueKeys(queue).started
    for member in r.zrange(key, 0, -1):
        r.zadd(key, {member: time.time() - HOUR}, xx=True)
    r.delete(f"rq:clean_registries:{queue}")  # the dead worker's maintenance lock lapsed too


def failed(r: redis.Redis, job_id: str, queue: str = "default") -> bool:
    return job_id in FailedJobRegistry(queue, connection=r)


# -- 1. the crash, an hour without sweeper, cleanup, then a worker -------------------------


def test_a_dead_workers_leased_job_survives_cleanup_an_hour_later_and_finishes_once(
    r: redis.Redis, redis_url: str, procs: Processes, tmp_path: Path
) -> None:
    log = str(tmp_path / "runs.log")
    job = dead_leased_job(r, procs, redis_url, log)

    # no sweeper for an hour: cleanup as rq info and django-rq run it, an hour on
    LeaseQueue(connection=r).started_job_registry.cleanup(timestamp=time.time() + HOUR)
    assert status(r, job.id) == "started" and not failed(r, job.id)
    assert started_members(r, "default"), "the entry stays for the sweep to remove"

    # then a LeaseWorker starts: its sweep recovers the job, which runs again and finishes
    worker = procs.worker(redis_url, **FAST)
    wait_status(r, job.id, "finished", timeout=90)
    assert len(starts(log)) == 2 and ends(log) == 1
    assert not failed(r, job.id) and started_members(r, "default") == []
    (result,) = Job.fetch(job.id, connection=r).results()
    assert result.type == result.Type.SUCCESSFUL
    worker.send_signal(signal.SIGTERM)
    worker.wait(timeout=15)


#: Stock cleanup in a process that never imported rq_emq, ``later_s`` seconds on.
STOCK_CLEANUP = """
import sys, time, redis
from rq.registry import StartedJobRegistry
client = redis.Redis.from_url(sys.argv[1])
StartedJobRegistry(sys.argv[2], connection=client).cleanup(timestamp=time.time() + float(sys.argv[3]))
assert not any(name.startswith("rq_emq") for name in sys.modules), "rq_emq was imported"
"""


def stock_cleanup(url: str, later_s: float, queue: str = "default") -> None:
    command = [sys.executable, "-c", STOCK_CLEANUP, url, queue, str(later_s)]
    done = subprocess.run(command, capture_output=True, timeout=60, cwd="/")
    assert done.returncode == 0, done.stderr.decode()


SPAWNING = ["rq_emq.SpawnLeaseWorker"] if int(rq.__version__.split(".")[0]) >= 3 else []


@pytest.mark.parametrize("worker_class", ["rq_emq.LeaseWorker", "rq_emq.SimpleLeaseWorker", *SPAWNING])
def test_every_worker_class_names_its_pinned_entry_on_the_job_hash(
    r: redis.Redis, redis_url: str, procs: Processes, tmp_path: Path, worker_class: str
) -> None:
    """The pin's member is what lets the sweep remove the entry once RQ's execution records
    have expired (an outage longer than their TTL): a spawned horse, which re-fetches its
    execution from Redis, names it as a forked or in-process one does."""
    log = str(tmp_path / "runs.log")
    job = Queue("default", connection=r).enqueue(
        "integration_jobs.slow_on_first_run", log, 120.0, job_timeout=300
    )
    worker = procs.worker(redis_url, worker_class=worker_class, **FAST)
    wait_for(lambda: len(starts(log)) == 1, timeout=30, what="the job to start")
    entries = started_members(r, "default")
    assert len(entries) == 1 and r.zscore(Q.started, entries[0]) == float("inf")
    assert (r.hget(f"rq:job:{job.id}", PINNED_FIELD) or b"").decode() == entries[0]
    os.killpg(unseen(worker.pid), signal.SIGKILL)
    worker.wait(timeout=10)


def test_no_stock_process_fails_a_leased_job_however_long_the_fleet_is_down(
    r: redis.Redis, redis_url: str, procs: Processes, tmp_path: Path
) -> None:
    """The lever every process reads is the started-registry score: a leased run's entry is
    pinned at +inf (RQ's own "never expires"), so stock cleanup in a process that never
    imported rq_emq (and stock ``rq info``, with no queue class) never finds it due. Before,
    the entry fell due a minute after the lease and stock cleanup failed the job."""
    log = str(tmp_path / "runs.log")
    job = dead_leased_job(r, procs, redis_url, log)
    assert [score for _, score in r.zrange(Q.started, 0, -1, withscores=True)] == [float("inf")]
    stock_cleanup(redis_url, later_s=10 * HOUR)
    rq_info(redis_url)
    assert status(r, job.id) == "started" and not failed(r, job.id)
    # hours on, RQ's own records of the run have expired (their TTL is minutes): the pin
    # is found through the job hash
    for key in [*r.scan_iter(f"rq:execution:{job.id}:*"), f"rq:executions:{job.id}"]:
        r.delete(key)

    worker = procs.worker(redis_url, **FAST)
    wait_status(r, job.id, "finished", timeout=90)
    assert len(starts(log)) == 2 and ends(log) == 1
    assert started_members(r, "default") == [], "the recovery removed the pinned entry"
    assert r.hget(f"rq:job:{job.id}", PINNED_FIELD) is None
    worker.send_signal(signal.SIGTERM)
    worker.wait(timeout=15)


def rollback(redis_url: str, *queues: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "rq_emq.operate.cli", "rollback", "--url", redis_url, *queues],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_rollback_hands_a_dead_workers_leased_job_to_stock_handling(
    r: redis.Redis, redis_url: str, procs: Processes, tmp_path: Path
) -> None:
    """A fleet moved back to stock workers: ``rq-emq rollback`` unpins the run's entry and
    drops our bookkeeping, so stock cleanup treats the job as stock RQ treats an abandoned
    one, and nothing of ours is left to act on it."""
    job = dead_leased_job(r, procs, redis_url, str(tmp_path / "runs.log"))
    done = rollback(redis_url, "default")
    assert done.returncode == 0, done.stderr
    assert "1 started run(s) handed to stock cleanup" in done.stdout
    assert r.zcard(Q.leases) == 0 and r.hget(f"rq:job:{job.id}", "emq_token") is None
    stock_cleanup(redis_url, later_s=1)
    assert failed(r, job.id) and status(r, job.id) == "failed"
    assert "AbandonedJobError" in (Job.fetch(job.id, connection=r).exc_info or "")


def test_rollback_leaves_a_live_lease_and_says_so(
    r: redis.Redis, redis_url: str, procs: Processes, tmp_path: Path
) -> None:
    log = str(tmp_path / "runs.log")
    job = Queue(connection=r).enqueue("jobs.sleep_and_record", log, 30.0, job_timeout=120)
    worker = procs.worker(redis_url, **FAST)
    wait_for(lambda: starts(log), timeout=20, what="the job to start")
    done = rollback(redis_url, "default")
    assert done.returncode == 1 and "still alive" in done.stderr, (done.stdout, done.stderr)
    assert "1 lease(s) still alive" in done.stdout
    assert r.zscore(Q.leases, job.id) is not None and status(r, job.id) == "started"
    assert [score for _, score in r.zrange(Q.started, 0, -1, withscores=True)] == [float("inf")]
    worker.kill()


def test_rollback_puts_back_jobs_taken_or_moved_but_never_started(r: redis.Redis) -> None:
    from rq_emq.intake.take import Taker
    from rq_emq.recover.rollback import release_to_rq

    queue = Queue(connection=r)
    taken_job, moved_job = queue.enqueue("jobs.noop"), queue.enqueue("jobs.noop")
    taken = Taker(r, "w", LeaseSettings(lease_ms=2_000)).take(["default"], timeout=None)
    assert taken is not None and taken.job_id == taken_job.id
    r.delete(Q.lock(taken_job.id))  # its worker died before the run started
    r.lmove(Q.rq_queue, Q.moving)  # another one died between its BLMOVE and its claim
    (released,) = release_to_rq(r, ["default"])
    assert (released.unpinned, released.requeued, released.alive) == (0, 2, 0)
    assert sorted(r.lrange(Q.rq_queue, 0, -1)) == sorted([taken_job.id.encode(), moved_job.id.encode()])
    assert r.llen(Q.moving) == 0 and r.zcard(Q.leases) == 0
    assert status(r, taken_job.id) == "queued" and r.hget(f"rq:job:{taken_job.id}", "emq_token") is None


# -- 2. mixed fleet ------------------------------------------------------------------------


@pytest.mark.parametrize("retry", [False, True], ids=["abandoned", "with-retry"])
def test_in_a_mixed_fleet_a_stock_workers_job_keeps_rqs_handling(
    r: redis.Redis, redis_url: str, procs: Processes, tmp_path: Path, retry: bool
) -> None:
    stock_log, lease_log = str(tmp_path / "stock.log"), str(tmp_path / "lease.log")
    queue = Queue(connection=r)
    options = {"retry": Retry(max=1)} if retry else {}
    stock_job = queue.enqueue("jobs.sleep_and_record", stock_log, 60.0, job_timeout=300, **options)
    kill_mid_job(r, procs, redis_url, stock_log, worker_class="rq.Worker")
    leased_job = dead_leased_job(r, procs, redis_url, lease_log)
    assert r.zscore(Q.leases, stock_job.id) is None  # taken without a lease

    LeaseQueue(connection=r).started_job_registry.cleanup(timestamp=time.time() + HOUR)

    # the leased job is left to the sweep; the stock worker's job got what RQ gives it
    assert status(r, leased_job.id) == "started" and not failed(r, leased_job.id)
    if retry:
        assert status(r, stock_job.id) == "queued" and stock_job.id in queue.get_job_ids()
    else:
        assert status(r, stock_job.id) == "failed" and failed(r, stock_job.id)
        assert "AbandonedJobError" in (Job.fetch(stock_job.id, connection=r).exc_info or "")


# -- 3. rq info ----------------------------------------------------------------------------


def rq_info(redis_url: str, *args: str) -> str:
    done = subprocess.run(
        [RQ_BIN, "info", "--url", redis_url, *args, "default"],
        capture_output=True,
        timeout=60,
        cwd=str(TESTS_DIR),  # where the job modules are, as for the workers
    )
    assert done.returncode == 0, done.stderr.decode()
    return done.stdout.decode()


def test_rq_info_with_the_lease_queue_class_does_not_fail_a_dead_workers_leased_job(
    r: redis.Redis, redis_url: str, procs: Processes, tmp_path: Path
) -> None:
    job = dead_leased_job(r, procs, redis_url, str(tmp_path / "runs.log"))
    outlived_grace(r)
    out = rq_info(redis_url, "--queue-class", "rq_emq.LeaseQueue")
    assert "1 executing" in out, out
    assert status(r, job.id) == "started" and not failed(r, job.id)
    # kept: its entry is out of the due range, so the next stock reader cannot fail it either
    (score,) = [s for _, s in r.zrange(Q.started, 0, -1, withscores=True)]
    assert score > time.time()
    # the same once more, due again, through RQ's own Queue
    outlived_grace(r)
    rq_info(redis_url)
    assert failed(r, job.id)


# -- 4. workers given a queue class --------------------------------------------------------


@pytest.mark.parametrize(
    "worker_class,queue_class,served_by",
    [
        ("rq_emq.LeaseWorker", "rq_emq.LeaseQueue", "LeaseQueue"),
        ("rq_emq.LeaseWorker", "worker_classes.RecordingQueue", "RecordingQueue"),
        ("rq.Worker", "rq_emq.LeaseQueue", "LeaseQueue"),
    ],
)
def test_a_worker_starting_after_a_long_outage_does_not_fail_leased_jobs_in_its_maintenance(
    r: redis.Redis,
    redis_url: str,
    procs: Processes,
    tmp_path: Path,
    worker_class: str,
    queue_class: str,
    served_by: str,
) -> None:
    log, queue_log = str(tmp_path / "runs.log"), str(tmp_path / "queue.log")
    job = dead_leased_job(r, procs, redis_url, log)
    outlived_grace(r)
    # the first thing a worker does is its maintenance, RQ's cleanup among it
    worker = procs.worker(
        redis_url,
        worker_class=worker_class,
        args=("--queue-class", queue_class),
        EMQ_TEST_QUEUE_LOG=queue_log,
        **FAST,
    )
    if worker_class == "rq_emq.LeaseWorker":
        # its maintenance runs before it takes a job: then its sweep recovers this one
        wait_status(r, job.id, "finished", timeout=90)
        assert len(starts(log)) == 2 and ends(log) == 1
    else:
        wait_for(
            lambda: "cleaning registries for queue" in procs.log(worker).lower(),
            timeout=20,
            what="its maintenance",
        )
        assert status(r, job.id) == "started"
    assert not failed(r, job.id), procs.log(worker)
    if queue_class.startswith("worker_classes"):  # the user's own class, as given
        assert runs(queue_log)[0] == f"maintenance default {served_by} True"


def test_a_lease_worker_keeps_the_queue_class_it_is_given(r: redis.Redis) -> None:
    """As RQ's own workers do (RQ's suite checks ``worker.queue_class is X``): the pin, not
    a queue class, keeps stock cleanup off leased jobs. ``lease_queue_class`` still composes
    the lease views onto any class, for tools."""
    from worker_classes import RecordingQueue

    given = [RecordingQueue("a", connection=r), "b"]
    worker = rq_emq.LeaseWorker(given, connection=r, queue_class=RecordingQueue)
    assert worker.queue_class is RecordingQueue
    assert [type(q) for q in worker.queues] == [RecordingQueue, RecordingQueue]
    assert worker.queues[0] is given[0]
    # this process's stock registry got the lease-aware cleanup (the second line)
    assert StartedJobRegistry.get_expired_job_ids is LeaseStartedJobRegistry.get_expired_job_ids
    composed = lease_queue_class(RecordingQueue)
    assert issubclass(composed, RecordingQueue) and lease_queue_class(RecordingQueue) is composed
    assert isinstance(composed("c", connection=r).started_job_registry, LeaseStartedJobRegistry)
    assert lease_queue_class(LeaseQueue) is LeaseQueue and lease_queue_class(Queue) is LeaseQueue


# -- 5. django-rq ---------------------------------------------------------------------------


def test_django_rq_with_the_lease_queue_class_keeps_a_dead_workers_leased_job(
    r: redis.Redis, redis_url: str, procs: Processes, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from django_rq_viewer import DjangoRQViewer

    viewer = DjangoRQViewer(redis_url)
    from django.conf import settings

    # django-rq's pages build their queues by index, which reads the QUEUE_CLASS of its RQ
    # setting (a QUEUE_CLASS inside one queue's RQ_QUEUES entry reaches only get_queue(name))
    monkeypatch.setattr(settings, "RQ", {"QUEUE_CLASS": "rq_emq.LeaseQueue"}, raising=False)
    job = dead_leased_job(r, procs, redis_url, str(tmp_path / "runs.log"))
    outlived_grace(r)
    # its statistics page runs RQ's maintenance (clean_registries) and counts; its started
    # page counts (cleanup) and lists: both build RQ's own StartedJobRegistry
    assert viewer.statistics()["started_jobs"] == 1
    assert job.id in viewer.listed("started")
    assert viewer.job_status(job.id) == "started"
    assert status(r, job.id) == "started" and not failed(r, job.id)
    import django_rq

    assert isinstance(django_rq.get_queue("default"), LeaseQueue)


# -- 6. the lease state as registries -------------------------------------------------------


def test_leased_and_stalled_registries_follow_the_lease_state(
    r: redis.Redis, redis_url: str, procs: Processes, tmp_path: Path
) -> None:
    log = str(tmp_path / "runs.log")
    queue = LeaseQueue(connection=r)
    leased, stalled = queue.leased_job_registry, queue.stalled_job_registry
    assert (leased.key, stalled.key, leased.name) == (Q.leases, Q.stalled, "default")
    job = queue.enqueue("jobs.sleep_and_record", log, 60.0, job_timeout=300)
    worker = procs.worker(redis_url, **FAST)
    wait_for(lambda: starts(log), timeout=20, what="the job to start")

    # in flight under a live lease
    assert leased.count == len(leased) == 1 and leased.get_job_ids() == [job.id]
    assert job.id in leased and job in leased and "other" not in leased
    assert stalled.count == 0 and job.id not in stalled

    # the worker dies: a sweep marks the job, which stays leased until the next sweep
    os.killpg(unseen(worker.pid), signal.SIGKILL)
    worker.wait(timeout=10)
    wait_for(lambda: not r.exists(Q.lock(job.id)), timeout=10, what="the lease to lapse")
    settings = LeaseSettings(lease_ms=400, renew_interval_ms=100, sweep_interval_ms=157)
    sweeper = Sweeper(r, ["default"], settings)
    assert sweeper.sweep("default", mode="force").marked == [job.id]
    assert stalled.get_job_ids() == [job.id] and job in stalled and len(stalled) == 1
    assert job.id in leased

    # recovered: in neither
    time.sleep(sweeper.grace_ms / 1000 + 0.05)
    assert sweeper.sweep("default", mode="force").requeued == [job.id]
    assert leased.count == stalled.count == 0 and job.id not in leased and job.id not in stalled


def test_lease_state_registries_page_like_rqs(r: redis.Redis) -> None:
    r.zadd(Q.leases, {f"job-{i}": 1000 + i for i in range(5)})
    leased = LeaseQueue(connection=r).leased_job_registry
    assert leased.get_job_ids(1, 2) == ["job-1", "job-2"]
    assert leased.get_job_ids(0, 1, desc=True) == ["job-4", "job-3"]
    assert leased.get_job_count(cleanup=False) == 5
    leased.cleanup()  # nothing to clean: only the lease scripts change these sets
    assert leased.count == 5


# -- the cleanup's mechanics ---------------------------------------------------------------


def seed_started(r: redis.Redis, leased: list[str], unleased: list[str], score: float) -> None:
    """Started-registry entries with their jobs: ``leased`` ones in the lease index (half of
    them with a live lock instead, the holder's view of the same lease)."""
    for n, job_id in enumerate(leased + unleased):
        job = Job.create("jobs.noop", connection=r, id=job_id, origin="default")
        job.save()
        r.hset(job.key, "status", "started")
        r.zadd(Q.started, {f"{job_id}:exec{n}": score})
    for n, job_id in enumerate(leased):
        if n % 2:
            r.set(Q.lock(job_id), "token", px=60_000)
        else:
            r.zadd(Q.leases, {job_id: 1})


def test_cleanup_checks_leases_in_one_script_call_per_batch_and_keeps_only_leased_entries(
    r: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(registries, "KEEP_BATCH", 3)
    leased = [f"leased-{i}" for i in range(5)]
    others = [f"other-{i}" for i in range(4)]
    seed_started(r, leased, others, time.time() - 10)
    calls: list[int] = []
    script = registries.scripts.load("keep_leased_started")
    original = type(script).__call__

    def counting(self: object, client: redis.Redis, keys: list[str], args: list[object]) -> object:
        calls.append(1)
        return original(self, client, keys, args)  # type: ignore[arg-type]

    monkeypatch.setattr(type(script), "__call__", counting)
    registry = LeaseQueue(connection=r).started_job_registry
    # what stock cleanup is handed: the others only, parsed as RQ parses them
    expired = registry.get_expired_job_ids()
    assert sorted(job_id.split(":")[0] for job_id in expired) == others
    assert len(calls) == 4  # 9 due entries, 3 per call: 3 full windows and the empty last
    # the leased entries now lie past the cutoff (a minute on), the others did not move
    scores = dict((m.decode().split(":")[0], s) for m, s in r.zrange(Q.started, 0, -1, withscores=True))
    assert all(scores[j] > time.time() + 50 for j in leased)
    assert all(scores[j] < time.time() for j in others)


def test_a_lease_queue_gives_rqs_own_started_registry_the_same_cleanup(r: redis.Redis) -> None:
    """RQ's clean_registries() (rq info, django-rq, workers) builds RQ's class itself."""
    seed_started(r, ["leased-0"], ["other-0"], time.time() - 10)
    stock = StartedJobRegistry("default", connection=r)
    assert [j.split(":")[0] for j in stock.get_expired_job_ids()] == ["leased-0", "other-0"]
    LeaseQueue(connection=r)
    assert [j.split(":")[0] for j in stock.get_expired_job_ids()] == ["other-0"]
    registries.unpatch_stock_started_registry()
    assert StartedJobRegistry.get_expired_job_ids is BaseRegistry.get_expired_job_ids


def test_count_and_job_ids_are_rqs_after_a_cleanup_that_keeps_leased_entries(r: redis.Redis) -> None:
    seed_started(r, ["leased-0", "leased-1"], ["other-0"], time.time() - 10)
    registry = LeaseQueue(connection=r).started_job_registry
    # RQ's count runs cleanup: RQ fails the job without a lease and keeps the leased ones
    assert registry.count == 2 and len(registry) == 2
    assert failed(r, "other-0") and not failed(r, "leased-0") and not failed(r, "leased-1")
    # and reads the rest as RQ does (RQ 2.0's `in` compares a job id with `<id>:<execution>`)
    stock = StartedJobRegistry("default", connection=r)
    assert registry.get_job_ids() == stock.get_job_ids(cleanup=False) and len(stock.get_job_ids()) == 2
    for job_id in ("leased-0", "other-0"):
        assert (job_id in registry) == (job_id in stock)
