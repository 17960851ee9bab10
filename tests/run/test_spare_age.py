"""A job sees the worker's state as of its take, within ``spare_max_age_ms``: a horse
forked ahead older than that never takes a job, and none is kept past that age, so that an
idle worker holds no old copy of its memory (rq_emq/run/fork_ahead.py). Stock RQ forks its
horse at the take: its job's state is some 0.1 s old, and an idle stock worker's memory is
its own alone. Real ``rq worker`` processes with a worker class whose module holds state
(tests/big_heap_workers.py), a real redis-server."""

from __future__ import annotations

import os
import time

import pytest
import redis
from procs import Processes, wait_for
from rq import Queue

from rq_emq.testing import RedisServer

pytestmark = pytest.mark.skipif(not hasattr(os, "pidfd_open"), reason="Linux 5.3+ with Python 3.9+ only")

LIMIT_MS = 500
LIMIT_S = LIMIT_MS / 1000
QUIET = {
    "RQ_EMQ_LEASE_MS": "600000",
    "RQ_EMQ_SWEEP_INTERVAL_MS": "60000",
    "RQ_EMQ_SPARE_MAX_AGE_MS": str(LIMIT_MS),
}
#: how long the job before, or the idle wait, lasts: 6 limits
BEFORE_S = 6 * LIMIT_S
#: what a job may see beyond the limit: the stamp's period and the take and fork on a
#: loaded 2-core host (stock's own is about 0.1 s): one more limit
SLACK_S = LIMIT_S
HEAP_MB = 200
OURS = "big_heap_workers.LeaseBigHeapWorker"
STOCK = "big_heap_workers.BigHeapWorker"


def _finished(job: object, timeout: float = 30) -> object:
    wait_for(lambda: job.get_status(refresh=True) == "finished", timeout=timeout, what="the job")  # type: ignore[attr-defined]
    return job.return_value()  # type: ignore[attr-defined]


def _warm_worker(url: str, procs: Processes, worker_class: str, **env: str) -> tuple[object, Queue]:
    queue = Queue(connection=redis.Redis.from_url(url))
    worker = procs.worker(url, worker_class=worker_class, **QUIET, **env)
    _finished(queue.enqueue("jobs.noop"))
    return worker, queue


@pytest.mark.parametrize("fork_ahead", ["true", "false"])
def test_a_job_taken_after_an_idle_wait_sees_the_worker_as_of_its_take(
    own_server: RedisServer, procs: Processes, fork_ahead: str
) -> None:
    worker, queue = _warm_worker(own_server.url, procs, OURS, RQ_EMQ_FORK_AHEAD=fork_ahead)
    time.sleep(BEFORE_S)
    # idle past the limit: no spare, not even a zombie (the expiry reaps what it kills)
    assert _forks(worker.pid) == [], procs.log(worker)[-2000:]  # type: ignore[attr-defined]
    age = _finished(queue.enqueue("state_jobs.memory_age"))
    assert age <= LIMIT_S + SLACK_S, (age, procs.log(worker)[-2000:])  # type: ignore[operator]


@pytest.mark.parametrize("fork_ahead", ["true", "false"])
def test_a_job_taken_after_a_long_job_sees_the_worker_as_of_its_take(
    own_server: RedisServer, procs: Processes, fork_ahead: str
) -> None:
    """The next job's horse is forked ahead as the long one starts: too old by its take."""
    worker, queue = _warm_worker(own_server.url, procs, OURS, RQ_EMQ_FORK_AHEAD=fork_ahead)
    long = queue.enqueue("time.sleep", BEFORE_S)
    after = queue.enqueue("state_jobs.memory_age")
    _finished(long)
    age = _finished(after)
    assert age <= LIMIT_S + SLACK_S, (age, procs.log(worker)[-2000:])  # type: ignore[operator]


def test_back_to_back_jobs_still_run_in_horses_forked_ahead(
    own_server: RedisServer, procs: Processes
) -> None:
    """Jobs that follow each other within the limit keep the fork off their path: the
    horse of each is older than its take (forked as the one before began)."""
    worker, queue = _warm_worker(own_server.url, procs, OURS)
    jobs = [queue.enqueue("state_jobs.memory_age") for _ in range(10)]
    jobs += [queue.enqueue("time.sleep", LIMIT_S / 5), queue.enqueue("state_jobs.memory_age")]
    ages = [_finished(job) for job in jobs]
    del ages[-2]  # the sleep's
    assert ages[-1] >= LIMIT_S / 5, (ages, procs.log(worker)[-2000:])  # type: ignore[operator]
    assert max(ages) <= LIMIT_S + SLACK_S, ages  # type: ignore[type-var]


def _forks(worker_pid: int) -> list[tuple[int, str]]:
    """The worker's children that are forks of it (its horses and spares, zombies too; not
    its watchdog, a program of its own), with their state."""
    with open(f"/proc/{worker_pid}/cmdline", "rb") as own:
        cmdline = own.read()
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
            with open(f"/proc/{name}/cmdline", "rb") as theirs:
                same = theirs.read() in (cmdline, b"")  # a zombie's is empty
        except OSError:
            continue
        if int(fields[1]) == worker_pid and same:
            found.append((int(name), fields[0]))
    return found


def _tree(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat") as stat:
                    ppid = int(stat.read().rsplit(")", 1)[1].split()[1])
            except OSError:
                continue
            children.setdefault(ppid, []).append(int(name))
    found, todo = [], [pid]
    while todo:
        found.append(todo.pop())
        todo += children.get(found[-1], [])
    return found


def _pss_mb(pid: int) -> float:
    """PSS of ``pid`` and every process under it (its horses, spares, watchdog), in MB."""
    total_kb = 0
    for each in _tree(pid):
        try:
            with open(f"/proc/{each}/smaps_rollup") as rollup:
                total_kb += next(int(line.split()[1]) for line in rollup if line.startswith("Pss:"))
        except (OSError, StopIteration):
            continue
    return total_kb / 1024


def _idle_after_a_reload(url: str, procs: Processes, worker_class: str, tmp_path: object) -> float:
    request = f"{tmp_path}/{worker_class}.reload"
    worker, _ = _warm_worker(url, procs, worker_class, BIG_HEAP_MB=str(HEAP_MB), BIG_HEAP_RELOAD=request)
    time.sleep(BEFORE_S)  # idle
    open(request, "w").close()
    wait_for(lambda: os.path.exists(request + ".done"), timeout=30, what="the reload")
    pss = _pss_mb(worker.pid)  # type: ignore[attr-defined]
    procs.stop_all()
    return pss


def test_an_idle_worker_holds_no_old_copy_of_its_memory(
    own_server: RedisServer, procs: Processes, tmp_path: object
) -> None:
    """A worker with a preloaded heap rewrites it while idle (a reload): a spare forked
    before would keep the old pages, one more copy of the heap."""
    stock = _idle_after_a_reload(own_server.url, procs, STOCK, tmp_path)
    ours = _idle_after_a_reload(own_server.url, procs, OURS, tmp_path)
    # slack: the watchdog process and the lease threads, a few MB; an old copy is HEAP_MB
    assert ours <= stock + HEAP_MB / 4, (ours, stock)
