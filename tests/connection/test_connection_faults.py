"""Workers whose Redis connections break for a moment (a network blip, a proxy restart,
``CLIENT KILL``): found by the chaos soak, each case kept here as a specification."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from helpers import FAST, status
from jobs import runs
from procs import Processes, blocked_clients, wait_for
from rq import Queue
from rq.job import Job

from soak.faults import redis_addresses
from soak.proxy import TcpProxy

pytestmark = pytest.mark.slow

# A lease long enough that the blip never lets it lapse: what is tested is the blip alone.
STEADY = {"RQ_EMQ_LEASE_MS": "5000", "RQ_EMQ_RENEW_INTERVAL_MS": "200", "RQ_EMQ_SWEEP_INTERVAL_MS": "313"}


@pytest.fixture
def proxy(redis_server: object) -> Iterator[TcpProxy]:
    port = int(redis_server.url.rsplit(":", 1)[1].split("/")[0])  # type: ignore[attr-defined]
    tcp = TcpProxy(port).start()
    yield tcp
    tcp.close()


def test_a_job_that_ends_while_its_worker_is_cut_off_for_a_moment_finishes_once_and_the_worker_lives(
    r: redis.Redis, procs: Processes, tmp_path: Path, proxy: TcpProxy
) -> None:
    log = str(tmp_path / "runs.log")
    job = Queue(connection=r).enqueue("jobs.sleep_and_record", log, 1.0, job_timeout=30)
    worker = procs.worker(proxy.url, **STEADY)
    wait_for(lambda: runs(log), timeout=15, what="the job to start")
    time.sleep(0.6)
    proxy.cut("reset")  # live connections dropped, new ones refused: the job ends in the cut
    wait_for(lambda: len(runs(log)) == 2, timeout=5, what="the job function to return")
    time.sleep(0.5)
    proxy.heal()
    wait_for(lambda: status(r, job.id) == "finished", timeout=15, what="the job to finish")
    assert [line.split()[0] for line in runs(log)] == ["start", "end"]
    time.sleep(0.5)
    assert worker.poll() is None, procs.log(worker)
    assert "unhandled exception" not in procs.log(worker)


def _horse_cut_off_as_it_starts(
    r: redis.Redis, procs: Processes, proxy: TcpProxy, log: str, cut_s: float, **lease_env: str
) -> None:
    """A worker whose horse gets no connection to Redis for ``cut_s`` as its job starts;
    the job must end finished, run once, and the worker live on."""
    worker = procs.worker(proxy.url, **lease_env)
    # A job run first, so that the worker has opened every connection a run needs (its
    # wait, take, lock manager, finish): a worker still starting when the cut came could
    # not take the job at all on a loaded host (seen under -n 4), or lost its renewals.
    warm_up = Queue(connection=r).enqueue("jobs.sleep_and_record", log + ".warm-up", 0.0, job_timeout=30)
    wait_for(lambda: status(r, warm_up.id) == "finished", timeout=30, what="the warm-up job")
    # back in its wait, on its work connection again (the one the horse handed back, or opened
    # anew after a horse that could not), which the forked horse is lent: a horse opens none
    # of its own, and one that did (a pool the worker cannot lend from) would get none here
    wait_for(lambda: blocked_clients(r, "blmove") == 1, timeout=30, what="the worker waiting again")
    proxy.cut("new")
    job = Queue(connection=r).enqueue("jobs.sleep_and_record", log, 0.2, job_timeout=30)
    wait_for(lambda: r.hget(f"rq:job:{job.id}", "emq_attempts") == b"1", timeout=10, what="the take")
    time.sleep(cut_s)
    proxy.heal()
    wait_for(lambda: status(r, job.id) in ("finished", "failed"), timeout=20, what="the job to end")
    # not failed with the horse's ConnectionError
    assert status(r, job.id) == "finished", r.hget(f"rq:job:{job.id}", "exc_info")
    assert [line.split()[0] for line in runs(log)] == ["start", "end"]
    assert worker.poll() is None, procs.log(worker)


def test_a_horse_that_cannot_reach_redis_for_a_moment_as_it_starts_runs_the_job_once(
    r: redis.Redis, procs: Processes, tmp_path: Path, proxy: TcpProxy
) -> None:
    _horse_cut_off_as_it_starts(r, procs, proxy, str(tmp_path / "runs.log"), 0.5, **STEADY)


def test_a_horse_cut_off_for_longer_than_its_lease_as_it_starts_hands_the_job_back_unfailed(
    r: redis.Redis, procs: Processes, tmp_path: Path, proxy: TcpProxy
) -> None:
    """Found by the long soak: the horse gave up preparing after a lease of trying, RQ
    failed the job with the ConnectionError, and a job that never ran was failed."""
    # 1.6 leases: past the horse's lease of trying. The lease is 2 s (it was 1 s): the same
    # ratio with twice the room for a host's scheduling delays. At 1 s it failed the job now
    # and then in CI: most likely a horse that fenced itself before its lease was marked
    # lost, whose job RQ then failed through the fence (fixed in horse_crash; its own test
    # is test_horse_crash's "stopped trusting the lease")
    lease_s = 2.0
    short = {"RQ_EMQ_LEASE_MS": "2000", "RQ_EMQ_RENEW_INTERVAL_MS": "300", "RQ_EMQ_SWEEP_INTERVAL_MS": "500"}
    _horse_cut_off_as_it_starts(r, procs, proxy, str(tmp_path / "runs.log"), 1.6 * lease_s, **short)


def test_a_finish_keeps_trying_for_as_long_as_the_lease_would_last(
    r: redis.Redis, procs: Processes, tmp_path: Path, proxy: TcpProxy
) -> None:
    # Redis out of reach for 1.9 s of a 3 s lease (trusted locally for 2.7 s) as the job
    # ends (a restart can take that long): the horse must not give up while its lease
    # could still be alive
    log = str(tmp_path / "runs.log")
    job = Queue(connection=r).enqueue("jobs.sleep_and_record", log, 1.0, job_timeout=30)
    worker = procs.worker(proxy.url, RQ_EMQ_LEASE_MS="3000", RQ_EMQ_RENEW_INTERVAL_MS="200")
    wait_for(lambda: runs(log), timeout=15, what="the job to start")
    time.sleep(0.8)
    proxy.cut("reset")
    wait_for(lambda: len(runs(log)) == 2, timeout=5, what="the job function to return")
    time.sleep(1.9)
    proxy.heal()
    wait_for(lambda: status(r, job.id) in ("finished", "failed"), timeout=15, what="the job to end")
    assert status(r, job.id) == "finished"
    assert [line.split()[0] for line in runs(log)] == ["start", "end"]
    assert worker.poll() is None, procs.log(worker)


def test_a_worker_that_loses_redis_for_a_moment_after_a_job_keeps_working(
    r: redis.Redis, procs: Processes, tmp_path: Path, proxy: TcpProxy
) -> None:
    log = str(tmp_path / "runs.log")
    worker = procs.worker(proxy.url, name="blip-worker", **STEADY)
    job = Queue(connection=r).enqueue("jobs.sleep_and_record", log, 1.0, job_timeout=30)
    wait_for(lambda: runs(log), timeout=15, what="the job to start")
    # the worker process's connections are dropped and it cannot open others for a moment
    # (under RQ 3 its horse's own connection lives on and finishes the job at once)
    proxy.cut("new")
    assert proxy.drop(set(redis_addresses([worker.pid], proxy.port))) >= 1
    time.sleep(1.5)  # the job ends in the cut
    proxy.heal()
    wait_for(lambda: status(r, job.id) == "finished", timeout=10, what="the job to finish")
    second = Queue(connection=r).enqueue("jobs.sleep_and_record", log, 0.1, job_timeout=30)
    wait_for(lambda: status(r, second.id) in ("finished", "failed"), timeout=15, what="the next job")
    assert status(r, second.id) == "finished"
    assert worker.poll() is None and "unhandled exception" not in procs.log(worker), procs.log(worker)


def test_a_failure_whose_outcome_meets_a_blip_is_written_once_not_dropped(
    r: redis.Redis, procs: Processes, tmp_path: Path
) -> None:
    """RQ 3's failure handler swallows errors of its pipeline and RQ 2 runs it twice, the
    first under suppress(ConnectionError): either way the blip must reach the retry, and
    the job must end failed with its own exception, having run once."""
    log = str(tmp_path / "runs.log")
    job = Queue(connection=r).enqueue("jobs.sleep_record_and_fail", log, 0.1, job_timeout=30)
    url = r.connection_pool.connection_kwargs
    worker = procs.worker(
        f"redis://{url['host']}:{url['port']}/0",
        burst=True,
        worker_class="worker_classes.BlipAtFailureLeaseWorker",
        EMQ_TEST_BLIP_MARKER=str(tmp_path / "blips"),
        **FAST,
    )
    assert worker.wait(timeout=20) == 0, procs.log(worker)
    time.sleep(1.5)  # a dropped outcome would let the lease lapse and the job be recovered
    assert status(r, job.id) == "failed"
    results = Job.fetch(job.id, connection=r).results()
    assert any("planned failure" in (result.exc_string or "") for result in results)
    assert [line.split()[0] for line in runs(log)] == ["start", "end"]
    assert r.zscore("emq:{default}:leases", job.id) is None and r.llen("rq:queue:default") == 0
    assert (tmp_path / "blips").read_text() == "blip\n"  # the blip happened, once
    assert "failed to persist" not in procs.log(worker)  # RQ's swallowed traceback, hidden


def test_idle_workers_on_one_queue_and_on_several_live_through_redis_restarts_and_take_the_next_job(
    own_server: object, procs: Processes, tmp_path: Path
) -> None:
    """Idle `rq worker`s (one queue: RQ's BLMOVE; several: the take's polling) whose
    Redis is SIGKILLed and restarted empty (no scripts, no worker registration) wait for
    it wherever their loop is (the dequeue, the `rq suspend` check, the maintenance: each
    ended `rq worker` once, found by the soak), and then take and finish the next job.
    (One test for both queue layouts, on one server: it was one per layout.)"""
    url = own_server.url  # type: ignore[attr-defined]
    layouts = {"one-queue": ("solo",), "several-queues": ("high", "default", "low")}
    workers = {name: procs.worker(url, *queues, name=name, **STEADY) for name, queues in layouts.items()}
    client = redis.Redis.from_url(url)
    wait_for(lambda: client.scard("rq:workers") == 2, timeout=30, what="the workers to register")
    for down_s in (1.2, 0.3, 2.5):  # different points of the idle loop meet the restart
        own_server.kill()  # type: ignore[attr-defined]
        time.sleep(down_s)
        own_server.restart()  # type: ignore[attr-defined]
        time.sleep(0.5)
        for worker in workers.values():
            assert worker.poll() is None, procs.log(worker)
    client = redis.Redis.from_url(url)
    for name, queues in layouts.items():
        log = str(tmp_path / f"runs-{name}.log")
        job = Queue(queues[-1], connection=client).enqueue("jobs.sleep_and_record", log, 0.1, job_timeout=30)
        wait_for(lambda job=job: status(client, job.id) == "finished", timeout=60, what=f"{name}'s job")
        assert [line.split()[0] for line in runs(log)] == ["start", "end"]
        assert client.hget(f"rq:job:{job.id}", "worker_name") == name.encode()
    for worker in workers.values():
        assert worker.poll() is None, procs.log(worker)
        assert "unhandled exception" not in procs.log(worker).lower()
