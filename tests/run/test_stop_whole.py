"""A stopped run is stopped whole, by something that cannot be starved (issue 21).

Every way a run is ended (the lease-lost stop, the horse's self-fence, the worker's
death, the ``SimpleLeaseWorker`` self-kill, RQ's stop command) ends the job's own child
processes too, those that start a session of their own included; and a run whose
threads cannot run (its worker frozen, its job holding the GIL in C code) is ended by the
worker's watchdog process before any sweep can recover the job. Real processes, real
signals; overlap measured by the runs' own timestamps (``jobs.run_spans``: a run's child
ticks under the run's pid).
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
import rq
from helpers import status
from jobs import children, run_spans, runs
from procs import Processes, pid_alive, wait_for
from rq import Queue

import rq_emq.compat
from rq_emq.run.process_tree import kill_tree, tree
from rq_emq.settings import LeaseSettings
from soak.proxy import TcpProxy

pytestmark = pytest.mark.slow

# lease 1 s, renewals every 200 ms: the local deadline is 800 ms past a renewal's send,
# the sweep recovers no sooner than 1 s + 250 ms grace past it
LEASE = {"RQ_EMQ_LEASE_MS": "1000", "RQ_EMQ_RENEW_INTERVAL_MS": "200", "RQ_EMQ_SWEEP_INTERVAL_MS": "313"}
SETTINGS = LeaseSettings(lease_ms=1000, renew_interval_ms=200, sweep_interval_ms=313)
#: the worker that reruns the job: any lease; the sweep interval sets how soon it recovers
RECOVERER = {"RQ_EMQ_LEASE_MS": "5000", "RQ_EMQ_RENEW_INTERVAL_MS": "500", "RQ_EMQ_SWEEP_INTERVAL_MS": "782"}
RUN_S = 4.0
#: a rerun after a recovery only has to finish
LATER_S = 0.3
#: ~2**28 backtracking steps: several seconds in C code holding the GIL, many leases long
GIL_LETTERS = 28
#: where the job's child runs: in the run's process group, in a session of its own, or as
#: a daemon whose parent exited (re-parented to the horse, a child subreaper)
CHILDREN = pytest.mark.parametrize("how", ["group", "session", "orphan"])
_SPAWN = rq_emq.compat.spawn_worker_class() is not None and int(rq.__version__.split(".")[0]) >= 3
#: the forking worker and RQ 3's SpawnWorker (its horse maps the deadline from /dev/shm)
FORKING = pytest.mark.parametrize(
    "worker_class",
    [
        "rq_emq.LeaseWorker",
        pytest.param("rq_emq.SpawnLeaseWorker", marks=pytest.mark.skipif(not _SPAWN, reason="RQ 3 only")),
    ],
)


@pytest.fixture
def proxy(redis_server: object) -> Iterator[TcpProxy]:
    port = int(redis_server.url.rsplit(":", 1)[1].split("/")[0])  # type: ignore[attr-defined]
    tcp = TcpProxy(port).start()
    yield tcp
    tcp.close()


def _first_run(log: str) -> tuple[int, int]:
    """(the first run's pid, its child's pid), once the child ticks."""
    wait_for(lambda: children(log), timeout=15, what="the first run's child to tick")
    return int(runs(log)[0].split()[1]), children(log)[0]


def _assert_no_overlap(log: str, first_pid: int) -> float:
    """The first run (its child included) was last seen alive before any other run
    started; returns by how much (s)."""
    spans = run_spans(log)
    first_last = spans[first_pid][1]
    later_starts = [start for pid, (start, _) in spans.items() if pid != first_pid]
    assert later_starts, "the job was not run again"
    assert first_last < min(later_starts), (
        f"runs overlap by {1000 * (first_last - min(later_starts)):.0f} ms: {spans}"
    )
    return min(later_starts) - first_last


def _recovered_elsewhere(r: redis.Redis, procs: Processes, redis_url: str, log: str, job_id: str) -> None:
    # a healthy worker: its sweep recovers the job (when the first, 1 s lease lapses), then
    # runs it under a lease five times as long, so that the rerun is not self-fenced in turn
    # on a starved host (a watchdog that woke 0.6 s late let the rerun's 1 s
    # lease lapsed on each of its two attempts)
    procs.worker(redis_url, **RECOVERER)
    wait_for(lambda: len(run_spans(log)) >= 2, timeout=20, what="a second run")
    wait_for(lambda: status(r, job_id) == "finished", timeout=20, what="the job to finish")


def _enqueue_with_child(r: redis.Redis, log: str, how: str) -> str:
    return str(
        Queue(connection=r)
        .enqueue("jobs.run_with_child", log, RUN_S, how, later_s=LATER_S, job_timeout=60)
        .id
    )


def _ends_whole_then_runs_elsewhere(
    r: redis.Redis, procs: Processes, redis_url: str, log: str, job_id: str, first: int, child: int
) -> None:
    """The first run and its child end within a lease (not at its end: a death was seen),
    the job then runs on a healthy worker, and never beside the first run."""
    wait_for(
        lambda: not pid_alive(child) and not pid_alive(first),
        timeout=SETTINGS.lease_ms / 1000,
        what="the run to end",
    )
    _recovered_elsewhere(r, procs, redis_url, log, job_id)
    _assert_no_overlap(log, first)


@CHILDREN
def test_a_lease_lost_stop_ends_the_jobs_child_processes(
    r: redis.Redis, procs: Processes, redis_url: str, tmp_path: Path, proxy: TcpProxy, how: str
) -> None:
    log = str(tmp_path / "runs.log")
    job_id = _enqueue_with_child(r, log, how)
    procs.worker(proxy.url, **LEASE)
    first, child = _first_run(log)
    proxy.cut("reset")  # renewals fail: the worker's lease clock stops the job
    _recovered_elsewhere(r, procs, redis_url, log, job_id)
    _assert_no_overlap(log, first)
    assert not pid_alive(child)


@FORKING
@CHILDREN
def test_a_self_fenced_horse_ends_its_child_processes(
    r: redis.Redis, procs: Processes, redis_url: str, tmp_path: Path, how: str, worker_class: str
) -> None:
    log = str(tmp_path / "runs.log")
    job_id = _enqueue_with_child(r, log, how)
    frozen = procs.worker(redis_url, worker_class=worker_class, **LEASE)
    first, child = _first_run(log)
    os.kill(frozen.pid, signal.SIGSTOP)  # the worker alone: the horse and the watchdog run on
    try:
        _recovered_elsewhere(r, procs, redis_url, log, job_id)
        _assert_no_overlap(log, first)
        assert not pid_alive(child)
    finally:
        os.kill(frozen.pid, signal.SIGCONT)


@FORKING
@CHILDREN
def test_a_killed_workers_run_ends_with_its_child_processes(
    r: redis.Redis, procs: Processes, redis_url: str, tmp_path: Path, how: str, worker_class: str
) -> None:
    log = str(tmp_path / "runs.log")
    job_id = _enqueue_with_child(r, log, how)
    # a lease five times the others': the run must still be going when the test kills its
    # worker (a starved host self-fenced the first run under the 1 s lease before the
    # kill), and the end it checks comes at once, not at the lease's end
    killed = procs.worker(redis_url, worker_class=worker_class, **RECOVERER)
    first, child = _first_run(log)
    os.kill(killed.pid, signal.SIGKILL)  # the worker alone, as the OOM killer would
    _ends_whole_then_runs_elsewhere(r, procs, redis_url, log, job_id, first, child)


def test_a_horse_outlives_its_worker_while_its_watchdog_holds_the_lifeline(
    r: redis.Redis, procs: Processes, redis_url: str, tmp_path: Path
) -> None:
    """The lifeline fires only once the worker and its watchdog are both gone: with the
    watchdog alive (frozen here, so that it cannot act yet) the horse and its child in a
    session of its own run on after the worker's SIGKILL; the watchdog, resumed, finds them
    all and ends them (the kernel's kill would have left that child re-parented to init,
    out of anyone's reach)."""
    log = str(tmp_path / "runs.log")
    job_id = _enqueue_with_child(r, log, "session")
    killed = procs.worker(redis_url, **RECOVERER)
    first, child = _first_run(log)
    watchdog = _watchdog_of(killed.pid, besides=first)
    os.kill(watchdog, signal.SIGSTOP)
    try:
        os.kill(killed.pid, signal.SIGKILL)
        killed.wait(timeout=10)
        time.sleep(0.3)  # the kernel's kill lands at the close itself: long past by now
        assert pid_alive(first) and pid_alive(child)
    finally:
        os.kill(watchdog, signal.SIGCONT)
    _ends_whole_then_runs_elsewhere(r, procs, redis_url, log, job_id, first, child)


def test_a_simple_worker_killed_alone_leaves_no_child_of_its_run_beside_the_next(
    r: redis.Redis, procs: Processes, redis_url: str, tmp_path: Path
) -> None:
    """A ``SimpleLeaseWorker`` runs its job in its own process: SIGKILLed alone, its job's
    child (in the worker's process group, which the worker leads) is orphaned, out of any
    tree walk's reach. Its watchdog ends the group the worker led before it hands the job
    back, so the child does not tick beside the job's next run (it did, by 11-1015 ms in
    the soak)."""
    log = str(tmp_path / "runs.log")
    job_id = _enqueue_with_child(r, log, "group")
    killed = procs.worker(redis_url, worker_class="rq_emq.SimpleLeaseWorker", **RECOVERER)
    first, child = _first_run(log)
    os.kill(killed.pid, signal.SIGKILL)
    wait_for(lambda: not pid_alive(child), timeout=SETTINGS.lease_ms / 1000, what="the run's child to end")
    _recovered_elsewhere(r, procs, redis_url, log, job_id)
    _assert_no_overlap(log, first)


def test_a_worker_killed_with_its_horse_leaves_no_child_of_the_run(
    r: redis.Redis, procs: Processes, redis_url: str, tmp_path: Path
) -> None:
    """SIGKILL of the worker and its horse together (the soak's ``kill_group``): the
    watchdog ends what is left of the horse's group."""
    log = str(tmp_path / "runs.log")
    job_id = _enqueue_with_child(r, log, "group")
    killed = procs.worker(redis_url, **RECOVERER)  # alive until the kill, as above
    first, child = _first_run(log)
    for pid in (killed.pid, first):
        os.kill(pid, signal.SIGKILL)
    wait_for(lambda: not pid_alive(child), timeout=SETTINGS.lease_ms / 1000, what="the run's child to end")
    _recovered_elsewhere(r, procs, redis_url, log, job_id)
    _assert_no_overlap(log, first)


@pytest.mark.parametrize("how", ["group", "session"])  # no subreaper: a daemon is out of reach
def test_a_simple_workers_self_kill_ends_its_jobs_child_processes(
    r: redis.Redis, procs: Processes, redis_url: str, tmp_path: Path, proxy: TcpProxy, how: str
) -> None:
    log = str(tmp_path / "runs.log")
    job = Queue(connection=r).enqueue(
        "jobs.run_with_child", log, RUN_S, how, True, later_s=LATER_S, job_timeout=60
    )
    cut_off = procs.worker(proxy.url, worker_class="rq_emq.SimpleLeaseWorker", **LEASE)
    first, child = _first_run(log)
    proxy.cut("reset")
    # its clock runs out at most a lease after the cut; ten leases of slack for a starved
    # host: what must not happen (a run beside the rerun) is checked by the runs' own spans
    wait_for(
        lambda: cut_off.poll() is not None,
        timeout=10 * SETTINGS.lease_ms / 1000,
        what="the worker to end itself",
    )
    # ended by itself (exit 1), or first by its watchdog (SIGKILL: a loaded host, the two race)
    assert cut_off.returncode in (1, -signal.SIGKILL)
    proxy.heal()
    _recovered_elsewhere(r, procs, redis_url, log, job.id)
    _assert_no_overlap(log, first)
    assert not pid_alive(child)


@CHILDREN
@pytest.mark.rq_versions
def test_rqs_stop_command_ends_the_jobs_child_processes(
    r: redis.Redis, procs: Processes, redis_url: str, tmp_path: Path, how: str
) -> None:
    from rq.command import send_stop_job_command

    log = str(tmp_path / "runs.log")
    job_id = _enqueue_with_child(r, log, how)
    procs.worker(redis_url, **LEASE)
    first, child = _first_run(log)
    send_stop_job_command(r, job_id)
    wait_for(lambda: status(r, job_id) == "stopped", timeout=10, what="the job to be stopped")
    # the kill of the whole tree is sent before RQ writes the stop; a SIGKILLed process is
    # gone once the kernel next schedules it, which a loaded host may delay (the child
    # still running as the status landed): within a lease, long before any
    # recovery could run the job again
    wait_for(
        lambda: not pid_alive(child) and not pid_alive(first),
        timeout=SETTINGS.lease_ms / 1000,
        what="the run and its child gone",
    )


def _death(pid: int, seen: dict[str, float]) -> threading.Thread:
    """A thread that records (``seen["dead"]``) the first moment ``pid`` is seen gone."""

    def watch() -> None:
        while pid_alive(pid):
            time.sleep(0.005)
        seen["dead"] = time.monotonic()

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread


@pytest.mark.parametrize(
    "worker_class",
    [
        "rq_emq.LeaseWorker",
        pytest.param("rq_emq.SpawnLeaseWorker", marks=pytest.mark.skipif(not _SPAWN, reason="RQ 3 only")),
    ],
)
def test_a_job_holding_the_gil_past_its_lease_ends_before_the_job_runs_elsewhere(
    r: redis.Redis, procs: Processes, redis_url: str, tmp_path: Path, worker_class: str
) -> None:
    """The worker is frozen and the horse's code holds the GIL, so the horse's fence cannot
    run: the watchdog ends the horse. (A ``SimpleLeaseWorker``'s job that holds the GIL keeps
    its lease, its watchdog renewing in its place, unless the worker is frozen:
    tests/run/test_stand_in.py.)"""
    log = str(tmp_path / "runs.log")
    job = Queue(connection=r).enqueue("jobs.hold_gil_first_run", log, GIL_LETTERS, job_timeout=120)
    worker = procs.worker(redis_url, worker_class=worker_class, **LEASE)
    wait_for(lambda: runs(log), timeout=15, what="the first run to start")
    first = int(runs(log)[0].split()[1])
    os.kill(worker.pid, signal.SIGSTOP)
    seen: dict[str, float] = {}
    watcher = _death(first, seen)
    try:
        _recovered_elsewhere(r, procs, redis_url, log, job.id)
        watcher.join(timeout=5)
        second = min(start for pid, (start, _) in run_spans(log).items() if pid != first)
        assert "dead" in seen and seen["dead"] < second, (seen, run_spans(log))
        print(
            f"{worker_class}: GIL-holding run ended {1000 * (second - seen['dead']):.0f} ms before the next"
        )
    finally:
        os.kill(worker.pid, signal.SIGCONT)


def test_a_kill_of_the_workers_process_group_ends_a_horse_that_holds_the_gil(
    r: redis.Redis, procs: Processes, redis_url: str, tmp_path: Path
) -> None:
    """A supervisor that kills the worker's whole process group (supervisord's
    ``killasgroup``, ``kill -9 -PGID``) kills the worker, not its watchdog (a session of
    its own), which ends the horse (RQ puts it in a session of its own, out of the group's
    reach) at once, though the horse's code holds the GIL and its own fence cannot run."""
    log = str(tmp_path / "runs.log")
    job = Queue(connection=r).enqueue("jobs.hold_gil_first_run", log, GIL_LETTERS, job_timeout=120)
    worker = procs.worker(redis_url, **LEASE)
    wait_for(lambda: runs(log), timeout=15, what="the first run to start")
    first = int(runs(log)[0].split()[1])
    os.killpg(worker.pid, signal.SIGKILL)
    # the watchdog acts on its worker's death, not on the lease: within a lease, which
    # leaves a starved host the lease's margin and grace before a sweep could take the job
    wait_for(lambda: not pid_alive(first), timeout=SETTINGS.lease_ms / 1000, what="the horse to end")
    _recovered_elsewhere(r, procs, redis_url, log, job.id)
    _assert_no_overlap(log, first)


def test_a_frozen_worker_and_horse_pair_is_ended_while_frozen(
    r: redis.Redis, procs: Processes, redis_url: str, tmp_path: Path
) -> None:
    """SIGSTOP of the worker and its horse (not its watchdog): the run is ended before the
    job runs elsewhere, not as it resumes."""
    log = str(tmp_path / "runs.log")
    job_id = _enqueue_with_child(r, log, "group")
    frozen = procs.worker(redis_url, **LEASE)
    first, child = _first_run(log)
    for pid in (frozen.pid, first, child):
        os.kill(pid, signal.SIGSTOP)
    try:
        _recovered_elsewhere(r, procs, redis_url, log, job_id)
        second = min(start for pid, (start, _) in run_spans(log).items() if pid != first)
        assert not pid_alive(first) and not pid_alive(child)
        assert run_spans(log)[first][1] < second
    finally:
        os.kill(frozen.pid, signal.SIGCONT)


def _watchdog_of(worker_pid: int, besides: int = 0) -> int:
    """The worker's one watchdog: a process of the worker's tree that is not its horse
    (``besides``) nor the horse's, nor the next horse, forked ahead (a fork of the worker)."""
    horse = tree(besides) if besides else set()
    found = [pid for pid in tree(worker_pid) - horse if pid != worker_pid and _is_watchdog(pid)]
    assert len(found) == 1, found
    return found[0]


def _is_watchdog(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
            return b"watchdog.py" in cmdline.read()
    except OSError:
        return False


def _waiting_for_signals(pid: int) -> bool:
    """``pid`` sleeps in ``sigwaitinfo`` / ``sigtimedwait`` (its kernel wait channel; where
    the kernel hides it, its wake-ups stopped for a while)."""
    try:
        with open(f"/proc/{pid}/wchan") as wchan:
            channel = wchan.read()
    except OSError:
        channel = "0"
    if channel not in ("", "0"):
        return "sigtimedwait" in channel
    before = _wakeups(pid)
    time.sleep(0.5)
    return _wakeups(pid) == before


def _wakeups(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status_file:
        fields = dict(line.split(":", 1) for line in status_file)
    return int(fields["voluntary_ctxt_switches"]) + int(fields["nonvoluntary_ctxt_switches"])


@pytest.mark.parametrize("worker_class", ["rq_emq.LeaseWorker", "rq_emq.SimpleLeaseWorker"])
def test_the_watchdog_holds_no_connection_sleeps_while_idle_and_dies_with_its_worker(
    r: redis.Redis, procs: Processes, redis_url: str, worker_class: str
) -> None:
    worker = procs.worker(redis_url, worker_class=worker_class, **LEASE)
    wait_for(lambda: r.smembers("rq:workers"), timeout=15, what="the worker to register")
    watchdog = _watchdog_of(worker.pid)
    wait_for(lambda: _waiting_for_signals(watchdog), timeout=10, what="the watchdog to start and wait")
    # a program of its own: stdio and the shared memory's file, none of the worker's sockets
    held = [os.readlink(f"/proc/{watchdog}/fd/{fd}") for fd in os.listdir(f"/proc/{watchdog}/fd")]
    assert not [what for what in held if what.startswith("socket:")], held
    before = _wakeups(watchdog)
    time.sleep(10 * SETTINGS.renew_interval_ms / 1000)  # ten renewals of an idle worker
    assert _wakeups(watchdog) == before
    os.kill(worker.pid, signal.SIGKILL)
    try:
        # the kernel's PDEATHSIG wakes it at once, and it exits; the rest is slack for a
        # loaded host (CI once took more than 2 s with a suite and a browser starting beside)
        wait_for(lambda: not pid_alive(watchdog), timeout=5, what="the watchdog to go with its worker")
    finally:
        if pid_alive(watchdog):  # (a broken one: no process of a test outlives it)
            os.kill(watchdog, signal.SIGKILL)


def test_kill_tree_ends_a_process_its_group_and_descendants_in_other_sessions() -> None:
    import subprocess
    import sys

    script = (
        "import subprocess, sys, time\n"
        "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'], start_new_session=True)\n"
        "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
        "time.sleep(60)\n"
    )
    root = subprocess.Popen([sys.executable, "-c", script], start_new_session=True)
    try:
        wait_for(lambda: len(tree(root.pid)) == 3, timeout=10, what="the tree to start")
        members = tree(root.pid)
        killed = kill_tree(root.pid, group=True)
        assert killed == members
        root.wait(timeout=5)
        wait_for(lambda: not any(pid_alive(pid) for pid in members), timeout=2, what="the tree to end")
    finally:
        if root.poll() is None:
            root.kill()


def test_a_horse_whose_watchdog_is_gone_and_worker_frozen_ends_itself_whole_at_its_deadline(
    r: redis.Redis, procs: Processes, redis_url: str, tmp_path: Path
) -> None:
    """The horse's own fence is the second line (a watchdog killed on its own, then the
    worker frozen before a new one starts): past its deadline it ends its group and
    descendants, here a child in a session of its own."""
    lease = {**LEASE, "RQ_EMQ_LEASE_MS": "3000"}
    log = str(tmp_path / "runs.log")
    job_id = _enqueue_with_child(r, log, "session")
    victim = procs.worker(redis_url, **lease)
    first, child = _first_run(log)
    os.kill(victim.pid, signal.SIGSTOP)  # first: a running worker replaces its watchdog at once
    os.kill(_watchdog_of(victim.pid, besides=first), signal.SIGKILL)
    try:
        procs.worker(redis_url, **lease)
        wait_for(lambda: len(run_spans(log)) >= 2, timeout=20, what="a second run")
        wait_for(lambda: status(r, job_id) == "finished", timeout=20, what="the job to finish")
        _assert_no_overlap(log, first)
        assert not pid_alive(child)
    finally:
        os.kill(victim.pid, signal.SIGCONT)


@pytest.mark.parametrize(
    ("worker_class", "horse"),
    [
        ("rq_emq.LeaseWorker", "forked for its job"),
        ("rq_emq.LeaseWorker", "forked ahead"),
        pytest.param(
            "rq_emq.SpawnLeaseWorker",
            "spawned",
            marks=pytest.mark.skipif(not _SPAWN, reason="RQ 3 only"),
        ),
    ],
)
def test_a_horse_holding_the_gil_ends_at_once_when_its_worker_and_watchdog_die_together(
    r: redis.Redis, procs: Processes, redis_url: str, tmp_path: Path, worker_class: str, horse: str
) -> None:
    """A double fault within one check: the watchdog SIGKILLed, then its worker at once,
    while the job holds the GIL in C code (the horse's fence thread cannot run). The
    kernel ends the horse's group as the lifeline's last write end closes: the horse is
    gone within a lease (it would run on for the seconds its C call takes), long before
    the sweep hands the job to another worker. The horse is the first job's (forked for
    it) or a second job's (forked ahead, while the first ran: armed from its fork)."""
    log = str(tmp_path / "runs.log")
    queue = Queue(connection=r)
    # a spare as old as this test may take the job: it must be the one that runs it
    worker = procs.worker(redis_url, worker_class=worker_class, **LEASE, RQ_EMQ_SPARE_MAX_AGE_MS="60000")
    if horse == "forked ahead":
        warm_up = queue.enqueue("jobs.noop")
        wait_for(lambda: status(r, warm_up.id) == "finished", timeout=15, what="the first job")
    job = queue.enqueue("jobs.hold_gil_first_run", log, GIL_LETTERS, job_timeout=120)
    wait_for(lambda: runs(log), timeout=15, what="the first run to start")
    first = int(runs(log)[0].split()[1])
    os.kill(_watchdog_of(worker.pid, besides=first), signal.SIGKILL)
    os.kill(worker.pid, signal.SIGKILL)
    wait_for(lambda: not pid_alive(first), timeout=SETTINGS.lease_ms / 1000, what="the horse to end")
    _recovered_elsewhere(r, procs, redis_url, log, job.id)
    _assert_no_overlap(log, first)


@pytest.mark.parametrize("worker_class", ["rq_emq.LeaseWorker", "rq_emq.SimpleLeaseWorker"])
def test_a_watchdog_killed_on_its_own_is_started_again_for_the_next_job(
    r: redis.Redis, procs: Processes, redis_url: str, tmp_path: Path, worker_class: str
) -> None:
    worker = procs.worker(redis_url, worker_class=worker_class, **LEASE)
    wait_for(lambda: r.smembers("rq:workers"), timeout=15, what="the worker to register")
    first = _watchdog_of(worker.pid)
    os.kill(first, signal.SIGKILL)
    # gone before the next job: a loaded host may still be tearing it down when the worker
    # takes the job, and a watchdog found alive at the fork is not started again (.ci/stress)
    wait_for(lambda: not pid_alive(first), timeout=10, what="the killed watchdog to be gone")
    log = str(tmp_path / "runs.log")
    job = Queue(connection=r).enqueue("jobs.ticking_run", log, 0.1)
    wait_for(lambda: status(r, job.id) == "finished", timeout=15, what="the job to finish")

    def watchdogs() -> list[int]:
        # the worker's children but its horse, which may still be on its way out (CI saw it)
        return [pid for pid in tree(worker.pid) if pid not in (worker.pid, first) and _is_watchdog(pid)]

    again = wait_for(lambda: watchdogs(), timeout=10, what="a new watchdog")
    assert isinstance(again, list) and len(again) == 1 and pid_alive(again[0]), again


@pytest.mark.parametrize("then", ["kill", "freeze"])
def test_a_watchdog_killed_mid_run_is_replaced_at_once_so_a_gil_holding_horse_still_ends(
    r: redis.Redis, procs: Processes, redis_url: str, tmp_path: Path, then: str
) -> None:
    """The watchdog is killed on its own while a horse holds the GIL (its fence thread
    cannot run), then the worker is killed or frozen. A watchdog replaced only at the next
    fork left the horse running beside the job's next run (2.4-2.8 s later); the worker's
    keeper thread replaces it as it dies, and the new one ends the horse: at once when its
    worker dies, at the run's deadline when its worker is frozen."""
    log = str(tmp_path / "runs.log")
    job = Queue(connection=r).enqueue("jobs.hold_gil_first_run", log, GIL_LETTERS, job_timeout=120)
    worker = procs.worker(redis_url, **LEASE)
    wait_for(lambda: runs(log), timeout=15, what="the first run to start")
    first = int(runs(log)[0].split()[1])
    dead = _watchdog_of(worker.pid, besides=first)
    os.kill(dead, signal.SIGKILL)

    def replaced() -> list[int]:
        return [pid for pid in tree(worker.pid) if pid not in (worker.pid, first, dead) and _is_watchdog(pid)]

    # at once (slack for a loaded host: 5 s)
    wait_for(replaced, timeout=5, what="a new watchdog while the run goes on")
    # the worker says so (its line follows the new watchdog's start: waited for, not raced)
    wait_for(lambda: "died; started a new one" in procs.log(worker), timeout=5, what="the worker's line")
    assert pid_alive(first)  # the run went on meanwhile
    if then == "kill":
        os.kill(worker.pid, signal.SIGKILL)
        # the new watchdog acts on its worker's death: within a lease
        wait_for(lambda: not pid_alive(first), timeout=SETTINGS.lease_ms / 1000, what="the horse to end")
    else:
        os.kill(worker.pid, signal.SIGSTOP)
    try:
        _recovered_elsewhere(r, procs, redis_url, log, job.id)
        _assert_no_overlap(log, first)
    finally:
        if then == "freeze":
            os.kill(worker.pid, signal.SIGCONT)
