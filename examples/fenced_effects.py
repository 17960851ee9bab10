"""A job's own effects, fenced by its lease: run ``python examples/fenced_effects.py``.

One job marks an order paid, in a SQL table (sqlite, from the standard library) and in
Redis (``examples/demo_jobs.py``: ``charge``). worker-a takes it and is frozen (SIGSTOP)
mid-job, longer than its lease: the sweep recovers the job and worker-b runs it, under a
newer fencing token. Then worker-a is resumed, and its stale run writes too, late. With
``RQ_EMQ_STOP_ON_LEASE_LOST=false`` (so that the stale run goes on and tries; the default
stops it before it could write) the fence refuses both of its writes: the SQL update
names the token (``WHERE fence_token < :token``), and the Redis pipeline commits only
while the lease holds (``lease.fenced_pipeline()``).
"""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import redis
from rq import Queue

from rq_emq.keys import job_key
from rq_emq.testing import private_redis

HERE = Path(__file__).resolve().parent
SETTINGS = {
    "RQ_EMQ_LEASE_MS": "2000",
    "RQ_EMQ_RENEW_INTERVAL_MS": "500",
    "RQ_EMQ_SWEEP_INTERVAL_MS": "800",
    "RQ_EMQ_STOP_ON_LEASE_LOST": "false",
}
WORK_S = 3.0  # the job's work before its writes


def main() -> int:
    with private_redis() as url:
        return run(url)


def run(url: str) -> int:
    r = redis.Redis.from_url(url)
    r.delete(*(r.keys("emq:{effects}:*") or ["-"]), "rq:queue:effects", "order:1", "order:1:charges")
    for name in ("worker-a", "worker-b"):  # a killed earlier run's registrations
        r.delete(f"rq:worker:{name}")
        r.srem("rq:workers", f"rq:worker:{name}")
    work = Path(tempfile.mkdtemp(prefix="rq-emq-effects-"))
    database, log = str(work / "orders.db"), str(work / "runs.log")
    with sqlite3.connect(database) as db:
        db.execute("CREATE TABLE orders (id INTEGER PRIMARY KEY, paid_by_pid INTEGER, fence_token INTEGER)")
        db.execute("INSERT INTO orders VALUES (1, NULL, 0)")
    env = {
        **os.environ,
        **SETTINGS,
        "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]),
    }
    rq_bin = str(Path(sys.executable).parent / "rq")
    t0 = time.monotonic()

    def say(text: str) -> None:
        print(f"[{time.monotonic() - t0:5.2f}s] {text}", flush=True)

    def start(name: str) -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            [rq_bin, "worker", "-w", "rq_emq.LeaseWorker", "--url", url, "--name", name, "effects"],
            env=env,
            stdout=open(work / f"{name}.log", "wb"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def wait(what: str, predicate: object, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while not predicate():  # type: ignore[operator]
            if time.monotonic() > deadline:
                raise SystemExit(f"timed out waiting for {what}; logs in {work}")
            time.sleep(0.02)

    def run_lines() -> list[str]:
        return Path(log).read_text().splitlines() if Path(log).exists() else []

    workers: list[subprocess.Popen[bytes]] = []
    try:
        job = Queue("effects", connection=r).enqueue(
            "demo_jobs.charge", 1, database, WORK_S, log, job_timeout=60
        )
        say(f"enqueued job {job.id[:8]}: charge order 1 (work {WORK_S:.0f} s, then write SQL and Redis)")
        workers.append(start("worker-a"))
        wait("worker-a's run", lambda: run_lines())
        say(f"worker-a's {run_lines()[0]}")
        horse = int(run_lines()[0].split()[2])  # "run pid <pid> ...": the horse, a group of its own
        os.killpg(workers[0].pid, signal.SIGSTOP)  # the worker and its horse: a frozen container
        os.kill(horse, signal.SIGSTOP)
        say("froze worker-a (SIGSTOP) mid-job, longer than its lease")
        workers.append(start("worker-b"))
        wait("the sweep's recovery and worker-b's run", lambda: len(run_lines()) >= 2)
        say(f"the lease lapsed, the sweep recovered the job; worker-b's {run_lines()[1]}")
        wait("worker-b's writes", lambda: sum("Redis" in line for line in run_lines()) >= 1)
        os.kill(horse, signal.SIGCONT)
        os.killpg(workers[0].pid, signal.SIGCONT)
        say("resumed worker-a: its stale run goes on and writes, late")
        wait("the stale run's writes", lambda: sum("Redis" in line for line in run_lines()) >= 2)
        print("\nWhat each run did")
        for line in run_lines():
            print(f"  {line}")
        with sqlite3.connect(database) as db:
            row = db.execute("SELECT paid_by_pid, fence_token FROM orders WHERE id = 1").fetchone()
        order = {k.decode(): v.decode() for k, v in r.hgetall("order:1").items()}
        print("\nWhat the stores hold")
        print(f"  SQL   orders[1]: paid_by_pid={row[0]}, fence_token={row[1]}")
        print(f"  Redis order:1: {order}, charges={int(r.get('order:1:charges') or 0)}")
        print(f"  job {job.id[:8]}: emq_fence={(r.hget(job_key(job.id), 'emq_fence') or b'-').decode()}")
        frozen = run_lines()[0].split("(fencing token ")[1].split(")")[0]  # the frozen run's token
        stale = [line for line in run_lines() if f"(fencing token {frozen})" in line and "refused" in line]
        return 0 if len(stale) == 2 and int(r.get("order:1:charges") or 0) == 1 else 1
    finally:
        for worker in workers:
            try:
                os.killpg(worker.pid, signal.SIGCONT)
                os.killpg(worker.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            worker.wait()


if __name__ == "__main__":
    sys.exit(main())
