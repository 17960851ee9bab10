"""A stopping worker gives its set's idle watch up only while the watch is its own: also when
the stop interrupted the watch's start (the take sent, ``watching`` not yet set), and never a
watch that another worker holds. A watch whose start a reconnect of its pubsub connection
overtook starts again. A real redis-server; :mod:`rq_emq.intake.watch`."""

from __future__ import annotations

import redis

from rq_emq.intake.watch import PubsubLine, QueueSetWatch
from rq_emq.keys import QueueKeys


def _watch(r: redis.Redis, name: str) -> QueueSetWatch:
    line = PubsubLine(on_invalidate=lambda message: None, resp3=False)
    return QueueSetWatch(r, r, name, [QueueKeys("q0"), QueueKeys("q1")], 5000, line)


def test_a_stop_between_the_take_and_the_start_hands_the_watch_on(r: redis.Redis) -> None:
    watch = _watch(r, "w1")
    assert watch._hold() and not watch.watching  # a stop lands here: the start never ran
    watch.leave()
    watch_key, wake_key = watch.keys
    assert not r.exists(watch_key)
    assert r.lrange(wake_key, 0, -1) == [watch.token.encode()]


def test_a_stop_leaves_a_watch_another_worker_holds_alone(r: redis.Redis) -> None:
    first, second = _watch(r, "w1"), _watch(r, "w2")
    assert first._hold()
    assert not second._hold()  # it tried: the watch is the first's
    second.leave()
    watch_key, wake_key = first.keys
    assert r.get(watch_key) == first.token.encode() and r.llen(wake_key) == 0


def test_a_worker_that_never_tried_the_watch_sends_nothing_as_it_stops(r: redis.Redis) -> None:
    watch = _watch(r, "w1")
    r.config_resetstat()
    watch.leave()
    assert r.info("stats")["total_commands_processed"] <= 1  # the INFO itself


def test_a_watch_whose_pubsub_connection_reconnected_during_its_start_starts_again(
    r: redis.Redis,
) -> None:
    """The loss is told (redis-py's connect callback, on RQ's pubsub thread) after the
    watcher looked the pubsub connection up and before ``watching`` is set: the watcher does
    not watch through a redirect to the connection that is gone (deaf to every push until
    its next keep, a third of a hold later); it gives the watch up for a moment and takes
    it again, vacant, at its next wait."""
    subscriber = r.pubsub()
    subscriber.subscribe("__redis__:invalidate")
    subscriber.get_message(timeout=1)
    (redirect,) = [int(c["id"]) for c in r.client_list(_type="pubsub")]
    watch = _watch(r, "w1")

    def found_then_reconnected(client: redis.Redis) -> int:
        watch.lost()  # told while the start is under way
        return redirect

    watch.line.find = found_then_reconnected  # type: ignore[method-assign]
    assert watch._hold()
    watch._start_watching()
    assert not watch.watching
    assert watch._vacant_maybe and not r.exists(watch.keys[0])

    watch.line.find = lambda client: redirect  # type: ignore[method-assign]
    watch._retry_at = 0.0
    assert watch._hold()
    watch._start_watching()
    assert watch.watching  # no loss meanwhile: it watches
    subscriber.close()
