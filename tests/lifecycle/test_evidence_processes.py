"""Evidence, not absence (issue 33, rule 1), with real ``rq worker`` processes: "RQ ended
it" is read from where RQ put the job, never from one changed field. A web process that
fetched a job while it was queued and calls ``job.save()`` while a worker runs it writes
``status=queued`` back, and puts the job nowhere: stock RQ finishes the job all the same,
and so must every lease worker (the run's outcome written, nothing left pinned)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import redis
from helpers import STEADY, started_members, wait_status
from jobs import run_spans, runs
from procs import Processes, wait_for
from redis_server import RedisServer
from rq import Queue
from rq.job import Job
from rq.registry import FinishedJobRegistry
from rq.worker import Worker

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("worker_class", ["rq_emq.LeaseWorker", "rq_emq.SimpleLeaseWorker", "rq.Worker"])
def test_a_web_process_saving_a_stale_copy_of_a_running_job_loses_nothing(
    r: redis.Redis, redis_url: str, procs: Processes, tmp_path: Path, worker_class: str
) -> None:
    queue = Queue("q", connection=r)
    log = str(tmp_path / "runs.log")
    job = queue.enqueue("jobs.sleep_and_record", log, 1.5, job_timeout=60)
    stale = Job.fetch(job.id, connection=r)  # a web process reads the job while it is queued
    procs.worker(redis_url, "q", worker_class=worker_class, **STEADY)
    wait_for(lambda: runs(log), timeout=20, what="the run to start")
    stale.meta["seen_by"] = "web"
    stale.save()  # the whole hash, as read: status queued, written over the run's `started`
    assert Job.fetch(job.id, connection=r).get_status() == "queued"
    wait_status(r, job.id, "finished", timeout=20)
    done = Job.fetch(job.id, connection=r)
    assert done.return_value() == "done" and done.meta == {"seen_by": "web"}
    assert job.id in FinishedJobRegistry(queue=queue).get_job_ids()
    assert job.id not in queue.get_job_ids() and [line.split()[0] for line in runs(log)] == ["start", "end"]
    assert [m for m in started_members(r, "q") if m.startswith(job.id)] == []  # nothing left pinned
    assert not r.exists(f"emq:{{q}}:{job.id}:lock") and r.zscore("emq:{q}:leases", job.id) is None


def test_a_stray_copy_of_a_stock_workers_run_is_never_run_beside_it(
    r: redis.Redis, redis_url: str, procs: Processes, tmp_path: Path
) -> None:
    """A mixed fleet: one job id pushed twice (a resent push, RQ 3's fan-in enqueueing a
    dependent twice). A stock worker runs the first entry; a lease worker finds the second
    while that run goes on. ``started`` with the stock run's execution in RQ's started
    registry is where RQ put the job: the copy is dropped, never run beside it."""
    queue = Queue("q", connection=r)
    log = str(tmp_path / "runs.log")
    job = queue.enqueue("jobs.sleep_and_record", log, 3.0, job_timeout=60)
    r.rpush(queue.key, job.id)  # the copy
    procs.worker(redis_url, "q", worker_class="rq.Worker", burst=True)
    wait_for(lambda: runs(log), timeout=20, what="the stock run to start")
    ours = procs.worker(redis_url, "q", burst=True, **STEADY)
    assert ours.wait(timeout=30) == 0  # found the copy, dropped it, and left
    assert r.llen(queue.key) == 0 and [line.split()[0] for line in runs(log)] == ["start"]
    wait_status(r, job.id, "finished", timeout=20)
    assert [line.split()[0] for line in runs(log)] == ["start", "end"]  # one run, the stock one
    assert "stray copy" in procs.log(ours)


@pytest.mark.parametrize("worker_class", ["rq_emq.LeaseWorker", "rq_emq.SimpleLeaseWorker"])
def test_after_redis_lost_its_data_the_old_run_stops_before_the_resubmitted_job_runs_with_a_higher_token(
    own_server: RedisServer, procs: Processes, tmp_path: Path, worker_class: str
) -> None:
    """Redis restarts without persistence while a job runs, and the producer resubmits the
    job under its id (how users recover from such a restart). The renewal finds no hash, no
    owner, no index entry: that is a lost lease, not a settled one (only the holder's own
    finish settles it), so the old run stops, and the new grant's fencing token is above
    the old one's. Before: the old run went on beside the new for the rest of its length,
    both under token 1."""
    url = own_server.url
    r = redis.Redis.from_url(url)
    log = str(tmp_path / "runs.log")
    lease = {"RQ_EMQ_LEASE_MS": "2000", "RQ_EMQ_RENEW_INTERVAL_MS": "200"}
    queue = Queue("q", connection=r)
    queue.enqueue("jobs.ticking_run", log, 8.0, 0.5, job_id="order-17", job_timeout=60)
    worker = procs.worker(url, "q", worker_class=worker_class, **lease)
    wait_for(lambda: len(runs(log)) > 2, timeout=20, what="the first run to tick")
    old_token = int(r.hget("rq:job:order-17", "emq_fence") or 0)
    own_server.restart()  # every key gone: the job, its lease, its index entry, its lock
    r = redis.Redis.from_url(url)
    wait_for(lambda: r.ping(), timeout=10, what="Redis back")
    time.sleep(5 * 0.2)  # renewals meet the empty Redis first (5 renew intervals), then the resubmission
    Queue("q", connection=r).enqueue("jobs.ticking_run", log, 8.0, 0.5, job_id="order-17", job_timeout=60)
    procs.worker(url, "q", worker_class=worker_class, **lease)  # a second worker may take it
    wait_status(r, "order-17", "finished", timeout=40)
    spans = sorted(each_run(log))
    assert len(spans) == 2, spans
    (first_start, first_last), (second_start, _) = spans
    # the old run's last sign of life comes before the new one starts (no overlap), and
    # within a lease of the restart's first refused renewal (slack: the 8 s run's rest)
    assert first_last < second_start, f"overlap {first_last - second_start:.3f} s"
    assert first_last - first_start < 8.0 - 1.0
    assert int(r.hget("rq:job:order-17", "emq_fence") or 0) > old_token
    # a forking worker lives on; a SimpleLeaseWorker's stopped run ended its process
    assert worker.poll() == (1 if worker_class == "rq_emq.SimpleLeaseWorker" else None), procs.log(worker)


def each_run(log: str) -> list[tuple[float, float]]:
    """(start, last sign of life) of each run in a ``jobs.ticking_run`` log, a run being
    the lines of one pid from its ``start`` on (a SimpleLeaseWorker runs both in one pid)."""
    spans: list[tuple[float, float]] = []
    current: dict[str, int] = {}
    for line in runs(log):
        tag, pid, at = line.split()
        if tag == "start":
            current[pid] = len(spans)
            spans.append((float(at), float(at)))
        elif pid in current:
            start, _ = spans[current[pid]]
            spans[current[pid]] = (start, float(at))
    return spans


def _wait_for_a_renewal_of(r: redis.Redis, lock: str) -> None:
    """Until the lock's time to live rises between two reads a few ms apart: a renewal
    landed between them. A single first read is no baseline: read in the renewal's own
    millisecond it gives the whole lease, which no later read exceeds (199 of 200 reads
    right after a renewal gave 3000 of 3000), and the wait then timed out on a healthy
    worker."""

    def renewed_between_two_reads() -> bool:
        before = r.pttl(lock)
        time.sleep(0.005)
        return r.pttl(lock) > before

    wait_for(renewed_between_two_reads, timeout=5, interval=0.001, what="a renewal")


@pytest.mark.parametrize("worker_class", ["rq_emq.LeaseWorker", "rq_emq.SimpleLeaseWorker"])
@pytest.mark.parametrize("queues", [("q",), ("other", "q")])
def test_a_running_job_deleted_and_enqueued_again_runs_again_only_once_the_old_run_stopped(
    r: redis.Redis,
    redis_url: str,
    procs: Processes,
    tmp_path: Path,
    worker_class: str,
    queues: tuple[str, ...],
) -> None:
    """``job.delete()`` of a running job, then the same id enqueued again (issue 33, rule
    2). The old run's renewal finds its job hash gone (a vanished lease is lost) and stops
    it; the new take finds the old holder's lock still live and leaves the job in its queue
    until that lock is gone, so the two runs never overlap. Before: an idle worker took the
    new job at once and both ran until the old holder's next renewal (up to one renew
    interval: 145 ms measured at the default's tenth of a lease)."""
    queue = Queue("q", connection=r)
    log = str(tmp_path / "runs.log")
    lease = {"RQ_EMQ_LEASE_MS": "3000", "RQ_EMQ_RENEW_INTERVAL_MS": "300"}
    queue.enqueue("jobs.ticking_run", log, 8.0, 0.5, job_id="order-18", job_timeout=60)
    procs.worker(redis_url, *queues, worker_class=worker_class, **lease)
    wait_for(lambda: len(runs(log)) > 2, timeout=20, what="the first run to tick")
    # idle: takes the new job at once (on one queue from its BLMOVE, on two as the watcher;
    # a job held back is looked at again a moment later, its old run's end writing no queue)
    procs.worker(redis_url, *queues, worker_class=worker_class, **lease)
    wait_for(lambda: len(Worker.all(connection=r)) == 2, timeout=20, what="the second worker")
    time.sleep(0.5)  # the idle worker is waiting on the queue
    lock = "emq:{q}:order-18:lock"
    _wait_for_a_renewal_of(r, lock)  # just landed
    Job.fetch("order-18", connection=r).delete()  # a whole renew interval before the holder hears
    queue.enqueue("jobs.ticking_run", log, 8.0, 0.5, job_id="order-18", job_timeout=60)
    wait_status(r, "order-18", "finished", timeout=40)
    spans = sorted(each_run(log))
    assert len(spans) == 2, spans
    (_, first_last), (second_start, _) = spans
    overlap_ms = (first_last - second_start) * 1000
    print(f"overlap {overlap_ms:.0f} ms ({worker_class})")
    assert first_last < second_start, f"the runs overlapped for {overlap_ms:.0f} ms"


@pytest.mark.parametrize("how", ["pool", "thread"])
def test_a_simple_worker_whose_running_job_is_deleted_and_enqueued_again_ends_before_the_copy_runs(
    r: redis.Redis, redis_url: str, procs: Processes, tmp_path: Path, how: str
) -> None:
    """One ``SimpleLeaseWorker`` whose job works on threads (a ``ThreadPoolExecutor``, a
    ``Thread`` it joins); the job deleted and enqueued again under its id. The renewal
    finds the lease lost and interrupts the job, whose frame unwinds while its threads
    work on: the worker process ends (exit 1, for its supervisor to start it again), and
    the copy runs, on the other worker, only once its watchdog has seen it gone. Before,
    the same worker took the copy at once and the old run's threads ticked beside it."""
    queue = Queue("q", connection=r)
    log = str(tmp_path / "runs.log")
    lease = {"RQ_EMQ_LEASE_MS": "3000", "RQ_EMQ_RENEW_INTERVAL_MS": "300"}
    args = ("thread_jobs.threaded_run", log, 30.0, how, 0.3)
    queue.enqueue(*args, job_id="order-19", job_timeout=60)
    worker = procs.worker(redis_url, "q", worker_class="rq_emq.SimpleLeaseWorker", **lease)
    wait_for(lambda: len(runs(log)) > 3, timeout=20, what="the first run's threads to tick")
    procs.worker(redis_url, "q", worker_class="rq_emq.SimpleLeaseWorker", **lease)  # idle
    wait_for(lambda: len(Worker.all(connection=r)) == 2, timeout=20, what="the second worker")
    Job.fetch("order-19", connection=r).delete()
    queue.enqueue(*args, job_id="order-19", job_timeout=60)
    wait_status(r, "order-19", "finished", timeout=40)
    assert worker.wait(timeout=10) == 1, procs.log(worker)
    assert "ending the worker process" in procs.log(worker)
    spans = run_spans(log)
    assert sorted(spans) != [worker.pid] and len(spans) == 2, spans
    second_start = min(start for pid, (start, _) in spans.items() if pid != worker.pid)
    overlap_ms = (spans[worker.pid][1] - second_start) * 1000
    assert overlap_ms < 0, f"the old run's threads ticked {overlap_ms:.0f} ms into the copy's run"


@pytest.mark.parametrize("worker_class", ["rq_emq.LeaseWorker", "rq_emq.SimpleLeaseWorker"])
@pytest.mark.parametrize("again", ["enqueue_job of a fetched copy", "enqueue under its id"])
def test_a_running_job_enqueued_again_waits_for_its_old_run_though_the_run_saves_its_meta(
    r: redis.Redis, redis_url: str, procs: Processes, tmp_path: Path, worker_class: str, again: str
) -> None:
    """A web process enqueues a running job again (RQ's ``enqueue_job`` of a copy it
    fetched, or ``enqueue(..., job_id=)``), and the run then saves its own meta. RQ put the
    job back in its queue: the save is refused (the run's writes are not the job's any
    more), but the refusal proves nothing about the run, which goes on; its lock stays
    until the run is over, so the job's next run, on an idle worker, starts only then.
    Before: the refusal dropped the lock with the run still going, the idle worker started
    the copy tens of ms later, and the old run's deadline was lifted (a 2-7 s overlap)."""
    queue = Queue("q", connection=r)
    log = str(tmp_path / "runs.log")
    lease = {"RQ_EMQ_LEASE_MS": "3000", "RQ_EMQ_RENEW_INTERVAL_MS": "300"}
    # 8 s, the save once the copy is enqueued (whenever a loaded host has the second
    # worker ready); a later run lasts 0.3 s
    enqueued = tmp_path / "enqueued again"
    args = ("jobs.ticking_run_saving_meta", log, 8.0, str(enqueued), 0.3)
    queue.enqueue(*args, job_id="order-20", job_timeout=60)
    procs.worker(redis_url, "q", worker_class=worker_class, **lease)
    wait_for(lambda: len(runs(log)) > 2, timeout=20, what="the first run to tick")
    procs.worker(redis_url, "q", worker_class=worker_class, **lease)  # idle: takes at once
    wait_for(lambda: len(Worker.all(connection=r)) == 2, timeout=20, what="the second worker")
    if again == "enqueue_job of a fetched copy":
        queue.enqueue_job(Job.fetch("order-20", connection=r))
    else:
        queue.enqueue(*args, job_id="order-20", job_timeout=60)
    enqueued.touch()
    wait_for(lambda: any(line.startswith("save:") for line in runs(log)), timeout=20, what="the save")
    wait_for(lambda: len(each_run(log)) == 2 and runs(log)[-1].startswith("end"), timeout=40, what="2 runs")
    saves = [line.split()[0] for line in runs(log) if line.startswith("save:")]
    assert saves[0] == "save:LeaseLost", saves  # the old run's save, refused
    (_, first_last), (second_start, _) = sorted(each_run(log))
    overlap_ms = (first_last - second_start) * 1000
    assert first_last < second_start, f"the runs overlapped for {overlap_ms:.0f} ms"
