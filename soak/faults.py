"""What the soak does to workers and Redis, and the record it keeps of each fault.

Kinds (the victim is a worker that is running a job, when the kind needs one):

- ``kill_worker``: SIGKILL the worker process only (a LeaseWorker's horse dies with it;
  a stock RQ horse, in its own process group, runs on);
- ``kill_group``: SIGKILL worker and horse together (a node or container lost);
- ``kill_horse``: SIGKILL the work horse only, at any moment of its life (stock RQ fails
  the job: "work-horse terminated"; a lease worker recovers it at once, attempt counted);
- ``oom_horse``: SIGKILL the work horse only while its job function runs, as the OOM
  killer does to the process holding the job's memory: a lease worker must have the job
  back in its queue within ``CRASH_BOUND_S`` of the kill;
- ``stop_short`` / ``stop_long``: SIGSTOP worker and horse, SIGCONT after less than the
  grace (the lease outlives the pause) or after more (the job is recovered elsewhere);
- ``client_kill``: ``CLIENT KILL`` every Redis connection of the worker and its horse;
- ``cut_short`` / ``cut_long``: the worker's TCP proxy cuts it off (reset or blackhole),
  healed after less or more than the grace;
- ``restart``: Redis is SIGKILLed and restarted from its AOF (``appendfsync always``);
- ``lose_data`` (only with ``--lose-data``): Redis is SIGKILLed and restarted without its
  AOF, empty, as a server without persistence restarts; the producer then resubmits every
  plain job it had enqueued under its id (lifecycle units are lost with Redis). The checks
  judge a resubmitted job by its runs since the loss, and a lost one not at all; no two
  runs may overlap across the loss, and every run's fencing token since is above every
  one before it (soak/dataloss.py);
- the faults that let a run go on while its job runs elsewhere unless the holder fences
  itself (issue 11), each hitting a worker whose horse is mid-job (its job function began
  and has not returned), held past the lease:
  - ``hang``: the worker's proxy holds Redis's replies without closing anything: renewals
    still reach Redis, the client waits on its socket timeout for each answer;
  - ``stop_worker``: SIGSTOP of the worker alone; its horse runs on, nobody renews;
  - ``partition_long``: the worker's proxy blackholes both ways (``cut_long`` is the same
    fault with a reset or a blackhole, and may hit a horse between jobs).

The faults of issue 46 (one process the witness of every run's end):

- ``enqueue_again``: a running job enqueued again, as a web process does it (RQ's
  ``enqueue_job`` of a copy it fetched, or ``enqueue(..., job_id=)`` under its id): its
  copy must wait for the old run's end (no overlap), and no recovery comes of it
  (:mod:`soak.witnesscheck`);
- ``cold_stop``: RQ's cold shutdown, a SIGTERM and, a little over a second later (RQ
  ignores a second signal within a second), another: the worker stops its job and exits.
  On a ``SimpleLeaseWorker`` whose job runs its work on threads (the ``pool`` and
  ``thread`` bodies, :mod:`soak.jobs`) the frame unwinds while the threads work on: the
  job may move only once the process is gone;
- ``slow_log``: the worker started with ``--logging_level DEBUG`` and a log handler of
  its own (:mod:`soak.slowlog`) has that handler take seconds per record for a while
  (a log shipper gone slow): nothing of it may reach the renewals, so no healthy job is
  recovered or stopped because of it;
- a worker-only kill is ``kill_worker``: its watchdog outlives it, sees the death and
  hands the job back at once (``recover_crashed_job``), within the seen-death bound
  (1 s, as for a horse crash) rather than the lease's.

The soak also records a ``crash`` when a worker exits that it did not kill: a worker that
dies of what a fault did to it has died, and its job may run again; the report counts them.
"""

from __future__ import annotations

import os
import signal
from dataclasses import dataclass, field
from pathlib import Path

import redis

#: Kinds after which a job's run may legitimately be repeated (the run's holder died, or
#: was away past the grace). The others must never cause a second run: a Redis restart
#: is kept shorter than the grace, so no lease lapses in it.
REPEAT_EXCUSED = {
    "kill_worker",
    "kill_group",
    "kill_horse",
    "oom_horse",
    "stop_long",
    "cut_long",
    "crash",
    "hang",
    "stop_worker",
    "partition_long",
    "restart_long",  # a restart that outlasted the grace (repeats.long_restart renames it so)
    "failover",  # Sentinel mode (soak/sentinel.py): within its window, soak/failovercheck.py
    "kill_master",
    "stock_exit",  # a stock neighbour that quit (a Redis error): its job is RQ's to redo
    "enqueue_again",  # the user asked for another run: it follows the old one
    "cold_stop",  # the worker stopped its job and exited
}
#: Faults after which a worker may crash: RQ's worker quits on a Redis error outside its
#: dequeue, and a long cut outlasts the finish's patience (one lease). Any other crash is a
#: finding: the soak then fails, however well the job itself came through.
CRASH_EXCUSED = {"cut_long", "partition_long", "hang"}
#: Kinds that kill the worker process itself, or make it exit (its exit is no crash).
KILLS = {"kill_worker", "kill_group", "cold_stop"}
#: Kinds whose worker dies while its watchdog lives: a death seen, its job handed back at
#: once (``recover_crashed_job``), within the seen-death bound from the kill.
SEEN_DEATHS = {"kill_worker"}
#: Kinds after which the job's lease lapses and the sweep must requeue it (the latency).
#: Not ``hang``: its renewals still reach Redis until the holder's own clock gives up on
#: them, so its lease lapses up to a lease later than the fault, past the bound.
LAPSING = {"kill_worker", "kill_group", "stop_long", "cut_long", "stop_worker", "partition_long"}
#: Kinds whose job its own (living) worker recovers at once, without a lapse: a horse crash.
CRASHING = {"oom_horse"}
#: Kinds held for a while and lifted by a timer (SIGCONT, heal), which records their end.
HELD = {
    "stop_short",
    "stop_long",
    "cut_short",
    "cut_long",
    "hang",
    "stop_worker",
    "partition_long",
    "slow_log",  # lifted by making the handler quick again
    "cold_stop",  # its second SIGTERM comes by timer
}
#: Kinds whose victim must be mid-job: the job function began in the horse and has not returned.
MID_JOB = {"hang", "stop_worker", "partition_long", "oom_horse", "enqueue_again", "slow_log"}
#: Kinds that a ``SimpleLeaseWorker`` (no horse: the run is the worker process) can take;
#: the others need a horse apart from its worker.
SIMPLE_KINDS = {
    "kill_worker",
    "kill_group",
    "stop_short",
    "stop_long",
    "client_kill",
    "cut_short",
    "cut_long",
    "hang",
    "partition_long",
    "cold_stop",
    "enqueue_again",
}
#: Kinds that hit a SimpleLeaseWorker whose job runs on threads whenever one does (threads
#: in a simple-mode job, issue 46): its frame unwinds or its process dies, its threads with it
#: only if the process ends.
STOPS_THREADS = {"cold_stop", "kill_worker", "kill_group"}
#: Kinds that only the workers started with ``--logging_level DEBUG`` and the slow
#: handler (``--debug-workers``) can take.
DEBUG_ONLY = {"slow_log"}
#: Kinds that hit every worker at once: a repeat they explain need not be on the victim's pid.
GLOBAL = {"restart_long", "failover", "kill_master"}
#: Sentinel mode only (``--sentinel``): ``SENTINEL FAILOVER``, and SIGKILL of the current
#: master (restarted as a replica once Sentinel named the new one). Scheduled, not drawn.
SENTINEL_KINDS = ("failover", "kill_master")
#: Kinds that need a worker's TCP proxy, or the single server's restart: not in Sentinel
#: mode, where a worker connects to whatever address Sentinel names (no proxy in between).
#: ``slow_log`` too: its worker reads its handler from an RQ settings module (``-c``), and a
#: Sentinel-mode worker reads its Sentinel from one.
NOT_WITH_SENTINEL = {"cut_short", "cut_long", "hang", "partition_long", "restart", "lose_data", "slow_log"}
#: Scheduled once, only when asked for (``--lose-data``): most checks read what Redis kept.
OPT_IN = ("lose_data",)
KINDS = (
    "kill_worker",
    "kill_group",
    "kill_horse",
    "oom_horse",
    "stop_short",
    "stop_long",
    "client_kill",
    "cut_short",
    "cut_long",
    "restart",
    "hang",
    "stop_worker",
    "partition_long",
    "enqueue_again",
    "cold_stop",
    "slow_log",
)


@dataclass
class Fault:
    kind: str
    started: float
    slot: str = ""
    worker_pid: int | None = None
    horse_pids: list[int] = field(default_factory=list)
    job_id: str | None = None
    #: the holder's lease token at the fault (lease mode), to see the job change hands
    token: bytes | None = None
    ended: float | None = None
    #: when the job's lease lapses, from the lock's PTTL sampled once the fault took hold
    lapse_at: float | None = None
    #: when the watcher first saw the job taken from its holder (recovered by the sweep)
    requeued_at: float | None = None
    detail: str = ""
    #: Sentinel mode: when every sentinel named the new master (unix time), and per worker
    #: name the seconds from then until it was back on the new master (None: never seen)
    switched_at: float | None = None
    rejoined: dict[str, float | None] = field(default_factory=dict)

    def hit(self, pid: int) -> bool:
        return pid == self.worker_pid or pid in self.horse_pids

    def covers(self, start: float, end: float) -> bool:
        """The fault began before ``end`` and had not ended before ``start``."""
        return self.started <= end and (self.ended is None or self.ended >= start)


def horses(pid: int) -> list[int]:
    """The children of worker ``pid`` that lead a process group of their own: its horse
    (RQ puts each in its own group; a ``LeaseWorker``'s next horse, forked ahead, too), not
    RQ's scheduler process (it stays in the worker's group) nor the watchdog. The watchdog
    leads a session of its own (so that a kill of the worker's group leaves it to end the
    run), but it is no horse: a fault that kills it with the worker and the horse took
    away what ends the job's own children, which ran on beside the job's next run."""
    found = []
    for child in children(pid):
        try:
            stat = Path(f"/proc/{child}/stat").read_text()
            program = Path(f"/proc/{child}/cmdline").read_bytes()
        except OSError:
            continue
        if int(stat.rsplit(")", 1)[1].split()[2]) == child and b"watchdog.py" not in program:
            found.append(child)
    return found


def is_watchdog(pid: int) -> bool:
    """``pid`` is a worker's watchdog (rq_emq/run/watchdog.py, run as a script)."""
    try:
        return b"watchdog.py" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


def seen_death(fault: Fault) -> bool:
    """A death whose job its witness hands back at once, so the bound runs from the kill: a
    horse crash its worker saw, or a worker killed while its watchdog lived."""
    return fault.kind in CRASHING or (fault.kind in SEEN_DEATHS and fault.detail.startswith("watchdog"))


def children(pid: int) -> list[int]:
    """Direct children of ``pid``."""
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
        return [int(p) for p in text.split()]
    except OSError:
        pass
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(entry.name))
    return found


def send(sig: signal.Signals, *pids: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


def _socket_inodes(pid: int) -> set[str]:
    inodes = set()
    try:
        for fd in Path(f"/proc/{pid}/fd").iterdir():
            try:
                target = os.readlink(fd)
            except OSError:
                continue
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    except OSError:
        pass
    return inodes


def redis_addresses(pids: list[int], redis_port: int) -> list[str]:
    """``127.0.0.1:<port>`` of every TCP connection from ``pids`` to Redis on ``redis_port``."""
    inodes: set[str] = set()
    for pid in pids:
        inodes |= _socket_inodes(pid)
    out: list[str] = []
    try:
        lines = Path("/proc/net/tcp").read_text().splitlines()[1:]
    except OSError:
        return out
    for line in lines:
        parts = line.split()
        local, remote, inode = parts[1], parts[2], parts[9]
        if inode in inodes and int(remote.split(":")[1], 16) == redis_port:
            out.append(f"127.0.0.1:{int(local.split(':')[1], 16)}")
    return out


def client_kill(client: redis.Redis, addresses: list[str]) -> int:
    killed = 0
    for address in addresses:
        try:
            killed += int(client.execute_command("CLIENT", "KILL", "ADDR", address))
        except redis.ResponseError:  # that connection closed meanwhile
            pass
    return killed
