"""The operator's view of lease state in Redis: what is in flight, stalled and counted, per
queue (the per-job view, built on the readers here, is :mod:`.lease_list`). Read only, and
kept apart from how it is shown (``cli_output``, ``metrics``).

Every read is bounded whatever the queue size: counts come from ZCARD/ZCOUNT/LLEN, the
oldest entries from ZRANGE with a limit, per-job detail only for the first ``limit``
leases; each view costs four round trips at most (Redis ``TIME``, one MULTI of reads,
then the few reads those name, in one or two steps). Times are Redis's, as in the scripts. Data that is
missing or malformed (a lease whose job hash is gone, a counter that is not a number, a
key of the wrong type) is reported in ``problems``, never raised.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from redis import Redis
from redis.exceptions import ResponseError
from rq.queue import Queue

from ..keys import QueueKeys
from ..settings import LeaseSettings

#: A queue's keys by its name (RQ's default layout, or the workers' job and queue classes').
Layout = Callable[[str], QueueKeys]

logger = logging.getLogger("rq_emq.inspection")

QUEUES_KEY: str = Queue.redis_queues_keys
#: The counters our scripts keep in ``emq:{<q>}:stats``, in the order people read them.
COUNTERS = (
    "taken",
    "renewed",
    "finished",
    "lease_lost",
    "fenced",
    "marked",
    "unmarked",
    "recovered",
    "crashed",
    "failed",
    "returned",
    "ended_by_rq",
    "outbox_completed",
    "unreadable",
)
#: Upper bounds (seconds of lease left) of the remaining-time buckets after "overdue".
REMAINING_BOUNDS_S = (5, 15, 60)
#: Leases (earliest deadline first) looked at to find the oldest one the sweep has not marked.
OLDEST_LEASE_LOOKAHEAD = 50


def remaining_buckets() -> tuple[str, ...]:
    """Bucket labels, in order: ``overdue``, ``0-5s``, ``5-15s``, ``15-60s``, ``60s+``."""
    labels, low = ["overdue"], 0
    for high in REMAINING_BOUNDS_S:
        labels.append(f"{low}-{high}s")
        low = high
    return (*labels, f"{low}s+")


@dataclass
class OldestLease:
    """The unmarked lease nearest its deadline: with one lease length fleet-wide, the one
    renewed least recently (marked ones are re-indexed a grace ahead, and
    :class:`OldestMark` tells their age)."""

    job_id: str
    #: Until its deadline by Redis's clock; negative when overdue.
    due_in_ms: int
    #: Since it was granted or last renewed: its own lease length (``emq_lease_ms``, set
    #: by the take; the reader's lease_ms for a lease granted before that field existed)
    #: minus what is left.
    age_ms: int


@dataclass
class OldestMark:
    """The stall mark standing longest (awaiting the sweep's recovery round)."""

    job_id: str
    age_ms: int


@dataclass
class QueueStatus:
    """One queue's lease state. A count is None where its key could not be read."""

    queue: str
    waiting: int | None = None
    in_flight: int | None = None
    stalled: int | None = None
    outbox: int | None = None
    by_remaining: dict[str, int | None] = field(default_factory=dict)
    oldest_lease: OldestLease | None = None
    oldest_mark: OldestMark | None = None
    counters: dict[str, int | None] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)


def text(value: Any) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def redis_now_ms(client: Redis) -> int:
    seconds, micros = client.time()  # type: ignore[misc]
    return int(seconds) * 1000 + int(micros) // 1000


def known_queues(client: Redis, queue_class: Any = None) -> list[str]:
    """Queues RQ knows (``rq:queues``) in ``queue_class``'s namespace (RQ's default), sorted."""
    prefix = QueueKeys.named("", queue_class).queue_prefix
    members: Iterable[Any] = client.smembers(QUEUES_KEY)  # type: ignore[assignment]
    return sorted(text(m).removeprefix(prefix) for m in members if text(m).startswith(prefix))


def unknown_queues(client: Redis, names: Sequence[str], queue_class: Any = None) -> list[str]:
    """Names neither RQ knows nor any key of ours mentions (likely typos)."""
    known = set(known_queues(client, queue_class))
    pipe = client.pipeline(transaction=False)
    candidates = [name for name in names if name not in known]
    for name in candidates:
        q = QueueKeys.named(name, queue_class)
        pipe.exists(q.rq_queue, q.leases, q.stalled, q.stats, q.outbox, q.sweep)
    return [name for name, found in zip(candidates, pipe.execute(), strict=True) if not found]


class Batch:
    """A pipeline whose replies are handed to parsers; a failed reply becomes a problem."""

    def __init__(self, client: Redis, transaction: bool = True) -> None:
        self.pipe = client.pipeline(transaction=transaction)
        self.parsers: list[tuple[list[str], str, Callable[[Any], None]]] = []

    def add(self, problems: list[str], what: str, queued: object, parse: Callable[[Any], None]) -> None:
        """Pair the command just queued on ``self.pipe`` (``queued``: its return) with a parser."""
        self.parsers.append((problems, what, parse))

    def run(self) -> None:
        replies = self.pipe.execute(raise_on_error=False)
        for (problems, what, parse), reply in zip(self.parsers, replies, strict=True):
            if isinstance(reply, ResponseError):
                problem(problems, f"cannot read {what}: {reply}")
                continue
            try:
                parse(reply)
            except (ValueError, TypeError) as error:
                problem(problems, f"malformed {what}: {error}")


def problem(problems: list[str], message: str) -> None:
    logger.warning("%s", message)
    problems.append(message)


def int_or_none(raw: Any) -> int | None:
    try:
        return int(text(raw))
    except ValueError:
        return None


def read_status(
    client: Redis, queues: Sequence[str], settings: LeaseSettings, layout: Layout = QueueKeys
) -> list[QueueStatus]:
    """Counts, remaining-time buckets, oldest lease and mark, and counters per queue."""
    # the buckets' bounds need a time before the reads; the ages are read against the time of
    # the transaction that reads them, so a lease granted or a mark made in between is never
    # shown as younger than nothing
    now = redis_now_ms(client)
    batch = Batch(client)
    clock = [now]

    def read_clock(reply: Any) -> None:
        seconds, micros = reply
        clock[0] = int(seconds) * 1000 + int(micros) // 1000

    batch.add([], "the server's time", batch.pipe.time(), read_clock)
    statuses = [QueueStatus(queue) for queue in queues]
    candidates: dict[str, list[tuple[str, int]]] = {}
    for status in statuses:
        _queue_status_reads(batch, status, now, clock, candidates, layout)
    batch.run()
    marks = Batch(client)
    for status in statuses:
        first = candidates.get(status.queue)
        if not first:
            continue

        def oldest_unmarked(reply: Any, status: QueueStatus = status, first: list = first) -> None:
            for (job_id, deadline), marked_at in zip(first, reply, strict=True):
                if marked_at is None:
                    due_in = deadline - clock[0]
                    status.oldest_lease = OldestLease(job_id, due_in, settings.lease_ms - due_in)
                    return

        stalled = layout(status.queue).stalled
        marks.add(
            status.problems, stalled, marks.pipe.zmscore(stalled, [m for m, _ in first]), oldest_unmarked
        )
    marks.run()
    _lease_ages(client, statuses, layout)
    return statuses


def _lease_ages(client: Redis, statuses: Sequence[QueueStatus], layout: Layout) -> None:
    """Each oldest lease's age from its own length: workers and readers may be
    configured with different lease_ms, so the reader's own says nothing."""
    lengths = Batch(client, transaction=False)  # one HGET per queue: nothing to keep consistent
    for status in statuses:
        oldest = status.oldest_lease
        if oldest is None:
            continue

        def length(reply: Any, status: QueueStatus = status, oldest: OldestLease = oldest) -> None:
            if reply is None:
                return  # granted before the field existed, or the job is gone: the reader's lease_ms
            lease_ms = int_or_none(reply)
            if lease_ms is None or lease_ms <= 0:
                problem(
                    status.problems,
                    f"emq_lease_ms of job {oldest.job_id} is not a positive number: {text(reply)!r}",
                )
                return
            oldest.age_ms = lease_ms - oldest.due_in_ms

        key = layout(status.queue).job(oldest.job_id)
        lengths.add(status.problems, key, lengths.pipe.hget(key, "emq_lease_ms"), length)
    if lengths.parsers:
        lengths.run()


def _queue_status_reads(
    batch: Batch,
    status: QueueStatus,
    now: int,
    clock: list[int],
    candidates: dict[str, list[tuple[str, int]]],
    layout: Layout,
) -> None:
    """Queue one queue's reads: the buckets bounded by ``now``; ``clock`` holds the Redis time
    (ms) of the transaction they run in by the time they are parsed."""
    q, pipe, problems = layout(status.queue), batch.pipe, status.problems

    def setter(name: str) -> Callable[[Any], None]:
        return lambda reply: setattr(status, name, int(reply))

    batch.add(problems, q.rq_queue, pipe.llen(q.rq_queue), setter("waiting"))
    batch.add(problems, q.leases, pipe.zcard(q.leases), setter("in_flight"))
    batch.add(problems, q.stalled, pipe.zcard(q.stalled), setter("stalled"))
    batch.add(problems, q.outbox, pipe.zcard(q.outbox), setter("outbox"))
    labels = remaining_buckets()
    bounds = [now + s * 1000 for s in REMAINING_BOUNDS_S]
    lows: list[str | int] = ["-inf", *[f"({b}" for b in [now, *bounds]]]
    highs: list[str | int] = [now, *bounds, "+inf"]
    ranges = list(zip(lows, highs, strict=True))
    for label, (low, high) in zip(labels, ranges, strict=True):
        status.by_remaining[label] = None

        def count(reply: Any, label: str = label) -> None:
            status.by_remaining[label] = int(reply)

        batch.add(problems, q.leases, pipe.zcount(q.leases, low, high), count)

    def first_leases(reply: Any) -> None:
        candidates[status.queue] = [(text(member), int(deadline)) for member, deadline in reply]

    def oldest_mark(reply: Any) -> None:
        if reply:
            member, marked_at = reply[0]
            status.oldest_mark = OldestMark(text(member), clock[0] - int(marked_at))

    batch.add(
        problems,
        q.leases,
        pipe.zrange(q.leases, 0, OLDEST_LEASE_LOOKAHEAD - 1, withscores=True),
        first_leases,
    )
    batch.add(problems, q.stalled, pipe.zrange(q.stalled, 0, 0, withscores=True), oldest_mark)

    def counters(reply: Any) -> None:
        raw = {text(k): v for k, v in reply.items()}
        for name in (*COUNTERS, *sorted(set(raw) - set(COUNTERS))):
            value = int_or_none(raw.get(name, 0))
            if value is None:
                problem(problems, f"counter {name} in {q.stats} is not a number: {text(raw[name])!r}")
            status.counters[name] = value

    batch.add(problems, q.stats, pipe.hgetall(q.stats), counters)
