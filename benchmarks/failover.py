"""Workers through a Redis Sentinel failover: what each failover kind costs, ours beside stock.

A primary, one replica and sentinels on loopback (rq_emq.testing.sentinel); ``--workers``
``rq worker -w CLASS -c settings`` processes (``SENTINEL = {...}``) on ``--jobs`` jobs of
1-2 s with a failure callback; ``--fault-at`` seconds after the first start, a
``SENTINEL FAILOVER`` (the old primary stays writable until Sentinel demotes it, up to
10 s later) or a SIGKILL of the primary; kind ``failback`` is a ``SENTINEL FAILOVER``, then,
``failback_after`` s (2) after the old primary has rejoined as the new one's replica
(demoted, resynced), a second one that moves the master back. Per trial:

- lost: jobs not finished once the run settles;
- reruns: runs beyond one per job (at-least-once allows them);
- spurious callbacks: failure callbacks of jobs that ended finished;
- overlaps: a run that started before an earlier run of the same job ended;
- idle after switch: per worker, from Sentinel naming the new primary (or the end of the
  worker's run then in progress) to its next start; the worst worker is reported (and
  the same from the failback's switch, ``idle after failback``);
- log lines: lines the workers logged after the fault that are not a job's own
  (tracebacks counted apart, a chained exception once, less RQ's own one for each run that
  ended in an error).

    python benchmarks/failover.py [--trials 2] [--kinds failover,kill] [--classes ours,simple,stock]

``--min-replicas-to-write 1`` sets ``min-replicas-to-write 1`` / ``min-replicas-max-lag 2``
(docs/operating.md's recipe) on both servers first; kind ``none`` runs no fault (the cost
of the setting where nothing fails: commands and wall time per job).
"""

from __future__ import annotations

import argparse
import os
import random
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import redis
from rq import Callback, Queue

from rq_emq.testing.sentinel import SentinelGroup

HERE = Path(__file__).resolve().parent
RQ_BIN = str(Path(sys.executable).parent / "rq")
CLASSES = {"ours": "rq_emq.LeaseWorker", "simple": "rq_emq.SimpleLeaseWorker", "stock": "rq.Worker"}
#: The lease the issue's measurement used (a short one makes the failover window matter).
LEASE_ENV = {"RQ_EMQ_LEASE_MS": "2000", "RQ_EMQ_RENEW_INTERVAL_MS": "400", "RQ_EMQ_SWEEP_INTERVAL_MS": "625"}
#: Lines a worker logs for every job it runs: not counted as failover noise.
#: When the old primary's clients are counted, after Sentinel names the new one...
PROBE_S = 1.5
#: ...and for how much longer while some remain: a loaded host (CI installs venvs beside the
#: suite) left one worker connection there at 1.5 s; one still there after this is a leak.
PROBE_PATIENCE_S = 5.0
JOB_LINES = ("Job OK", "Result is kept", "Result will never expire", "default: ", "Successfully completed")


@dataclass
class Trial:
    kind: str
    #: The worker class, or several joined by "+" (the workers take them in turn).
    worker_class: str
    jobs: int
    lost: int
    reruns: int
    spurious_callbacks: int
    overlaps: int
    idle_after_switch_s: float
    log_lines: int
    tracebacks: int
    moved_lines: int
    #: Worker connections still open on the old primary PROBE_S (+ PROBE_PATIENCE_S while
    #: some remain) after the switch (-1: it is dead).
    old_primary_clients: int
    #: Commands the primary ran per job (INFO commandstats, kind none only: -1 otherwise),
    #: and the wall time from the first start to the last job finished, per job.
    commands_per_job: float = -1.0
    wall_per_job_s: float = 0.0
    #: Writes the servers refused with NOREPLICAS (min-replicas-to-write), from the worker logs.
    noreplicas_lines: int = 0
    #: Kind failback: the worst worker's idle time after the second switch, and how long after
    #: the first switch the old primary was back as a replica online (-1: no failback).
    idle_after_failback_s: float = -1.0
    rejoined_after_s: float = -1.0
    #: Lines saying takes went on without a replica's acknowledgement (the take gate off).
    unacknowledged_lines: int = 0
    #: Kind failback: runs started between the second SENTINEL FAILOVER and Sentinel naming
    #: the new primary, i.e. takes granted by the master being demoted (the gate on hands
    #: each back unless a replica acknowledged it), and the pick-up gap: the longest time
    #: no job started across all workers from that command on.
    failback_window_starts: int = -1
    failback_gap_s: float = -1.0
    #: The same pick-up gap from the (first) fault's command on, up to a failback's.
    fault_gap_s: float = -1.0
    #: The logged tracebacks themselves (each cut to its innermost frames), so that a failed
    #: check names what was raised: the trial's directory is gone by then.
    traceback_text: str = ""


def _runs(log: Path) -> list[tuple[str, str, str, float]]:
    if not log.exists():
        return []
    rows = []
    for line in log.read_text().splitlines():
        what, job_id, worker, at = line.split()
        rows.append((what, job_id, worker, float(at)))
    return rows


def _idle_after(rows: list[tuple[str, str, str, float]], switch_at: float, workers: list[str]) -> float:
    """The worst worker's wait from the switch (or its run then in progress) to its next start."""
    worst = 0.0
    for worker in workers:
        mine = sorted((at, what) for what, _, w, at in rows if w == worker)
        after = [at for at, what in mine if what == "start" and at > switch_at]
        if not after:
            continue
        ends = [at for at, what in mine if what == "end" and at <= after[0]]
        worst = max(worst, after[0] - max(switch_at, ends[-1] if ends else switch_at))
    return worst


def _gap_after(rows: list[tuple[str, str, str, float]], since: float) -> float:
    """The longest time from ``since`` on during which no job started on any worker."""
    starts = sorted(at for what, _, _, at in rows if what == "start" and at >= since)
    gaps = [b - a for a, b in zip([since, *starts], starts, strict=False)]
    return max(gaps, default=0.0)


def _overlaps(rows: list[tuple[str, str, str, float]]) -> int:
    count = 0
    by_job: dict[str, list[tuple[float, float | None]]] = {}
    for what, job_id, _worker, at in sorted(rows, key=lambda row: row[3]):
        spans = by_job.setdefault(job_id, [])
        if what == "start":
            spans.append((at, None))
            continue
        if what == "end":
            for i in range(len(spans) - 1, -1, -1):
                if spans[i][1] is None:
                    spans[i] = (spans[i][0], at)
                    break
    for spans in by_job.values():
        for (_, end), (start, _) in zip(spans, spans[1:], strict=False):
            count += end is not None and end > start
    return count


def trial(
    directory: Path,
    kind: str,
    worker_class: str,
    workers: int = 3,
    jobs: int = 30,
    fault_at: float = 4.0,
    sentinels: int = 3,
    settle_s: float = 40.0,
    job_seconds: tuple[float, float] = (1.0, 2.0),
    min_replicas: int = 0,
    failback_after: float = 2.0,
) -> Trial:
    directory.mkdir(parents=True, exist_ok=True)
    group = SentinelGroup(directory / "sentinel", count=sentinels)
    processes: list[subprocess.Popen[bytes]] = []
    if min_replicas:
        for server in (group.primary, group.replica):  # either may be the primary later
            admin = redis.Redis(port=server.port)
            admin.config_set("min-replicas-to-write", min_replicas)
            admin.config_set("min-replicas-max-lag", 2)
    try:
        (directory / "failover_settings.py").write_text(group.settings_text())
        log = directory / "runs.log"
        r = group.client()
        queue = Queue(connection=r)
        ids = [
            queue.enqueue(
                "failover_jobs.work",
                str(log),
                random.uniform(*job_seconds),
                on_failure=Callback("failover_jobs.on_failure"),
                meta={"log": str(log)},
                job_timeout=120,
            ).id
            for _ in range(jobs)
        ]
        r.connection_pool.disconnect()  # this process's own connection is not a worker's
        env = dict(
            os.environ,
            PYTHONPATH=os.pathsep.join(
                filter(None, [str(HERE), str(directory), os.environ.get("PYTHONPATH")])
            ),
            **LEASE_ENV,
        )
        names = [f"w{i}" for i in range(workers)]
        classes = worker_class.split("+")
        for i, name in enumerate(names):
            out = open(directory / f"{name}.log", "wb")
            processes.append(
                subprocess.Popen(
                    [RQ_BIN, "worker", "-w", classes[i % len(classes)], "-c", "failover_settings", "default"],
                    env={**env, "FAILOVER_WORKER": name},
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    cwd=str(directory),
                    start_new_session=True,
                )
            )
        _wait(lambda: any(row[0] == "start" for row in _runs(log)), 30)
        first_start = time.monotonic()
        if kind == "none":
            redis.Redis(port=group.primary_port()).config_resetstat()
        time.sleep(fault_at)
        old = group.primary_port()
        sizes = {name: (directory / f"{name}.log").stat().st_size for name in names}
        old_clients, switch_at = -1, time.time()
        back_at, rejoined_after, back_command_at = -1.0, -1.0, -1.0
        fault_command_at = time.time()
        if kind != "none":
            group.kill_primary() if kind == "kill" else group.failover()
            old_server = group.primary
            group.wait_switch(old)
            switch_at = time.time() - (time.monotonic() - group.switched_at)
            time.sleep(max(0.0, group.switched_at + PROBE_S - time.monotonic()))
            if kind == "failover":
                patience = time.monotonic() + PROBE_PATIENCE_S
                old_clients = _worker_clients(old_server.port)
                while old_clients and time.monotonic() < patience:
                    time.sleep(0.1)
                    old_clients = _worker_clients(old_server.port)
        if kind == "failback":
            rejoined_after = group.wait_replica_online() - group.switched_at
            time.sleep(failback_after)
            new = group.primary_port()
            back_command_at = time.time()
            group.failover_when_possible()
            group.wait_switch(new)
            back_at = time.time() - (time.monotonic() - group.switched_at)
        fresh = group.client()
        done = lambda: all(_status(fresh, job_id) == "finished" for job_id in ids)  # noqa: E731
        _wait(done, settle_s, quiet=True)
        wall_per_job = (time.monotonic() - first_start) / jobs
        commands = -1.0
        if kind == "none":
            stats = redis.Redis(port=group.primary_port()).info("commandstats")
            commands = sum(int(v.get("calls", 0)) for v in stats.values()) / jobs
        time.sleep(1.0)  # late callbacks and a last sweep round
        rows = _runs(log)
        statuses = {job_id: _status(fresh, job_id) for job_id in ids}
        started = {job_id for what, job_id, _, _ in rows if what == "start"}
        noise = [_new_lines(directory / f"{name}.log", sizes[name]) for name in names]
        lines = [line for chunk in noise for line in chunk if not any(tag in line for tag in JOB_LINES)]
        return Trial(
            kind=kind,
            worker_class=worker_class,
            jobs=jobs,
            lost=sum(status != "finished" for status in statuses.values()),
            reruns=sum(what == "start" for what, *_ in rows) - len(started),
            spurious_callbacks=sum(
                what == "failure_callback" and statuses.get(job_id) == "finished"
                for what, job_id, _, _ in rows
            ),
            overlaps=_overlaps(rows),
            idle_after_switch_s=round(
                _idle_after([r for r in rows if back_at < 0 or r[3] < back_at], switch_at, names), 2
            ),
            idle_after_failback_s=round(_idle_after(rows, back_at, names), 2) if back_at > 0 else -1.0,
            rejoined_after_s=round(rejoined_after, 2),
            unacknowledged_lines=sum("without a replica's acknowledgement" in line for line in lines),
            failback_window_starts=sum(
                what == "start" and back_command_at <= at < back_at for what, _, _, at in rows
            )
            if back_at > 0
            else -1,
            failback_gap_s=round(_gap_after(rows, back_command_at), 2) if back_at > 0 else -1.0,
            fault_gap_s=round(
                _gap_after([r for r in rows if back_at < 0 or r[3] < back_command_at], fault_command_at), 2
            ),
            log_lines=len(lines),
            # RQ logs a traceback of its own for a run that ended in an error (stopped on a
            # lost lease, its outcome unwritable for a whole lease): one per run, not per retry
            tracebacks=len(_traceback_starts(lines))
            - sum("exception raised while executing" in line for line in lines),
            moved_lines=sum("master moved to" in line for line in lines),
            old_primary_clients=old_clients,
            commands_per_job=round(commands, 1),
            wall_per_job_s=round(wall_per_job, 3),
            noreplicas_lines=sum("NOREPLICAS" in line for line in lines),
            traceback_text=_tracebacks(lines),
        )
    finally:
        for process in processes:
            try:
                os.killpg(process.pid, 9)
            except ProcessLookupError:
                pass
            process.wait()
        group.stop()


def _worker_clients(port: int) -> int:
    """Connections to the server on ``port`` that are neither a sentinel's nor replication's."""
    probe = redis.Redis(port=port, socket_timeout=2, single_connection_client=True)
    try:
        # this probe's own connection is told apart by its id: Redis 6.2 names its command
        # "client", 7 "client|list"
        me, clients = probe.client_id(), probe.client_list()
    except redis.RedisError:
        return -1
    finally:
        probe.close()
    return sum(
        not str(c.get("name", "")).startswith("sentinel-")
        and not set(str(c.get("flags", ""))) & {"S", "M"}
        and str(c.get("id")) != str(me)
        for c in clients
    )


#: Lines that join a traceback to the one before it: one logged exception, chained.
CHAINED = ("During handling of the above exception", "The above exception was the direct cause")


def _traceback_starts(lines: list[str]) -> list[int]:
    """Where each logged traceback begins: a chained exception's later parts are the same entry."""
    starts = []
    for i, line in enumerate(lines):
        if "Traceback (most recent call last)" in line and not any(
            tag in previous for previous in lines[max(0, i - 3) : i] for tag in CHAINED
        ):
            starts.append(i)
    return starts


def _tracebacks(lines: list[str]) -> str:
    """Each logged traceback: what logged it, then its innermost frames and the exception
    (the entry runs to the next log record, which starts with RQ's ``HH:MM:SS`` stamp)."""
    excerpts = []
    for start in _traceback_starts(lines):
        end = start + 1
        while end < len(lines) and not re.match(r"\d\d:\d\d:\d\d ", lines[end]):
            end += 1
        entry = [line for line in lines[max(0, start - 1) : end] if line.strip()]
        excerpts.append("\n".join(entry[:2] + ["  ..."] + entry[-5:] if len(entry) > 9 else entry))
    return "\n--\n".join(excerpts)


def _new_lines(path: Path, offset: int) -> list[str]:
    with open(path, "rb") as log:
        log.seek(offset)
        return log.read().decode(errors="replace").splitlines()


def _status(r: redis.Redis, job_id: str) -> str | None:
    try:
        value = r.hget(f"rq:job:{job_id}", "status")
    except redis.RedisError:
        return None
    return value.decode() if value else None


def _wait(predicate: object, timeout: float, quiet: bool = False) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():  # type: ignore[operator]
            return
        time.sleep(0.1)
    if not quiet:
        raise TimeoutError("timed out")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--trials", type=int, default=2)
    parser.add_argument("--kinds", default="failover,kill", help="of none, failover, kill, failback")
    parser.add_argument("--classes", default="ours,simple,stock")
    parser.add_argument("--workers", type=int, default=3)
    parser.add_argument("--jobs", type=int, default=30)
    parser.add_argument(
        "--settle", type=float, default=40.0, help="seconds after the (last) switch for every job to end"
    )
    parser.add_argument(
        "--min-replicas-to-write", type=int, default=0, help="set it (and min-replicas-max-lag 2) first"
    )
    args = parser.parse_args()
    print(
        "| kind | worker | min-replicas-to-write | lost | reruns | spurious callbacks | overlaps "
        "| idle after switch | log lines (tracebacks) | NOREPLICAS lines | commands / job | wall / job "
        "| pick-up gap | failback: gap, idle after switch, takes in its window |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for kind in args.kinds.split(","):
        for short in args.classes.split(","):
            for _ in range(args.trials):
                with tempfile.TemporaryDirectory(prefix="rq-emq-failover-") as tmp:
                    t = trial(
                        Path(tmp),
                        kind,
                        CLASSES[short],
                        workers=args.workers,
                        jobs=args.jobs,
                        min_replicas=args.min_replicas_to_write,
                        settle_s=args.settle,
                    )
                cost = "-" if t.commands_per_job < 0 else f"{t.commands_per_job:.1f}"
                print(
                    f"| {kind} | {short} | {args.min_replicas_to_write} | {t.lost}/{t.jobs} | {t.reruns} | "
                    f"{t.spurious_callbacks} | {t.overlaps} | {t.idle_after_switch_s:.2f} s | "
                    f"{t.log_lines} ({t.tracebacks}) | {t.noreplicas_lines} | {cost} | "
                    f"{t.wall_per_job_s:.3f} s | {t.fault_gap_s:.2f} s | "
                    + (
                        f"{t.failback_gap_s:.2f} s, {t.idle_after_failback_s:.2f} s, "
                        f"{t.failback_window_starts} |"
                        if t.idle_after_failback_s >= 0
                        else "- |"
                    ),
                    flush=True,
                )


if __name__ == "__main__":
    main()
