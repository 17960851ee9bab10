"""What the lock manager's threads run (issue 46): the lease's round trips, and no log
handler and no event hook. A worker's lock manager ticks against a real Redis through every
path that logs or emits (RQ's heartbeat, a report landed, a malformed key, a lease lost, a
progress timeout, a local lease clock run out, a horse killed, a tick that failed, a Redis
command that failed and was retried); a handler and a hook record the thread each call runs
on, and none is the lock manager's tick or its clock: each line was made there and handed to
the reporter thread (rq_emq/reporter.py), each event to the hooks' thread (rq_emq/events.py).
"""

from __future__ import annotations

import logging
import subprocess
import threading
import time
from collections.abc import Iterator

import pytest
import redis
from procs import wait_for
from rq import Queue

import rq_emq
from rq_emq import LeaseWorker, events
from rq_emq.hold.held import Lease
from rq_emq.intake.take import Taker
from rq_emq.keys import QueueKeys, job_key
from rq_emq.run.job_lease import encode_report

LEASE_MS, RENEW_MS = 5_000, 100
#: the loggers the tick's paths log to (ours, RQ's worker's, redis-py's)
LOGGERS = ("rq_emq", "rq.worker", "redis")


class Recorder(logging.Handler):
    """Each record it handles: the thread that handled it, the thread that made it (the
    record's ``threadName``), its logger and its message."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.seen: list[tuple[str, str, str, str]] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.seen.append(
            (threading.current_thread().name, record.threadName or "", record.name, record.getMessage())
        )

    def said(self, text: str) -> list[tuple[str, str, str, str]]:
        # RQ's own wording differs in case between releases ("Sent heartbeat" in 2.0)
        return [entry for entry in list(self.seen) if text.lower() in entry[3].lower()]


@pytest.fixture
def recorder() -> Iterator[Recorder]:
    handler = Recorder()
    loggers = [logging.getLogger(), *(logging.getLogger(name) for name in LOGGERS)]
    levels = [logger.level for logger in loggers]
    for logger in loggers:  # the root's, and each's own in case a bootstrap ended its propagation
        logger.addHandler(handler)
    for logger in loggers[1:]:
        logger.setLevel(logging.DEBUG)
    yield handler
    for logger, level in zip(loggers, levels, strict=True):
        logger.removeHandler(handler)
        logger.setLevel(level)


def test_the_lock_managers_threads_call_no_log_handler_and_no_event_hook(
    r: redis.Redis, recorder: Recorder
) -> None:
    hooked: list[tuple[str, str]] = []

    def hook(event: events.LeaseEvent) -> None:
        hooked.append((threading.current_thread().name, event.kind))

    events.subscribe(hook)
    horse = subprocess.Popen(["sleep", "60"], start_new_session=True)  # a horse to kill
    queue = Queue("q", connection=r)
    reported, lost = queue.enqueue("jobs.noop"), queue.enqueue("jobs.noop")
    silent = queue.enqueue("jobs.noop", meta=rq_emq.progress_timeout(3 * RENEW_MS))
    worker = LeaseWorker([queue], connection=r, lease_ms=LEASE_MS, renew_interval_ms=RENEW_MS, name="w-path")
    beat = worker._tick_heartbeats
    taken = worker.dequeue_job_and_maintain_ttl(None)  # the lock manager ticks from here
    manager = worker.lock_manager
    try:
        assert taken is not None and taken[0].id == reported.id
        assert manager is not None
        taker = Taker(r, worker.name, worker.lease_settings)
        for job in (lost, silent):
            got = taker.pop(["q"])
            assert got is not None and got.job_id == job.id
            timeout = 3 * RENEW_MS if job is silent else None
            manager.add(Lease("q", job.id, got.token, progress_timeout_ms=timeout))
        # a lease whose local clock ran out: the clock thread (or the tick) stops its run
        manager.add(Lease("q", "gone-job", "gone-token", valid_until=time.monotonic() - 1))
        worker._horse_pid = horse.pid  # each stop kills "the horse", which RQ's logger says
        lease = manager.get(reported.id)
        assert lease is not None
        lease.post_report(encode_report(0.5, {"step": "one"}))  # lands with the next renewal
        r.set(QueueKeys("q").stats, "not a hash")  # a malformed key, named by the renewal
        r.hset(job_key(lost.id), "emq_token", "someone-else")  # its next renewal is refused
        failing = [True]

        def fail_once(*args: object) -> None:  # the tick's own error: "lock manager tick failed"
            if failing:
                failing.clear()
                raise RuntimeError("a tick that fails")
            beat(*args)  # type: ignore[arg-type]

        worker._tick_heartbeats = fail_once  # type: ignore[method-assign]
        # a command of the tick that fails and is retried (redis-py logs it at DEBUG)
        r.client_kill_filter(_id=manager.client.client_id())
        wanted = {
            "sent heartbeat": "RQ's worker heartbeat",
            "lease lost (renewal refused)": "a lease lost",
            "stopping it, its lease is lost": "the worker's stop of it",
            "no progress reported": "a progress timeout",
            "local lease clock ran out": "a lease clock run out",
            "killed horse pid": "RQ's logger as the horse is killed",
            "is malformed": "a malformed key",
            "lock manager tick failed": "a tick that failed",
        }

        def all_seen() -> bool:
            events.flush()
            kinds = {kind for _, kind in hooked}
            return (
                all(recorder.said(text) for text in wanted)
                and {"reported", "lease_lost", "no_progress"} <= kinds
            )

        wait_for(all_seen, timeout=30 * RENEW_MS / 1000 + 10, what="every path's line and event")
    finally:
        worker._tick_heartbeats = beat  # type: ignore[method-assign]
        events.unsubscribe(hook)
        horse.kill()
        horse.wait()
        worker.teardown()
    assert manager is not None and manager.name.startswith("rq-emq-lock-manager")
    renewal_threads = (manager.name, f"{manager.name}:clock")
    handled_on = {thread for thread, *_ in recorder.seen} | {thread for thread, _ in hooked}
    assert not handled_on & set(renewal_threads), [e for e in recorder.seen if e[0] in renewal_threads]
    # the lines were made on those threads, and handed to the reporter: one each, in order
    for text in wanted:
        made_there = [entry for entry in recorder.said(text) if entry[1] in renewal_threads]
        assert made_there and all(entry[0] == "rq-emq-reporter" for entry in made_there), (text, made_there)
    assert {thread for thread, _ in hooked} == {"rq-emq-event-hooks"}
    # redis-py's line about the failed command, made on the tick, went to the reporter too
    library = [
        entry for entry in recorder.seen if entry[2].startswith("redis.") and entry[1] in renewal_threads
    ]
    assert all(entry[0] == "rq-emq-reporter" for entry in library), library
