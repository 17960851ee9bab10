"""Jobs for the crash demo (workers import this module; examples/ is on their PYTHONPATH)."""

from __future__ import annotations

import os
import time


def work(seconds: float, log: str) -> str:
    from rq import get_current_job

    job = get_current_job()
    with open(log, "a") as out:
        out.write(f"start {job.id if job else '-'} {os.getpid()}\n")
    time.sleep(seconds)
    return f"done by pid {os.getpid()}"


def charge(order_id: int, database: str, seconds: float, log: str) -> str:
    """Mark an order paid, in SQL and in Redis, fenced by the job's own lease
    (``examples/fenced_effects.py``). ``seconds`` of work come first: a run frozen in
    them may wake after its job was recovered and run by another worker."""
    import sqlite3

    import rq_emq

    lease = rq_emq.current_lease()
    assert lease is not None, "run me under a lease worker"
    token = lease.fencing_token

    def say(text: str) -> None:
        with open(log, "a") as out:
            out.write(f"run pid {os.getpid()} (fencing token {token}): {text}\n")

    say(f"started, attempt {lease.attempt}")
    time.sleep(seconds)
    # SQL: a conditional write keeps the highest token that wrote; an older holder's is a no-op
    with sqlite3.connect(database) as db:
        updated = db.execute(
            "UPDATE orders SET paid_by_pid = ?, fence_token = ? WHERE id = ? AND fence_token < ?",
            (os.getpid(), token, order_id, token),
        ).rowcount
    say(f"SQL update: {updated} row(s)" + ("" if updated else " (a newer holder wrote first: refused)"))
    # Redis: the pipeline commits only while this lease holds
    pipe = lease.fenced_pipeline()
    pipe.hset(f"order:{order_id}", mapping={"paid_by_pid": os.getpid(), "fence_token": token})
    pipe.incr(f"order:{order_id}:charges")
    try:
        pipe.execute()
        say("Redis fenced pipeline: written")
    except rq_emq.LeaseLost:
        say("Redis fenced pipeline: refused, nothing written (the lease is lost)")
    return f"charged by pid {os.getpid()}"
