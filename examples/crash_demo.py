"""A crashed worker's job, recovered: run ``python examples/crash_demo.py``.

Starts a private redis-server (or uses REDIS_URL), enqueues four jobs with a stock
``rq.Queue``, runs two ``rq worker -w rq_emq.LeaseWorker`` processes, SIGKILLs every
process of one of them mid-job (its watchdog, then the worker: as when its container or
its host is lost, no process of it left to see the death), and prints what Redis holds
as the lease lapses, the sweep marks the job, then puts it back, and the surviving worker
finishes it. It ends with a readout of which jobs stalled and where each landed. (A
worker killed alone is seen dying by its watchdog, which hands its job back at once:
tests/run/test_seen_death.py.)
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import redis
from rq import Queue

from rq_emq.keys import QueueKeys, job_key
from rq_emq.testing import NoRedisServer, private_redis, watchdogs_of

HERE = Path(__file__).resolve().parent
SETTINGS = {"RQ_EMQ_LEASE_MS": "2000", "RQ_EMQ_RENEW_INTERVAL_MS": "500", "RQ_EMQ_SWEEP_INTERVAL_MS": "1000"}
Q = QueueKeys("demo")
WORKER_NAMES = ("worker-a", "worker-b")
EVENTS = {
    "lapsed": "lock gone: the lease lapsed, nobody renews it",
    "marked": "marked stalled by a sweep (a grace pass: not recovered yet)",
    "recovered": "recovered by the next sweep: back at the front of its queue",
    "retaken": "worker-b started it: attempt 2, under a lease of its own",
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=3.0, help="how long each job works")
    options = parser.parse_args()

    try:
        with private_redis() as url:
            return run(url, options)
    except NoRedisServer as error:  # one line saying what to install, not a traceback
        print(f"crash_demo: {error}", file=sys.stderr)
        return 1


def run(url: str, options: argparse.Namespace) -> int:
    r = redis.Redis.from_url(url)
    r.delete(*(r.keys("emq:{demo}:*") or ["-"]), "rq:queue:demo")
    # A SIGKILLed worker-a of an earlier run leaves its registration for RQ's worker TTL (7 min),
    # and RQ refuses to start a second worker of that name: the names are this demo's own.
    for name in WORKER_NAMES:
        r.delete(f"rq:worker:{name}")
        r.srem("rq:workers", f"rq:worker:{name}")
        r.srem("rq:workers:demo", f"rq:worker:{name}")
    log_dir = Path(tempfile.mkdtemp(prefix="rq-emq-demo-logs-"))
    env = {
        **os.environ,
        **SETTINGS,
        "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]),
    }
    rq_bin = str(Path(sys.executable).parent / "rq")
    workers = {}
    t0 = time.monotonic()

    def say(text: str) -> None:
        print(f"[{time.monotonic() - t0:6.2f}s] {text}", flush=True)

    try:
        info = r.info("server")
        server = (
            f"Valkey {info['valkey_version']}"
            if "valkey_version" in info
            else f"Redis {info['redis_version']}"
        )
        say(f"{server} at {url}; settings {SETTINGS}")
        queue = Queue("demo", connection=r)
        jobs = [
            queue.enqueue("demo_jobs.work", options.seconds, str(log_dir / "runs.log"), job_timeout=60)
            for _ in range(options.jobs)
        ]
        say(f"enqueued {len(jobs)} jobs with a stock rq.Queue")
        for name in WORKER_NAMES:
            workers[name] = subprocess.Popen(
                [rq_bin, "worker", "-w", "rq_emq.LeaseWorker", "--url", url, "--name", name, "demo"],
                env=env,
                stdout=open(log_dir / f"{name}.log", "wb"),
                stderr=subprocess.STDOUT,
            )
        say("started worker-a and worker-b (rq worker -w rq_emq.LeaseWorker)")

        def running_on(name: str) -> str | None:
            for job in jobs:
                fields = r.hmget(job_key(job.id), "status", "worker_name")
                if fields[0] == b"started" and fields[1] == name.encode():
                    return job.id
            return None

        waiting_since = time.monotonic()
        while not running_on("worker-a"):
            if workers["worker-a"].poll() is not None or time.monotonic() - waiting_since > 60:
                say(f"worker-a ran no job; its log:\n{(log_dir / 'worker-a.log').read_text()}")
                return 1
            time.sleep(0.05)
        victim = running_on("worker-a")
        assert victim is not None
        time.sleep(0.5)
        for watchdog in watchdogs_of(workers["worker-a"].pid):
            os.kill(watchdog, signal.SIGKILL)
        workers["worker-a"].send_signal(signal.SIGKILL)
        killed = time.monotonic()
        say(
            f"SIGKILLed worker-a and its watchdog while it ran job {victim} (no process of it "
            "left to see the death; its work horse ends itself at its lease deadline)"
        )

        def show() -> None:
            lock_ttl = r.pttl(Q.lock(victim))
            say(
                f"  job {victim[:8]}: status={(r.hget(job_key(victim), 'status') or b'-').decode()}, "
                f"in flight={r.zscore(Q.leases, victim) is not None}, "
                f"lock={'gone' if lock_ttl < 0 else f'{lock_ttl} ms left'}, "
                f"marked={r.zscore(Q.stalled, victim) is not None}, "
                f"in queue={victim.encode() in r.lrange(Q.rq_queue, 0, -1)}, "
                f"attempts={(r.hget(job_key(victim), 'emq_attempts') or b'0').decode()}"
            )

        def explain_wait() -> None:
            # what the only worker left is doing, or a gap before the take looks like a hang
            busy_with = running_on("worker-b")
            if busy_with is not None and busy_with != victim:
                say(
                    f"  it waits at the front of the queue: worker-b (the only worker left) "
                    f"is still running job {busy_with[:8]}, and takes it next"
                )
            else:
                say(
                    "  it waits at the front of the queue: worker-b (the only worker left) "
                    "runs no job now, and takes it next"
                )

        show()
        moments: dict[str, float] = {}
        while r.hget(job_key(victim), "status") != b"finished" and time.monotonic() - killed < 60:
            attempts = int(r.hget(job_key(victim), "emq_attempts") or 0)
            status = r.hget(job_key(victim), "status")
            in_queue = r.lpos(Q.rq_queue, victim) is not None
            for event, happened in (
                ("lapsed", not r.exists(Q.lock(victim))),
                ("marked", r.zscore(Q.stalled, victim) is not None),
                ("recovered", in_queue or attempts >= 2),
                # a take leaves RQ's status `queued` until the work horse starts the run
                ("retaken", attempts >= 2 and status == b"started"),
            ):
                if happened and event not in moments:
                    moments[event] = time.monotonic()
                    say(EVENTS[event])
                    show()
                    if event == "recovered" and in_queue:
                        explain_wait()
            time.sleep(0.01)
        say(f"job {victim} finished by {r.hget(job_key(victim), 'worker_name').decode()}")
        while (
            any(r.hget(job_key(j.id), "status") != b"finished" for j in jobs)
            and time.monotonic() - killed < 60
        ):
            time.sleep(0.1)
        print("\nWhich jobs stalled, and where each landed")
        starts = [line.split()[1] for line in (log_dir / "runs.log").read_text().splitlines()]
        print(f"{'job':<38} {'stalled':<8} {'runs':<5} {'landed':<9} {'by':<9} result")
        for job in jobs:
            job.refresh()
            result = job.latest_result()
            print(
                f"{job.id:<38} {'yes' if job.id == victim else 'no':<8} {starts.count(job.id):<5} "
                f"{job.get_status().value:<9} {job.worker_name or '-':<9} "
                f"{result.return_value if result else '-'}"
            )
        stats = {k.decode(): int(v) for k, v in r.hgetall(Q.stats).items()}
        print(f"\ncounters (emq:{{demo}}:stats): {stats}")
        lease_s = int(SETTINGS["RQ_EMQ_LEASE_MS"]) / 1000
        sweep_s = int(SETTINGS["RQ_EMQ_SWEEP_INTERVAL_MS"]) / 1000
        if "lapsed" in moments and "recovered" in moments:
            print(
                f"back in its queue {moments['recovered'] - killed:.2f}s after the kill, "
                f"{moments['recovered'] - moments['lapsed']:.2f}s after its lease lapsed "
                f"(bound: lease + 2 x sweep interval = {lease_s + 2 * sweep_s:.1f}s after the kill)"
            )
        return 0
    finally:
        for process in workers.values():
            if process.poll() is None:
                process.send_signal(signal.SIGKILL)
                process.wait()


if __name__ == "__main__":
    sys.exit(main())
