"""The soak's requeue watcher, the recovery bound's clock: it sees a faulted holder's job
leave it by the evidence Redis holds (fakeredis: logic only, no timing)."""

from __future__ import annotations

import threading
import time

import fakeredis

from rq_emq.keys import QueueKeys
from soak.faults import Fault
from soak.fleet import QUEUE
from soak.watchers import Watchers

TOKEN = b"a1b2:worker-1"


def watch(client: fakeredis.FakeRedis, fault: Fault) -> Fault:
    watchers = Watchers.__new__(Watchers)
    watchers.client = client
    watchers.faults = [fault]
    watchers._guard = threading.Lock()
    watchers._stop = threading.Event()
    thread = threading.Thread(target=watchers.watch_requeues, daemon=True)
    thread.start()
    time.sleep(0.2)
    watchers._stop.set()
    thread.join(timeout=5)
    return fault


def held(client: fakeredis.FakeRedis, token: bytes = TOKEN) -> Fault:
    client.hset("rq:job:j", "emq_token", token)
    client.zadd(QueueKeys(QUEUE).leases, {"j": 1})
    return Fault("stop_long", time.time(), "soak-w1-1", job_id="j", token=TOKEN, lapse_at=time.time())


def test_a_job_its_holder_still_leases_has_not_left_it() -> None:
    client = fakeredis.FakeRedis()
    assert watch(client, held(client)).requeued_at is None


def test_a_job_the_sweep_recovered_left_its_holder() -> None:
    client = fakeredis.FakeRedis()
    fault = held(client)
    client.hdel("rq:job:j", "emq_token")
    client.zrem(QueueKeys(QUEUE).leases, "j")
    assert watch(client, fault).requeued_at is not None


def test_a_job_whose_lease_the_sweep_dropped_as_rq_had_put_it_elsewhere_left_its_holder() -> None:
    """A web process enqueued the running job again and a stock worker ran the copy: the
    sweep drops only the lease, and the old token stands on the job for good."""
    client = fakeredis.FakeRedis()
    fault = held(client)
    client.zrem(QueueKeys(QUEUE).leases, "j")
    assert watch(client, fault).requeued_at is not None


def test_a_job_its_holder_finished_never_lapsed() -> None:
    client = fakeredis.FakeRedis()
    fault = held(client)
    client.hset("rq:job:j", "emq_token", b"done:" + TOKEN)
    client.zrem(QueueKeys(QUEUE).leases, "j")
    fault = watch(client, fault)
    assert fault.requeued_at is None and fault.detail.endswith("!")
