"""Why the stalled sweep must be one script: ``python examples/double_recovery.py``.

An app-side stalled-job checker reads the in-flight list, asks whether each job's lock
exists, and only then, in later round trips, moves the lock-less jobs back to the queue
and bumps their attempts (HGET, then HSET). A second checker that reads between those
steps sees the same missing locks, so both recover every job: each lands in the queue
twice (it will run twice) and its attempts are counted twice. A barrier holds the two
naive checkers until both have checked, so the window opens on every trial; they then
write one after the other, the kindest order (no lost updates), and it is still wrong.

The atomic run leases the same number of jobs through rq-emq's own take scripts
(``pop_job``, and a move to the intermediate list + ``claim_job``), lets the leases lapse
as if the worker died, and runs two ``rq_emq.recover.sweep.Sweeper`` instances (own connections)
through every round together, past the fleet-wide rate limit. Check and move are one
script, so Redis runs one sweeper's call before the other's: a round marks, a later round
recovers each job once. Attempts are counted when a job is taken, so a recovered job
still reads 1 until it is taken again.

Starts a private redis-server unless ``--url`` or REDIS_URL names one (a trial's keys are
removed after it). Exit status: 1 if the atomic sweep ever recovered a job twice, missed
one or left a wrong count; 3 if the naive checkers did not show the window; 2 bad usage.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable

import redis
from rq import Queue

from rq_emq.intake.take import Taker
from rq_emq.keys import QueueKeys, job_key
from rq_emq.recover.sweep import Sweeper
from rq_emq.settings import LeaseSettings
from rq_emq.testing import RedisServer

# Short leases so a "dead worker" is seen within a fraction of a second.
SETTINGS = LeaseSettings(lease_ms=200, renew_interval_ms=50, sweep_interval_ms=100, sweep_batch=10)
MAX_ROUNDS = 20
NAIVE_TITLE = "Naive app-side checkers, two overlapping (LRANGE + EXISTS, then LREM/LPUSH + HGET/HSET)"
ATOMIC_TITLE = "rq-emq sweep, two overlapping Sweepers (move_stalled_jobs_to_wait, one script)"
HEADERS = [
    "trial",
    "stalled jobs",
    "recoveries (1st + 2nd)",
    "duplicate recoveries",
    "wrong attempt counts",
    "queue after",
]


def enqueue(r: redis.Redis, queue: str, jobs: int) -> list[str]:
    """Jobs made by a stock producer; nothing ever runs them here."""
    producer = Queue(queue, connection=r)
    return [producer.enqueue("os.getpid").id for _ in range(jobs)]


def text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def naive_lock(queue: str, job_id: str) -> str:
    return f"naive:{{{queue}}}:{job_id}:lock"


def wait_lapsed(r: redis.Redis, lock_keys: list[str], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while r.exists(*lock_keys) and time.monotonic() < deadline:
        time.sleep(0.02)
    if r.exists(*lock_keys):
        raise RuntimeError("locks did not lapse")


def overlapped(work: Callable[[int, threading.Barrier], Counter[str]]) -> list[Counter[str]]:
    """Run ``work`` in two threads that share a barrier; the jobs each one recovered."""
    barrier = threading.Barrier(2, timeout=60)
    results: list[Counter[str]] = [Counter(), Counter()]
    errors: list[BaseException] = []

    def run(index: int) -> None:
        try:
            results[index] = work(index, barrier)
        except BaseException as exc:  # reported in the main thread
            barrier.abort()
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]
    return results


def measure(
    r: redis.Redis, q: QueueKeys, job_ids: list[str], each: list[Counter[str]], field: str, expected: int
) -> dict[str, int]:
    recovered = sum(each, Counter())
    in_queue = Counter(text(v) for v in r.lrange(q.rq_queue, 0, -1))
    attempts = [r.hget(job_key(j), field) for j in job_ids]
    return {
        "stalled": len(job_ids),
        "recoveries": sum(recovered.values()),
        "duplicates": sum(1 for j in job_ids if in_queue[j] > 1 or recovered[j] > 1),
        "wrong_attempts": sum(1 for a in attempts if int(a or 0) != expected),
        "queue_after": r.llen(q.rq_queue),
        "by_first": sum(each[0].values()),  # the split shows that both really acted
        "by_second": sum(each[1].values()),
    }


def naive_run(r: redis.Redis, url: str, queue: str, job_ids: list[str]) -> dict[str, int]:
    """Stock-style in-flight list and app-side checkers, one round trip per step."""
    q = QueueKeys(queue)
    locks = [naive_lock(queue, j) for j in job_ids]
    for job_id, lock in zip(job_ids, locks, strict=True):  # what a worker's take does
        r.lmove(q.rq_queue, q.intermediate, "LEFT", "RIGHT")
        r.set(lock, "worker-1", px=SETTINGS.lease_ms)
        r.hset(job_key(job_id), "naive_attempts", 1)
    wait_lapsed(r, locks)  # the worker died: nobody renews
    write_turn = threading.Lock()

    def checker(index: int, barrier: threading.Barrier) -> Counter[str]:
        client = redis.Redis.from_url(url)
        in_flight = [text(v) for v in client.lrange(q.intermediate, 0, -1)]
        stalled = [j for j in in_flight if not client.exists(naive_lock(queue, j))]
        barrier.wait()  # both have checked; neither has written
        recovered: Counter[str] = Counter()
        with write_turn:
            for job_id in stalled:
                client.lrem(q.intermediate, 1, job_id)
                client.lpush(q.rq_queue, job_id)
                attempts = int(client.hget(job_key(job_id), "naive_attempts") or 0)
                client.hset(job_key(job_id), "naive_attempts", attempts + 1)
                recovered[job_id] += 1
        client.close()
        return recovered

    return measure(r, q, job_ids, overlapped(checker), "naive_attempts", expected=2)


def atomic_run(r: redis.Redis, url: str, queue: str, job_ids: list[str]) -> dict[str, int]:
    """Real leases from our take scripts, lapsed; two real Sweepers, rounds forced to overlap."""
    q = QueueKeys(queue)
    taker = Taker(r, "doomed-worker", SETTINGS)
    for i in range(len(job_ids)):  # both take paths a LeaseWorker uses
        if i % 2:
            taken = taker.pop([queue])
        else:
            moved = r.lmove(q.rq_queue, q.moving, "LEFT", "RIGHT")
            taken = taker.claim(queue, text(moved)) if moved else None
        if taken is None:
            raise RuntimeError(f"could not lease job {i} on {queue}")
    wait_lapsed(r, [q.lock(j) for j in job_ids])  # the worker died: its leases lapse

    def sweeper(index: int, barrier: threading.Barrier) -> Counter[str]:
        client = redis.Redis.from_url(url)
        sweep = Sweeper(client, [queue], SETTINGS, name=f"sweeper-{index}")
        recovered: Counter[str] = Counter()
        for _ in range(MAX_ROUNDS):
            barrier.wait()  # both sweepers start each round together
            recovered.update(sweep.sweep(queue, mode="force").requeued)
            barrier.wait()  # both have finished the round: is anything left?
            if not client.exists(q.leases, q.stalled):
                break
            time.sleep(sweep.grace_ms * 1.5 / 1000)  # marks must stand a grace period
        client.close()
        return recovered

    return measure(r, q, job_ids, overlapped(sweeper), "emq_attempts", expected=1)


def forget(r: redis.Redis, queue: str, job_ids: list[str]) -> None:
    """Remove every key a trial made, so a shared server is left as it was."""
    q = QueueKeys(queue)
    keys = [q.rq_queue, q.intermediate, q.started, q.failed, q.leases, q.stalled, q.sweep, q.stats, q.outbox]
    keys += [q.events, q.minutes, q.swept]  # the queue's record of lease events
    for job_id in job_ids:
        keys += [job_key(job_id), q.lock(job_id), naive_lock(queue, job_id)]
    r.delete(*keys)
    r.srem("rq:queues", q.rq_queue)


def table(title: str, rows: list[dict[str, int]]) -> str:
    total = {key: sum(row[key] for row in rows) for key in rows[0]}
    cells = [
        [name, str(row["stalled"]), f"{row['recoveries']} ({row['by_first']} + {row['by_second']})"]
        + [str(row[key]) for key in ("duplicates", "wrong_attempts", "queue_after")]
        for name, row in [*((str(i + 1), row) for i, row in enumerate(rows)), ("all", total)]
    ]
    widths = [len(h) for h in HEADERS]
    lines = [HEADERS, ["-" * w for w in widths], *cells]
    return "\n".join([title] + ["| " + " | ".join(map(str.rjust, line, widths)) + " |" for line in lines])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=5)
    parser.add_argument("--jobs", type=int, default=100, help="stalled jobs per trial")
    parser.add_argument("--url", default=os.environ.get("REDIS_URL"), help="Redis to use (default: private)")
    parser.add_argument("--json", action="store_true", help="print the results as JSON instead of tables")
    options = parser.parse_args()
    if options.trials < 1 or options.jobs < 1:
        parser.error("--trials and --jobs must be at least 1")
    logging.getLogger("rq_emq").setLevel(logging.ERROR)  # one warning per recovered job otherwise
    if options.url:
        try:
            redis.Redis.from_url(options.url).ping()
        except (redis.exceptions.ConnectionError, ValueError) as exc:
            parser.error(f"--url / REDIS_URL {options.url!r}: cannot reach Redis ({exc})")
        return run(options.url, options)
    server = RedisServer().start()
    try:
        return run(server.url, options)
    finally:
        server.stop()


def run(url: str, options: argparse.Namespace) -> int:
    r = redis.Redis.from_url(url)
    results: dict[str, list[dict[str, int]]] = {"naive": [], "atomic": []}
    tag = uuid.uuid4().hex[:8]
    for trial in range(options.trials):
        for kind, run_one in (("naive", naive_run), ("atomic", atomic_run)):
            queue = f"double-recovery-{tag}-{trial}-{kind}"
            job_ids = enqueue(r, queue, options.jobs)
            try:
                results[kind].append(run_one(r, url, queue, job_ids))
            finally:
                forget(r, queue, job_ids)
    atomic_ok = all(
        row["duplicates"] == row["wrong_attempts"] == 0
        and row["recoveries"] == row["queue_after"] == row["stalled"]
        for row in results["atomic"]
    )
    naive_showed = all(row["duplicates"] > 0 for row in results["naive"])
    if options.json:
        print(json.dumps({**results, "atomic_ok": atomic_ok, "naive_showed": naive_showed}))
    else:
        print(table(NAIVE_TITLE, results["naive"]) + "\n\n" + table(ATOMIC_TITLE, results["atomic"]))
        print(
            f"\natomic sweep: {'exact on every trial' if atomic_ok else 'WRONG on some trial'}; "
            f"naive checkers: {'window shown on every trial' if naive_showed else 'window NOT shown'}"
        )
    return 1 if not atomic_ok else 0 if naive_showed else 3


if __name__ == "__main__":
    sys.exit(main())
