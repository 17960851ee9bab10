"""The queue's record of lease events (lua/lib/record.lua), against a real Redis: bounded
whatever happens (a capped stream, a fixed ring of minutes), written in the step that
made the event, with the holder whose lease it was."""

from __future__ import annotations

import redis
from stalls import Q, next_round, stall, sweeper

from rq_emq.operate.panel import read_panels
from rq_emq.settings import LeaseSettings

#: XADD MAXLEN ~ 1000 trims whole macro nodes (100 entries each by default)
EVENTS_KEPT, NODE = 1000, 100


def test_the_event_stream_keeps_about_a_thousand_entries_whatever_happens(r: redis.Redis) -> None:
    stall(r, 1500)
    s = sweeper(r, sweep_batch=2000)
    s.sweep("q")  # 1500 marks in one call
    assert EVENTS_KEPT <= r.xlen(Q.events) <= EVENTS_KEPT + NODE
    newest = r.xrevrange(Q.events, count=1)[0][1]
    assert newest[b"kind"] == b"marked" and newest[b"worker"] == b"dead-worker"


def test_the_minute_ring_has_a_fixed_size_and_starts_a_stale_slot_again(r: redis.Redis) -> None:
    now_ms = int(r.time()[0]) * 1000
    minute = now_ms // 60_000
    slot = minute % 60
    r.hset(Q.minutes, mapping={f"at:{slot}": minute - 60, f"marked:{slot}": 7, f"recovered:{slot}": 5})
    stall(r, 2)
    s = sweeper(r)
    s.sweep("q")
    next_round(s)
    s.sweep("q")
    ring = r.hgetall(Q.minutes)
    assert len(ring) <= 60 * 5  # a slot's minute and four kinds, per minute of the hour
    (panel,) = read_panels(r, ["q"], LeaseSettings())
    # this minute counts what happened in it: the stale slot's 7 and 5 were not added to
    assert sum(counts["marked"] for _, counts in panel.per_minute) == 2
    assert sum(counts["recovered"] for _, counts in panel.per_minute) == 2
