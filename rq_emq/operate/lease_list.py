"""The per-job view of lease state: the first leases of a queue, earliest deadline first,
each as its lock, its job hash and the sweep see it (``rq-emq leases``). Read only, and
bounded as :mod:`.inspection` is: Redis ``TIME``, one MULTI of counts and the first
``limit`` entries, then one pipeline of per-job reads; a lease whose job hash is gone or
whose fields are malformed is reported in ``problems``, never raised.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from redis import Redis

from ..keys import QueueKeys
from ..recover.horse_crash import Crash, read_crashes
from ..settings import LeaseSettings
from .inspection import Batch, Layout, int_or_none, problem, redis_now_ms, text
from .reports import NOTE_FIELDS, read_notes

#: How much of a lease's token the view shows: never the whole token, the proof of
#: ownership the fence checks.
TOKEN_PREFIX_CHARS = 8


@dataclass
class LeaseInfo:
    """One leased job as its lease, its job hash and the sweep see it."""

    queue: str
    job_id: str
    #: Until the deadline indexed in the leases zset (negative: overdue).
    due_in_ms: int
    #: ``held`` (lock_ttl_ms left), ``gone`` (lapsed: the sweep will mark it) or ``no-expiry``.
    lock: str
    lock_ttl_ms: int | None
    job_exists: bool
    status: str | None = None
    worker: str | None = None
    token_prefix: str | None = None
    attempts: int | None = None
    max_attempts: int | None = None
    #: ``job`` (its own emq_max_attempts) or ``default`` (the configured max_attempts).
    max_attempts_source: str = "default"
    #: How long ago the sweep marked it stalled; None when not marked.
    marked_ms_ago: int | None = None
    #: Earlier attempts of this run whose horse died without an outcome (``emq_crashes``).
    crashes: list[Crash] = field(default_factory=list)
    #: The grant's fencing token, and what the job told its lease (:mod:`.reports`).
    fencing_token: int | None = None
    report: Any = None
    progress_ms_ago: int | None = None
    no_progress: str | None = None
    problems: list[str] = field(default_factory=list)


@dataclass
class LeasePage:
    """The first leases of one queue, earliest deadline first, and how many there are."""

    queue: str
    total: int | None
    leases: list[LeaseInfo] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)


JOB_FIELDS = (
    *("status", "emq_worker", "emq_token", "emq_attempts", "emq_max_attempts", "emq_crashes"),
    *NOTE_FIELDS,
)


def read_leases(
    client: Redis, queues: Sequence[str], settings: LeaseSettings, limit: int, layout: Layout = QueueKeys
) -> list[LeasePage]:
    """Per queue, the ``limit`` leases due first, each with its lock, job hash and mark."""
    now = redis_now_ms(client)
    pages = [LeasePage(queue, total=None) for queue in queues]
    first = Batch(client)
    entries: dict[str, list[tuple[str, int]]] = {}
    for page in pages:
        q = layout(page.queue)

        def total(reply: Any, page: LeasePage = page) -> None:
            page.total = int(reply)

        def listed(reply: Any, queue: str = page.queue) -> None:
            entries[queue] = [(text(member), int(score)) for member, score in reply]

        first.add(page.problems, q.leases, first.pipe.zcard(q.leases), total)
        first.add(
            page.problems,
            q.leases,
            first.pipe.zrange(q.leases, 0, limit - 1, withscores=True),
            listed,
        )
    first.run()

    detail = Batch(client)
    # the ages of reports and marks against the time of the transaction that reads them: a
    # report that lands after the clock read above would otherwise read as due in the future
    clock = [now]

    def read_clock(reply: Any) -> None:
        seconds, micros = reply
        clock[0] = int(seconds) * 1000 + int(micros) // 1000

    detail.add([], "the server's time", detail.pipe.time(), read_clock)
    for page in pages:
        q = layout(page.queue)
        for job_id, deadline in entries.get(page.queue, []):
            info = LeaseInfo(
                page.queue, job_id, deadline - now, lock="gone", lock_ttl_ms=None, job_exists=False
            )
            page.leases.append(info)
            _lease_reads(detail, q, info, clock, settings)
    detail.run()
    return pages


def _lease_reads(
    batch: Batch, q: QueueKeys, info: LeaseInfo, clock: list[int], settings: LeaseSettings
) -> None:
    """Queue one lease's reads; ``clock`` holds the Redis time (ms) of their transaction by the
    time their replies are parsed."""
    pipe, problems, job_id = batch.pipe, info.problems, info.job_id

    def lock(reply: Any) -> None:
        ttl = int(reply)
        info.lock, info.lock_ttl_ms = (
            ("held", ttl) if ttl >= 0 else ("no-expiry", None) if ttl == -1 else ("gone", None)
        )

    def job(reply: Any) -> None:
        status, worker, token, attempts, max_attempts, crashes = reply[:6]
        read_notes(info, clock[0], reply[6:])
        info.job_exists = any(value is not None for value in reply)
        if not info.job_exists:
            problems.append("job hash is gone (the sweep drops this entry)")
            return
        info.status = None if status is None else text(status)
        info.worker = None if worker is None else text(worker)
        # never the whole token: it is the proof of ownership the fence checks
        info.token_prefix = None if token is None else text(token)[:TOKEN_PREFIX_CHARS]
        info.attempts = 0 if attempts is None else int_or_none(attempts)
        if info.attempts is None:
            problem(problems, f"emq_attempts of job {job_id} is not a number: {text(attempts)!r}")
        own_max = None if max_attempts is None else int_or_none(max_attempts)
        if max_attempts is not None and own_max is None:
            problem(problems, f"emq_max_attempts of job {job_id} is not a number: {text(max_attempts)!r}")
        # as the sweep decides: the job's own number, else the configured default
        info.max_attempts, info.max_attempts_source = (
            (own_max, "job") if own_max is not None else (settings.max_attempts, "default")
        )
        history = read_crashes(crashes)
        if history is None:
            problem(problems, f"emq_crashes of job {job_id} is not a crash history: {text(crashes)!r}")
        info.crashes = history or []

    def mark(reply: Any) -> None:
        if reply is not None:
            info.marked_ms_ago = clock[0] - int(reply)

    batch.add(problems, q.lock(job_id), pipe.pttl(q.lock(job_id)), lock)
    batch.add(problems, q.job(job_id), pipe.hmget(q.job(job_id), JOB_FIELDS), job)
    batch.add(problems, q.stalled, pipe.zscore(q.stalled, job_id), mark)
