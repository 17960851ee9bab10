"""A horse tells its worker its run is over before its slow exit, and only its word counts:
a horse that ends any other way is reaped as RQ reaps it, whatever its children hold, and
no told horse is left unreaped (rq_emq/run/horse_end.py). Real forks, real processes."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import redis
from jobs import run_spans
from procs import Processes, wait_for
from rq import Queue

from rq_emq.run.horse_end import HorseEnd

pytestmark = pytest.mark.skipif(not hasattr(os, "pidfd_open"), reason="Linux 5.3+ with Python 3.9+ only")


class _Connection:
    """What a horse's client is to ``tell_done``: a pool to close."""

    class connection_pool:  # noqa: N801 (the attribute redis-py's client has)
        @staticmethod
        def disconnect() -> None:
            pass


def _fork(horse_end: HorseEnd, child: Any) -> int:
    horse_end.before_fork()
    pid = os.fork()
    if pid == 0:  # pragma: no cover (the horse)
        try:
            horse_end.in_horse()
            child()
        finally:
            os._exit(0)
    horse_end.forked(pid)
    return pid


def _wait_told(horse_end: HorseEnd, pid: int, within_s: float) -> bool | None:
    """``wait_told`` in a thread: its answer, or None if it had none within ``within_s``."""
    answers: list[bool] = []
    waiter = threading.Thread(target=lambda: answers.append(horse_end.wait_told(pid)), daemon=True)
    waiter.start()
    waiter.join(within_s)
    return answers[0] if answers else None


def _alive(pid: int) -> bool:
    return os.waitpid(pid, os.WNOHANG) == (0, 0)


def test_a_horse_that_tells_its_end_frees_its_worker_while_it_still_exits() -> None:
    horse_end = HorseEnd()

    def horse() -> None:
        horse_end.tell_done(_Connection())
        time.sleep(0.6)  # an exit that takes its time

    pid = _fork(horse_end, horse)
    assert _wait_told(horse_end, pid, within_s=0.4) is True
    assert _alive(pid), "the worker waited for the exit"
    assert horse_end.exiting == [pid]
    horse_end.reap_exited(block=True)
    assert horse_end.exiting == []
    with pytest.raises(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)  # reaped: no <defunct> left


@pytest.mark.parametrize("end", ["exit 1", "killed"])
def test_a_horse_that_ends_without_a_word_is_left_to_rqs_reaping(end: str) -> None:
    horse_end = HorseEnd()

    def horse() -> None:
        if end == "killed":
            os.kill(os.getpid(), signal.SIGKILL)
        os._exit(1)

    pid = _fork(horse_end, horse)
    assert _wait_told(horse_end, pid, within_s=2) is False
    assert horse_end.exiting == []
    _, status = os.waitpid(pid, 0)  # RQ's wait4 then reads how it ended
    assert (
        (os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL)
        if end == "killed"
        else (os.WEXITSTATUS(status) == 1)
    )


def test_a_child_of_the_horse_holding_the_pipe_does_not_keep_its_worker_waiting() -> None:
    """A job's fork without exec (multiprocessing's default) keeps the horse's end of the
    pipe open after the horse dies: the horse's own end (its pidfd) wakes the worker."""
    horse_end = HorseEnd()

    def horse() -> None:
        if os.fork() == 0:  # the job's child: lives on, holding the pipe
            time.sleep(3)
            os._exit(0)
        os.kill(os.getpid(), signal.SIGKILL)

    pid = _fork(horse_end, horse)
    assert _wait_told(horse_end, pid, within_s=2) is False, "the worker waited on the child"
    os.waitpid(pid, 0)


def test_a_lease_worker_leaves_no_defunct_horse_once_idle(
    r: redis.Redis, redis_url: str, procs: Processes, tmp_path: Path
) -> None:
    """Every horse that told its end is reaped: at the latest as the worker goes idle."""
    queue = Queue(connection=r)
    jobs = [queue.enqueue("jobs.noop") for _ in range(20)]
    worker = procs.worker(redis_url)
    wait_for(
        lambda: all(job.get_status(refresh=True) == "finished" for job in jobs),
        timeout=30,
        what="the jobs to finish",
    )

    def defunct_children() -> list[int]:
        found = []
        for name in os.listdir("/proc"):
            if not name.isdigit():
                continue
            try:
                stat = Path(f"/proc/{name}/stat").read_text()
            except OSError:
                continue
            state, ppid = stat.rsplit(")", 1)[1].split()[:2]
            if int(ppid) == worker.pid and state == "Z":
                found.append(int(name))
        return found

    wait_for(lambda: not defunct_children(), timeout=5, what="no defunct horse beside the idle worker")
    time.sleep(0.5)
    assert not defunct_children(), procs.log(worker)


def test_a_lease_worker_takes_its_next_job_only_once_the_horse_has_ended_its_run(
    r: redis.Redis, redis_url: str, procs: Processes, tmp_path: Path
) -> None:
    """The horse's word comes after its run, never before: the next job's run starts
    after the last trace of the one before it (each run in its own horse)."""
    logs = [str(tmp_path / f"run{i}.log") for i in range(2)]
    queue = Queue(connection=r)
    jobs = [queue.enqueue("jobs.ticking_run", log, 0.6) for log in logs]
    worker = procs.worker(redis_url)
    wait_for(
        lambda: all(job.get_status(refresh=True) == "finished" for job in jobs),
        timeout=30,
        what="both jobs to finish",
    )
    ((_, first_last),) = run_spans(logs[0]).values()
    ((second_first, _),) = run_spans(logs[1]).values()
    assert first_last < second_first, procs.log(worker)
