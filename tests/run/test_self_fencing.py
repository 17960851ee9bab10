"""No two runs of one job overlap in time: a holder that cannot renew stops its job on
its own lease clock, and a horse fences itself, before the sweep may hand the job to
another worker. Real processes, real signals, a real (or proxied) Redis."""

from __future__ import annotations

import os
import re
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from helpers import status
from jobs import run_spans, runs
from procs import Processes, pid_alive, wait_for
from redis_server import RedisServer
from rq import Queue

from rq_emq.connection.budget import control_client
from rq_emq.hold.lease import Lease, LockManager
from rq_emq.run.horse_fence import HorseDeadline
from rq_emq.settings import LeaseSettings
from soak.proxy import TcpProxy

pytestmark = pytest.mark.slow

# lease 1 s, renewals every 200 ms: the local deadline is 800 ms past a renewal's send,
# the sweep recovers no sooner than 1 s + 250 ms grace past it
LEASE = {"RQ_EMQ_LEASE_MS": "1000", "RQ_EMQ_RENEW_INTERVAL_MS": "200", "RQ_EMQ_SWEEP_INTERVAL_MS": "313"}
RUN_S = 4.0
#: a rerun after a recovery only has to finish
LATER_S = 0.3


@pytest.fixture
def proxy(redis_server: object) -> Iterator[TcpProxy]:
    port = int(redis_server.url.rsplit(":", 1)[1].split("/")[0])  # type: ignore[attr-defined]
    tcp = TcpProxy(port).start()
    yield tcp
    tcp.close()


def _first_run_pid(log: str) -> int:
    wait_for(lambda: runs(log), timeout=15, what="the first run to start")
    return int(runs(log)[0].split()[1])


def _assert_no_overlap(log: str, first_pid: int) -> None:
    """The first run was last seen alive before any other run started."""
    spans = run_spans(log)
    first_last = spans[first_pid][1]
    later_starts = [start for pid, (start, _) in spans.items() if pid != first_pid]
    assert later_starts, "the job was not run again"
    assert first_last < min(later_starts), (
        f"runs overlap by {1000 * (first_last - min(later_starts)):.0f} ms: {spans}"
    )


def _recovered_elsewhere(r: redis.Redis, procs: Processes, redis_url: str, log: str, job_id: str) -> None:
    procs.worker(redis_url, **LEASE)  # a healthy worker: its sweep recovers the job, then runs it
    wait_for(lambda: len(run_spans(log)) >= 2, timeout=20, what="a second run")
    wait_for(lambda: status(r, job_id) == "finished", timeout=20, what="the job to finish")


def test_a_frozen_workers_horse_fences_itself_before_the_job_runs_elsewhere(
    r: redis.Redis, procs: Processes, redis_url: str, tmp_path: Path
) -> None:
    log = str(tmp_path / "runs.log")
    job = Queue(connection=r).enqueue("jobs.ticking_run", log, RUN_S, later_s=LATER_S, job_timeout=60)
    frozen = procs.worker(redis_url, **LEASE)
    horse = _first_run_pid(log)
    os.kill(frozen.pid, signal.SIGSTOP)  # the worker alone: its horse is in a group of its own
    try:
        wait_for(lambda: not pid_alive(horse), timeout=3, what="the horse to end itself")
        _recovered_elsewhere(r, procs, redis_url, log, job.id)
        _assert_no_overlap(log, horse)
    finally:
        os.kill(frozen.pid, signal.SIGCONT)


@pytest.mark.parametrize("worker_class", ["rq_emq.LeaseWorker", "rq_emq.SimpleLeaseWorker"])
@pytest.mark.parametrize("cut", ["blackhole", "reset"])
def test_a_worker_cut_off_from_redis_stops_its_run_before_the_job_runs_elsewhere(
    r: redis.Redis,
    procs: Processes,
    redis_url: str,
    tmp_path: Path,
    proxy: TcpProxy,
    worker_class: str,
    cut: str,
) -> None:
    """``blackhole``: renewals hang on connections that stay open (the client waits on its
    socket timeout); ``reset``: a long partition, every connection refused."""
    log = str(tmp_path / "runs.log")
    job = Queue(connection=r).enqueue("jobs.ticking_run", log, RUN_S, later_s=LATER_S, job_timeout=60)
    cut_off = procs.worker(proxy.url, worker_class=worker_class, **LEASE)
    first = _first_run_pid(log)
    time.sleep(0.3)
    proxy.cut(cut)
    _recovered_elsewhere(r, procs, redis_url, log, job.id)
    _assert_no_overlap(log, first)
    if worker_class == "rq_emq.LeaseWorker":
        assert not pid_alive(first)
    proxy.heal()
    time.sleep(0.5)
    text = procs.log(cut_off)
    if worker_class == "rq_emq.SimpleLeaseWorker":
        # a stopped run in the worker process is over only when that process is: it ends
        # itself (exit 1), or on a starved host its watchdog ends it (SIGKILL)
        assert cut_off.poll() in (1, -signal.SIGKILL), text
        if starved_worker_ended_by_its_watchdog(text, cut_off.pid):
            return  # the backstop did its part: the run stopped before the job ran elsewhere
        assert "stopped when its local lease clock ran out; ending the worker process" in text, text
        return
    assert "local lease clock ran out" in text
    # a horse's job is ended with its horse: the worker lives on
    assert cut_off.poll() is None, text


def starved_worker_ended_by_its_watchdog(text: str, worker_pid: int) -> bool:
    """A SimpleLeaseWorker's run is its own process: when none of its threads got the CPU
    past its local lease deadline (two suites side by side on 2 cores),
    its watchdog, a process of its own, ends the whole worker one check interval after the
    moment of its self-kill, and no thread of it lived to log the clock running out. That
    is the designed backstop, and it counts only when the watchdog itself woke late, which
    shows the host was starved (a worker whose threads run stops the job first)."""
    found = re.search(rf"rq-emq watchdog \d+: run {worker_pid} past its deadline by (\d+) ms", text)
    return found is not None and "local lease clock ran out" not in text and int(found.group(1)) >= 50


def test_a_renewal_against_a_stalled_redis_gives_up_within_a_renew_interval(
    own_server: RedisServer,
) -> None:
    settings = LeaseSettings(lease_ms=1000, renew_interval_ms=200)
    client = control_client(redis.Redis.from_url(own_server.url), settings.redis_timeout_s)
    manager = LockManager(client, settings.lease_ms, settings.renew_interval_ms, on_lost=lambda lease: None)
    lease = Lease("default", "job-1", "token")
    manager.add(lease)
    manager.tick()  # connected, scripts loaded
    lease.settled = lease.lost = False  # (no such job: the renewal dropped it) renew it again
    own_server.pause()
    try:
        began = time.monotonic()
        with pytest.raises(redis.exceptions.TimeoutError):
            manager.tick()
        # the socket timeout (0.2 s) ends it, before the next tick is due one renew
        # interval later (that interval is the slack a loaded host may use)
        assert time.monotonic() - began < settings.redis_timeout_s + settings.renew_interval_ms / 1000
    finally:
        own_server.resume()


def test_a_lease_whose_local_clock_runs_out_is_stopped_though_redis_never_answers(
    own_server: RedisServer,
) -> None:
    settings = LeaseSettings(lease_ms=1000, renew_interval_ms=200)
    client = control_client(redis.Redis.from_url(own_server.url), settings.redis_timeout_s)
    stopped: list[tuple[str, float]] = []
    manager = LockManager(
        client,
        settings.lease_ms,
        settings.renew_interval_ms,
        on_lost=lambda lease: None,
        margin_ms=settings.lease_margin_ms,
        check_interval_s=settings.lease_check_interval_s,
        on_expired=lambda lease: stopped.append((lease.job_id, time.monotonic())),
    )
    sent = time.monotonic()
    lease = Lease("default", "job-1", "token", valid_until=manager.deadline(sent))
    manager.add(lease)
    own_server.pause()
    manager.start()
    try:
        wait_for(lambda: stopped, timeout=3, what="the local clock to stop the job")
    finally:
        manager.stop()
        own_server.resume()
    (job_id, at), *_ = stopped
    assert job_id == "job-1" and lease.expired
    # at the local deadline (lease - margin past the send), and before the lease lapses in
    # Redis (the margin, 0.2 s, less a check interval is the slack a loaded host may use)
    assert (
        sent + (settings.lease_ms - settings.lease_margin_ms) / 1000 <= at < sent + settings.lease_ms / 1000
    )


def test_a_simple_workers_job_that_cannot_be_interrupted_ends_its_process_before_recovery(
    r: redis.Redis, procs: Processes, redis_url: str, tmp_path: Path, proxy: TcpProxy
) -> None:
    log = str(tmp_path / "runs.log")
    job = Queue(connection=r).enqueue("jobs.uninterruptible_run", log, RUN_S, later_s=LATER_S, job_timeout=60)
    cut_off = procs.worker(proxy.url, worker_class="rq_emq.SimpleLeaseWorker", **LEASE)
    first = _first_run_pid(log)
    time.sleep(0.3)
    proxy.cut("reset")
    # its run guard or its watchdog ends it about a lease after the cut; 6 leases of slack
    # for a loaded host (3 were too few beside two suites under RQ 2.12). That it
    # ended before the recovery is what the no-overlap check below proves.
    wait_for(lambda: cut_off.poll() is not None, timeout=6, what="the worker to end itself")
    # ended by itself (exit 1), or first by its watchdog (SIGKILL: a loaded host, the two race)
    assert cut_off.returncode in (1, -signal.SIGKILL)
    proxy.heal()
    _recovered_elsewhere(r, procs, redis_url, log, job.id)
    _assert_no_overlap(log, first)
    said = procs.log(cut_off)
    assert "stopped when its local lease clock ran out; ending" in said or "past its deadline" in said, said


def _horse_exit(deadline: HorseDeadline, settle: bool) -> int:
    """How a forked horse guarded by ``deadline`` ends (its wait status) when its deadline
    passes once it is guarding (and, with ``settle``, settled): its guard looks every 10 ms,
    and it has 1 s (100 looks) to act before the horse would exit 7 by itself."""
    ready_r, ready_w = os.pipe()
    deadline.reset(time.monotonic() + 3600)
    pid = os.fork()
    if pid == 0:
        os.close(ready_r)
        deadline.guard(0.01)
        if settle:
            deadline.settle()
        os.write(ready_w, b"1")
        time.sleep(1.0)
        os._exit(7)
    os.close(ready_w)
    assert os.read(ready_r, 1) == b"1"  # however long the fork took on a loaded host
    os.close(ready_r)
    deadline.set(time.monotonic() - 0.001)  # the lease clock runs out now
    return os.waitpid(pid, 0)[1]


def test_a_horse_whose_outcome_has_landed_finishes_its_bookkeeping_past_the_deadline() -> None:
    """Once its fenced finish has committed, a horse's remaining work (RQ 3 enqueues the
    dependents it marked ready) is no run of the job: its lease clock no longer ends it.
    The next run is fenced again."""
    deadline = HorseDeadline()
    status_settled = _horse_exit(deadline, settle=True)
    assert os.WIFEXITED(status_settled) and os.WEXITSTATUS(status_settled) == 7
    assert deadline.settled  # the worker sees it too: its own expiry leaves the horse alone
    deadline.reset(time.monotonic() + 0.1)
    assert not deadline.settled
    status_unsettled = _horse_exit(deadline, settle=False)
    assert os.WIFSIGNALED(status_unsettled) and os.WTERMSIG(status_unsettled) == signal.SIGKILL
