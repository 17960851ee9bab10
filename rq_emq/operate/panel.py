"""The lease panel's view of one queue, read in one bounded script call per queue.

What the dashboard shows (:mod:`rq_emq.operate.dashboard`): per queue its jobs waiting, in
flight and stalled, its counters, when its last sweep round ran and by which sweeper; per
leased job (the first ``leases_shown`` by deadline) its worker, attempt, lease age and
deadline, last report and fencing token; the newest events of the queue's record
(``lua/lib/record.lua``: marks, recoveries, crashes, failures at max attempts, refused
late outcomes, no-progress refusals) and its per-minute counts over the last hour.

All of it comes from ``read_lease_panel`` (one EVALSHA per queue, all queues in one
pipeline): a consistent moment, a bounded cost whatever the number of jobs. Times are
Redis's. Data that does not read (a non-numeric field, a report that is not JSON) is
named in ``problems`` and shown as missing, never raised; nothing read is evaluated.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from redis import Redis

from .. import scripts
from ..keys import QueueKeys
from ..settings import LeaseSettings
from .inspection import COUNTERS, Layout, text
from .reports import count_value, read_notes

#: Leases a panel lists, earliest deadline first (the rest are counted).
LEASES_SHOWN = 100
#: Events a panel lists, newest first.
EVENTS_SHOWN = 50
#: The per-minute chart's span.
CHART_MINUTES = 60
#: The kinds the per-minute ring counts (lua/lib/record.lua RING_KINDS).
CHART_KINDS = ("marked", "recovered", "failed", "crashed")


@dataclass
class PanelLease:
    """One leased job as the panel lists it."""

    job_id: str
    description: str | None = None
    status: str | None = None
    worker: str | None = None
    attempts: int | None = None
    max_attempts: int | None = None
    #: ``job`` (its own) or ``default`` (the configured one).
    max_attempts_source: str = "default"
    #: Until the deadline in the lease index (negative: overdue).
    due_in_ms: int = 0
    #: Since the grant (``emq_granted_at``); None for a lease granted before that field.
    age_ms: int | None = None
    #: The lock's time left; None once it lapsed (the sweep marks it).
    lock_ttl_ms: int | None = None
    marked_ms_ago: int | None = None
    fencing_token: int | None = None
    report: Any = None
    progress_ms_ago: int | None = None
    no_progress: str | None = None
    job_exists: bool = True
    problems: list[str] = field(default_factory=list)


@dataclass
class PanelEvent:
    """One entry of the queue's record."""

    at_ms: int
    kind: str
    job_id: str
    worker: str
    reason: str


@dataclass
class QueuePanel:
    """One queue's panel."""

    queue: str
    now_ms: int = 0
    waiting: int | None = None
    in_flight: int | None = None
    stalled: int | None = None
    counters: dict[str, int | None] = field(default_factory=dict)
    #: The sweeper that ran the last round, and how long ago; None: no round recorded.
    sweeper: str | None = None
    swept_ms_ago: int | None = None
    leases: list[PanelLease] = field(default_factory=list)
    events: list[PanelEvent] = field(default_factory=list)
    #: Per minute of the last hour, oldest first: (minute start in Redis ms, counts by kind).
    per_minute: list[tuple[int, dict[str, int]]] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)


def read_panels(
    client: Redis,
    queues: Sequence[str],
    settings: LeaseSettings,
    layout: Layout = QueueKeys,
    leases_shown: int = LEASES_SHOWN,
    events_shown: int = EVENTS_SHOWN,
) -> list[QueuePanel]:
    """Each queue's panel: one ``read_lease_panel`` call per queue, all in one round trip."""
    script = scripts.load("read_lease_panel")
    pipe = client.pipeline(transaction=False)
    for queue in queues:
        q = layout(queue)
        keys = [q.leases, q.stalled, q.stats, q.events, q.minutes, q.swept, q.rq_queue]
        script.queue(pipe, keys, [leases_shown, events_shown, q.job_prefix, q.prefix])
    replies = pipe.execute(raise_on_error=False)
    if any(scripts.is_noscript(reply) for reply in replies):
        script.load(client)
        return read_panels(client, queues, settings, layout, leases_shown, events_shown)
    panels = []
    for queue, reply in zip(queues, replies, strict=True):
        panel = QueuePanel(queue)
        if isinstance(reply, Exception):  # a RedisError, as the pipeline returned it
            panel.problems.append(f"cannot read the panel of queue {queue}: {reply}")
        else:
            try:
                _parse(panel, reply, settings)
            except (ValueError, TypeError, IndexError) as error:
                panel.problems.append(f"malformed panel data of queue {queue}: {error}")
        panels.append(panel)
    return panels


def _parse(panel: QueuePanel, reply: list[Any], settings: LeaseSettings) -> None:
    now, waiting, in_flight, stalled, stats, swept, events, minutes, leases = reply
    panel.now_ms = now = int(now)
    panel.waiting, panel.in_flight, panel.stalled = int(waiting), int(in_flight), int(stalled)
    raw = {text(k): text(v) for k, v in zip(stats[::2], stats[1::2], strict=True)}
    for name in (*COUNTERS, *sorted(set(raw) - set(COUNTERS))):
        panel.counters[name] = count_value(raw.get(name, "0"))
    if swept is not None:
        at, _, name = text(swept).partition(" ")
        at_ms = count_value(at)
        panel.swept_ms_ago = None if at_ms is None else now - at_ms
        panel.sweeper = name or None
    panel.events = [_event(entry) for entry in events]
    panel.per_minute = _per_minute(minutes, now)
    panel.leases = [_lease(entry, now, settings) for entry in leases]


def _event(entry: list[Any]) -> PanelEvent:
    entry_id, flat = entry
    fields = {text(k): text(v) for k, v in zip(flat[::2], flat[1::2], strict=True)}
    at_ms = count_value(text(entry_id).partition("-")[0]) or 0
    return PanelEvent(
        at_ms,
        fields.get("kind", "?"),
        fields.get("job", ""),
        fields.get("worker", ""),
        fields.get("reason", ""),
    )


def _per_minute(flat: list[Any], now: int) -> list[tuple[int, dict[str, int]]]:
    """The ring's slots as minutes, oldest first; a slot of an older minute counts zero."""
    ring = {text(k): text(v) for k, v in zip(flat[::2], flat[1::2], strict=True)}
    this_minute = now // 60_000
    out = []
    for minute in range(this_minute - CHART_MINUTES + 1, this_minute + 1):
        slot = minute % CHART_MINUTES
        current = ring.get(f"at:{slot}") == str(minute)
        counts = {
            kind: (count_value(ring.get(f"{kind}:{slot}", "0")) or 0) if current else 0
            for kind in CHART_KINDS
        }
        out.append((minute * 60_000, counts))
    return out


def _lease(entry: list[Any], now: int, settings: LeaseSettings) -> PanelLease:
    job_id, deadline, marked_at, lock_ttl, *fields = entry
    status, description, worker, attempts, max_attempts, fence, report, progress_at, granted_at, *rest = (
        fields
    )
    no_progress, _lease_ms = rest
    lease = PanelLease(text(job_id), due_in_ms=int(float(text(deadline))) - now)
    lease.job_exists = any(value is not None for value in fields)
    if not lease.job_exists:
        lease.problems.append("job hash is gone (the sweep drops this entry)")
    lease.status = None if status is None else text(status)
    lease.description = None if description is None else text(description)
    lease.worker = None if worker is None else text(worker)
    lease.attempts = 0 if attempts is None else count_value(text(attempts))
    own_max = None if max_attempts is None else count_value(text(max_attempts))
    lease.max_attempts, lease.max_attempts_source = (
        (own_max, "job") if own_max is not None else (settings.max_attempts, "default")
    )
    ttl = int(lock_ttl)
    lease.lock_ttl_ms = ttl if ttl >= 0 else None
    lease.marked_ms_ago = None if marked_at is None else now - int(float(text(marked_at)))
    granted = None if granted_at is None else count_value(text(granted_at))
    lease.age_ms = None if granted is None else now - granted
    read_notes(lease, now, [fence, report, progress_at, no_progress])
    return lease
