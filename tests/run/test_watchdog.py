"""The watchdog (rq_emq/run/watchdog.py) as a real process beside a real forked run, no
Redis: which run it is told of, and by whom. This test process plays the worker."""

from __future__ import annotations

import logging
import math
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest
from procs import pid_alive, wait_for

from rq_emq.run.horse_fence import HorseDeadline
from rq_emq.run.watchdog import Watchdog

#: the run's deadline, from the moment the worker writes it before the fork
DEADLINE_S = 0.3


@pytest.fixture
def watchdog() -> Iterator[Watchdog]:
    deadline = HorseDeadline.in_memfd()
    dog = Watchdog(deadline, group=True)
    dog.start()
    try:
        yield dog
    finally:
        dog.stop()


def _idle(pid: int) -> bool:
    """Whether ``pid`` sleeps in its wait for signals (the watchdog between runs)."""
    with open(f"/proc/{pid}/wchan") as channel:
        return "sigtimedwait" in channel.read()


def _run_that_holds_on(deadline: HorseDeadline) -> int:
    """Fork a run as LeaseWorker's horse starts one (its pid written, its watchdog told),
    which then neither fences itself nor ends: only the watchdog can stop it."""
    pid = os.fork()
    if pid == 0:  # the horse
        try:
            os.setpgid(0, 0)  # a group of its own, as RQ's horse
            deadline.run_started_here()
            time.sleep(30)
        finally:
            os._exit(0)
    return pid


def test_a_run_whose_worker_froze_before_telling_the_watchdog_is_still_ended_at_its_deadline(
    watchdog: Watchdog,
) -> None:
    """A starved host can run the forked horse first and freeze the worker before it
    writes the run's pid and pokes its watchdog (CI's stress check: a job holding the GIL
    ran on 6.2 s past its deadline, beside its own rerun). The horse tells the watchdog
    itself, so the run is ended at its deadline without any further step of the worker."""
    deadline = watchdog.deadline
    wait_for(lambda: _idle(watchdog.pid), timeout=10, what="the watchdog to wait")
    deadline.reset(time.monotonic() + DEADLINE_S)  # the worker, before the fork; then frozen
    run = _run_that_holds_on(deadline)
    try:
        wait_for(lambda: deadline.pid == run, timeout=10, what="the horse to start")
        # the deadline, then slack for a loaded host: on the old code the run never ends
        wait_for(lambda: not pid_alive(run), timeout=DEADLINE_S + 5, what="the watchdog to end the run")
        # what tells its worker this death is the lease clock's stop, not a crash
        assert deadline.ended_at_deadline
    finally:
        if pid_alive(run):
            os.kill(run, signal.SIGKILL)
        os.waitpid(run, 0)


def _run_that_sleeps() -> int:
    """Fork a run that only holds on (its start is told to the watchdog by the caller)."""
    pid = os.fork()
    if pid == 0:
        try:
            os.setpgid(0, 0)
            time.sleep(30)
        finally:
            os._exit(0)
    return pid


def test_a_run_that_starts_while_the_watchdog_sleeps_until_an_earlier_deadline_needs_no_poke(
    watchdog: Watchdog,
) -> None:
    """Back-to-back runs: the watchdog sleeps until the deadline of the run it read last,
    which is no later than the next run's. The next run's start does not wake it (a poke a
    job cost both processes 0.1-0.2 ms), and the run is still ended at its own deadline."""
    deadline = watchdog.deadline
    wait_for(lambda: _idle(watchdog.pid), timeout=10, what="the watchdog to wait")
    assert deadline.wakes_at == math.inf  # waiting for a poke only: a start pokes it
    deadline.reset(time.monotonic() + 2 * DEADLINE_S)
    first = _run_that_holds_on(deadline)
    wait_for(lambda: deadline.wakes_at < math.inf, timeout=10, what="the watchdog to read the first run")
    os.kill(first, signal.SIGKILL)  # the first run ends well before its deadline
    os.waitpid(first, 0)
    deadline.clear()
    deadline.reset(time.monotonic() + 3 * DEADLINE_S)
    second = _run_that_sleeps()
    try:
        assert not deadline.start_run(second)  # the watchdog reads it by the first deadline
        wait_for(lambda: not pid_alive(second), timeout=3 * DEADLINE_S + 5, what="the watchdog to end it")
    finally:
        if pid_alive(second):
            os.kill(second, signal.SIGKILL)
        os.waitpid(second, 0)


def test_a_horse_never_signals_a_process_that_is_not_its_workers_watchdog() -> None:
    """The watchdog's pid in the shared memory may outlive it and be reused: the horse
    signals only a sibling (a child of its own worker). The signal's default action would
    end any other process that now holds the pid."""
    holder = subprocess.Popen(
        [sys.executable, "-c", STRANGER], stdout=subprocess.PIPE, start_new_session=True
    )
    try:
        assert holder.stdout is not None
        stranger = int(holder.stdout.readline())  # a grandchild of this test: nobody's sibling
        deadline = HorseDeadline.in_memfd()
        deadline.watchdog_pid = stranger
        # a run due before the watchdog's next look: the horse would poke it (a run the
        # watchdog reads in time anyway is not poked, and would test nothing here)
        deadline.set(-1.0)
        assert deadline.start_run(os.getpid())
        deadline.run_started_here()  # this test process as the horse
        time.sleep(0.2)
        assert pid_alive(stranger)
    finally:
        os.killpg(holder.pid, signal.SIGKILL)
        holder.wait()


#: a process that starts a child, says its pid and holds on
STRANGER = (
    "import subprocess, sys, time\n"
    "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(30)'])\n"
    "print(child.pid, flush=True)\n"
    "time.sleep(30)\n"
)


def test_a_watchdog_that_cannot_be_replaced_never_stops_the_renewal_and_is_said_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The replacement runs on the lock manager's thread, before the renewal goes out: a
    host that refuses a process (EAGAIN, ENOMEM) must not fail that tick, tick after tick."""
    from types import SimpleNamespace

    from rq_emq.run.run_guard import RunGuard

    class Refused:
        pid, alive = 4321, False

        def start(self) -> None:
            raise BlockingIOError(11, "Resource temporarily unavailable")

    guard: Any = RunGuard()
    guard.lease_settings = SimpleNamespace(stop_on_lease_lost=True)
    guard._horse_deadline = SimpleNamespace()
    guard._watchdog = Refused()
    with caplog.at_level(logging.ERROR, logger="rq_emq.lease"):
        for _ in range(3):
            guard._replace_dead_watchdog()  # raises nothing
    assert [r.getMessage() for r in caplog.records] == [
        "the watchdog (pid 4321) died and none could be started: [Errno 11] Resource temporarily unavailable"
    ]
