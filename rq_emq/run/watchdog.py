"""The watchdog: one small process per worker that ends a run past its local lease
deadline, whatever the worker and the run are doing.

The lease clock and the horse's fence are Python threads: a job holding the GIL in C
code (a regex backtracking, a long NumPy call) starves them, and a SIGSTOPped worker runs
none of its own. The watchdog is a process of its own, started by the worker as it starts:
this file run by a fresh interpreter (``python -I -S``: the standard library and this
module's two neighbours, nothing of the worker's; about 5 MB of memory of its own),
mapping the memory of :class:`rq_emq.run.horse_fence.HorseDeadline` that the worker hands it
by descriptor: the run's pid, its deadline, whether its outcome has landed. It sleeps
until the deadline (a ``sigtimedwait``, on ``CLOCK_MONOTONIC`` as the deadline is), reads
it again (a renewal moves it later), and once it has passed ends the run whole
(:func:`rq_emq.run.process_tree.kill_tree`): the horse's group and descendants, or, for a
``SimpleLeaseWorker``, the worker process and its descendants. It wakes once per deadline
while a run lives and never while the worker is idle; it holds no Redis connection (it
inherits no descriptor but stdio and the memory's).

It leads a session of its own, so that a signal to the worker's process group does not
reach it: a supervisor that kills the worker's group (supervisord's ``killasgroup``,
``kill -9 -PGID``) kills the worker, and its watchdog then ends the horse, which RQ
starts in a session of its own, out of that group's reach, where nothing else but the
horse's own fence thread would stop it. It dies with its worker (``PDEATHSIG``), and as
it goes it ends a forked horse whole: a
horse gets no ``PDEATHSIG`` of its own, so that the watchdog still finds the horse's
descendants (the kernel would re-parent them as it ended the horse); its lifeline
(:mod:`rq_emq.run.lifeline`), whose write end the watchdog holds, fires only once the
watchdog is gone too. It ignores SIGINT and SIGTERM: a warm stop (Ctrl+C, systemd's SIGTERM to the whole
group) lets the running job finish, and the job stays guarded until then.

For a ``SimpleLeaseWorker``, whose job runs in the process that renews, it also renews in
the worker's place when the worker's renewals are late and the process runs
(:mod:`.stand_in`): a job holding the GIL keeps its lease.

Signals it waits for: ``POKE`` (a new run, re-read now: from a forked horse as it starts,
which tells it itself since a starved worker may be frozen before any step of its own
after the fork, or from a ``SimpleLeaseWorker`` as its run begins) and ``GONE`` (its
worker died). A run's start pokes it only when it would not read the memory by the run's
deadline anyway: it publishes when its wait ends (``HorseDeadline.wakes_at``; reading and
publishing under the memory's lock), and while it sleeps until an earlier run's deadline
the runs that start meanwhile need no poke (about one per lease, not one per job).
"""

from __future__ import annotations

import math
import os
import signal
import sys
import time
from typing import Any

if __package__:
    from . import seen_death
    from .horse_fence import POKE, HorseDeadline
    from .process_tree import kill_tree, libc, parent_and_group, state
    from .stand_in import StandIn
else:  # the watchdog's own interpreter: this file as a script, its neighbours by path
    sys.path.append(os.path.dirname(os.path.abspath(__file__)))
    import seen_death  # type: ignore[no-redef]
    from horse_fence import POKE, HorseDeadline  # type: ignore[no-redef]
    from process_tree import kill_tree, libc, parent_and_group, state  # type: ignore[no-redef]
    from stand_in import StandIn  # type: ignore[no-redef]

GONE = signal.SIGHUP
_PR_SET_PDEATHSIG = 1
#: How soon the watchdog reads the memory again when a run's start held its lock.
LOCK_RETRY_S = 0.01
#: blocked from the start: a poke, a hangup or a Ctrl+C in its first instants must not end it
_BLOCKED = {POKE, GONE, signal.SIGINT, signal.SIGTERM}


class Watchdog:
    """The worker's handle on its watchdog process."""

    def __init__(
        self, deadline: HorseDeadline, group: bool, kit: bytes | None = None, lifeline_fd: int = -1
    ) -> None:
        """``group``: the runs lead process groups of their own (horses); else the run is
        the worker process itself (``SimpleLeaseWorker``). ``kit``: what it needs to hand
        the worker's lease back should the worker die (:mod:`.seen_death`), sent on its
        stdin as it starts. ``lifeline_fd``: the write end of the worker's lifeline
        (:mod:`.lifeline`), which it holds, unread, for as long as it lives."""
        self.deadline = deadline
        self.group = group
        self.kit = kit
        self.lifeline_fd = lifeline_fd
        self.pid = 0
        #: stopped on purpose (the worker stops): its keeper starts no other
        self.stopping = False
        self._process: Any = None  # its subprocess.Popen

    def start(self) -> None:
        import subprocess  # the worker's; the watchdog's own interpreter never loads it

        self.stopping = False
        fd = self.deadline.open_fd()
        args = [str(fd), str(os.getpid()), "1" if self.group else "0"]
        # the signal mask survives the exec: blocked until the watchdog waits for them
        mask = signal.pthread_sigmask(signal.SIG_BLOCK, _BLOCKED)
        try:
            self._process = subprocess.Popen(
                [sys.executable, "-I", "-S", os.path.abspath(__file__), *args],
                pass_fds=(fd, self.lifeline_fd) if self.lifeline_fd >= 0 else (fd,),
                stdin=subprocess.PIPE if self.kit else subprocess.DEVNULL,
                # out of the worker's process group: a kill of that group (a supervisor's
                # killasgroup, ``kill -9 -PGID``) ends the worker, not its watchdog, which
                # then ends the horse (in a session of its own, out of the group's reach too)
                start_new_session=True,
            )
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, mask)
            os.close(fd)
        if self.kit and self._process.stdin is not None:
            try:  # it reads the whole kit before anything else (tens of kB: a pipe's buffer)
                self._process.stdin.write(self.kit)
                self._process.stdin.close()
            except OSError:  # it died at once: the next tick replaces it
                pass
        self.pid = self._process.pid
        self.deadline.watchdog_pid = self.pid  # a horse wakes it (HorseDeadline.run_started_here)

    def poke(self) -> None:
        """Tell the watchdog a run began: it re-reads the shared memory now."""
        if self.pid:
            try:
                os.kill(self.pid, POKE)
            except ProcessLookupError:
                pass

    @property
    def alive(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def wait(self) -> None:
        """Until this watchdog process is gone (the GIL released meanwhile)."""
        process = self._process
        if process is not None:
            process.wait()

    def stop(self) -> None:
        """As the worker stops (no run in flight any more)."""
        self.stopping = True
        if self._process is not None:
            self.deadline.watchdog_pid = 0
            self._process.kill()
            self._process.wait()
            self._process = None
            self.pid = 0


def main(argv: list[str]) -> None:
    """The watchdog process: ``<memory fd> <worker pid> <1: runs are horses>``."""
    fd, worker, group = int(argv[0]), int(argv[1]), argv[2] == "1"
    for ignored in (signal.SIGINT, signal.SIGTERM):
        signal.signal(ignored, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT, signal.SIGTERM})
    kit = None
    try:
        import json

        text = sys.stdin.buffer.read() if sys.stdin is not None else b""
        kit = json.loads(text) if text else None
    except (OSError, ValueError):
        pass  # no kit: a dead worker's lease is left to the sweep
    _run(HorseDeadline(fd=fd), worker, group, kit)


def _run(deadline: HorseDeadline, worker: int, group: bool, kit: dict[str, Any] | None = None) -> None:
    """From the start until its worker is gone."""
    try:
        libc().prctl(_PR_SET_PDEATHSIG, GONE, 0, 0, 0)
    except AttributeError:
        pass
    ended = 0  # the pid of the last run ended, so it is ended once
    # a SimpleLeaseWorker's job runs in the worker: the processes it starts are in the
    # worker's group, which is the run's to end as the worker dies, if the worker leads it
    # (else the group is its launcher's, not the run's)
    worker_leads_group = not group and _leads_group(worker)
    # a SimpleLeaseWorker's job may starve the thread that renews: the watchdog stands in
    stand_in = StandIn(kit, worker) if not group and kit and "renew_sha" in kit else None
    while True:
        if os.getppid() != worker:  # the worker is gone: end its run, hand its lease back, go
            pid, killed = deadline.pid, set()
            if group and pid and _leads_group(pid):
                killed = kill_tree(pid, group=True)
                _say(f"worker {worker} is gone: ended its horse pid {pid} ({len(killed)} processes)")
            elif group and pid:
                # the horse died with its worker (killed together): what is left of its
                # group (a pgid is never reused while a member lives)
                _killpg(pid)
            elif worker_leads_group:
                _killpg(worker)  # its job's processes, orphaned by the worker's death
            _hand_back(deadline, kit, worker, killed, pid if group else (worker if worker_leads_group else 0))
            return
        with deadline.locked() as held:
            pid, due = _read(deadline)
            renew_at = None
            if stand_in is not None and pid == worker and pid != ended and math.isfinite(due):
                due, renew_at = stand_in.plan(deadline, due)
            wait: float | None = None
            if pid and pid != ended and math.isfinite(due):
                wait = due - time.monotonic()
            if renew_at is not None and wait is not None and wait > 0:
                wait = min(wait, renew_at - time.monotonic())
                renew_now = wait <= 0
            else:
                renew_now = False
            if not renew_now and (wait is None or wait > 0):
                if not held:  # a run's start holds the lock (a moment, or it froze): read again soon
                    wait = LOCK_RETRY_S if wait is None else min(wait, LOCK_RETRY_S)
                # what tells a run's start whether to poke (HorseDeadline.start_run)
                deadline.wakes_at = math.inf if wait is None else time.monotonic() + wait
        if renew_now:  # out of the lock: a run's start need not wait for Redis
            said = stand_in.renew(deadline, due)  # type: ignore[union-attr]
            if said:
                _say(said)
            continue
        if wait is not None and wait <= 0:
            if _is_run(pid, worker):
                if deadline.pid == pid:  # still the run read (not a next one's reset memory)
                    deadline.end_at_deadline()  # the worker reads this death as the clock's stop
                killed = kill_tree(pid, group=group and pid != worker)
                _say(f"run {pid} past its deadline by {-1000 * wait:.0f} ms: ended {len(killed)} processes")
            ended = pid
            continue
        if wait is None:
            signal.sigwaitinfo({POKE, GONE})
        else:
            signal.sigtimedwait({POKE, GONE}, wait)


def _hand_back(
    deadline: HorseDeadline, kit: dict[str, Any] | None, worker: int, killed: set[int], group: int
) -> None:
    """The lease the dead worker held, recovered, or handed back if the worker said so as
    a cold stop ended it (:mod:`.seen_death`), once the worker and every process of its run
    are seen gone; else (no kit, no lease, a process that would not go, Redis out of reach)
    left to the sweep."""
    text = deadline.held_lease()
    if kit is None or not text:
        return
    hand_back = deadline.hands_back
    until = time.monotonic() + seen_death.GONE_WITHIN_S
    while any(_alive(pid) for pid in killed | {worker}) or (group and _group_alive(group)):
        if time.monotonic() > until:
            _say("its run did not end: its lease is left to the sweep")
            return
        time.sleep(0.005)
    try:
        import json

        lease = json.loads(text)
        # what stopped the run, where the worker said so as it ended itself (a progress timeout)
        cause = lease.get("cause") or f"worker pid {worker} died (seen by its watchdog)"
        said = seen_death.recover(kit, lease, cause, hand_back=hand_back)
    except Exception as error:  # noqa: BLE001 (whatever went wrong, the sweep recovers it)
        _say(f"could not hand its lease back ({type(error).__name__}: {error}): left to the sweep")
        return
    _say(f"worker {worker} is gone: {said}")


def _alive(pid: int) -> bool:
    """Whether ``pid`` still runs (a zombie, dead but not reaped yet, runs no code)."""
    return state(pid) not in (b"", b"Z")


def _group_alive(pgid: int) -> bool:
    """Whether a process of group ``pgid`` still runs (zombies aside: whoever reaps the
    dead worker's orphans may be slow to)."""
    for name in os.listdir("/proc"):
        if name.isdigit() and parent_and_group(int(name))[1] == pgid and _alive(int(name)):
            return True
    return False


def _killpg(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _say(what: str) -> None:
    """One line on the worker's stderr (no logging here: its locks may be held by a
    thread of the worker that the fork did not copy)."""
    try:
        os.write(2, f"rq-emq watchdog {os.getpid()}: {what}\n".encode())
    except OSError:
        pass


def _read(deadline: HorseDeadline) -> tuple[int, float]:
    """The run's pid and deadline, read so that both belong to one run."""
    while True:
        pid = deadline.pid
        due = deadline.get()
        if deadline.pid == pid:
            return pid, due


def _is_run(pid: int, worker: int) -> bool:
    """``pid`` is the worker itself or its child (never a pid reused since the run ended)."""
    return pid == worker or parent_and_group(pid)[0] == worker


def _leads_group(pid: int) -> bool:
    return parent_and_group(pid)[1] == pid


if __name__ == "__main__":
    main(sys.argv[1:])
