"""Redis Cluster is not supported, because RQ does not support it: RQ's own keys of one
queue (``rq:queue:q``, ``rq:wip:q``, ``rq:job:<id>``) hash to different slots, and RQ writes
them together in one transaction. Ours carry the ``{queue}`` hash tag and would share a slot.
Pinned here on a one-node cluster that owns every slot: the refusal is loud, nothing is lost."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator

import pytest
import redis
from procs import Processes
from redis_server import require_redis_server
from rq import Queue

from rq_emq.keys import QueueKeys, job_key
from rq_emq.testing import RedisServer, free_port

pytestmark = pytest.mark.slow


def cluster_port() -> int:
    """A free port whose cluster bus port (10000 higher) is free too and below 65536."""
    while True:
        port = free_port()
        if port <= 55535 and port_is_free(port + 10000):
            return port


def port_is_free(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


@pytest.fixture
def cluster_node() -> Iterator[RedisServer]:
    require_redis_server()
    node = RedisServer(
        port=cluster_port(), extra_args=("--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf")
    ).start()
    client = redis.Redis.from_url(node.url)
    # (ADDSLOTS, not ADDSLOTSRANGE: the latter is Redis 7, and the bundled server is 6.2)
    client.execute_command("CLUSTER", "ADDSLOTS", *range(16384))
    deadline = time.monotonic() + 10
    while client.cluster("info")["cluster_state"] != "ok" and time.monotonic() < deadline:
        time.sleep(0.05)
    yield node
    node.stop()


def slot(client: redis.Redis, key: str) -> int:
    return int(client.cluster("keyslot", key))


def test_our_keys_of_a_queue_share_one_slot_and_rqs_do_not(cluster_node: RedisServer) -> None:
    client = redis.Redis.from_url(cluster_node.url)
    q = QueueKeys("default")
    ours = [q.lock("some-job"), q.leases, q.stalled, q.sweep, q.stats, q.outbox]
    assert len({slot(client, key) for key in ours}) == 1
    rqs = [q.rq_queue, q.started, q.failed, job_key("some-job")]
    assert len({slot(client, key) for key in rqs}) > 1


def test_on_a_cluster_rq_itself_refuses_to_enqueue_and_a_lease_worker_to_start(
    cluster_node: RedisServer, procs: Processes
) -> None:
    client = redis.Redis.from_url(cluster_node.url)
    with pytest.raises(redis.exceptions.ClusterCrossSlotError):
        Queue(connection=client).enqueue("jobs.add", 1, 2)
    worker = procs.worker(cluster_node.url, burst=True)
    assert worker.wait(timeout=60) != 0
    assert "hash to the same slot" in procs.log(worker)
