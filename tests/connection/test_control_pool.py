"""The control connection, shared in turn: the lock manager's renewals are served before
any other waiter, so sharing it cannot queue a renewal behind the sweeper's calls."""

from __future__ import annotations

import threading
import time

import redis

from rq_emq.connection.budget import RenewalsFirstPool, control_client


def test_the_control_pool_holds_one_connection_and_serves_the_renewals_first(r: redis.Redis) -> None:
    control = control_client(r, timeout_s=5)
    pool = control.connection_pool
    assert isinstance(pool, RenewalsFirstPool)
    order: list[str] = []
    held = pool.get_connection()  # a sweep call in flight

    def take(name: str, first: bool) -> None:
        if first:
            pool.serve_first()
        connection = pool.get_connection()
        order.append(name)
        assert connection is held  # one connection, never a second
        time.sleep(0.05)
        pool.release(connection)

    others = [threading.Thread(target=take, args=(f"other-{i}", False)) for i in range(3)]
    for thread in others:
        thread.start()
    time.sleep(0.2)  # three waiting already
    renewal = threading.Thread(target=take, args=("renewal", True))
    renewal.start()
    time.sleep(0.2)
    pool.release(held)
    for thread in [*others, renewal]:
        thread.join(timeout=5)
    assert order[0] == "renewal", order
    assert control.ping()
