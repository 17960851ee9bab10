"""The soak's TCP proxy: what a client behind it sees when it is cut and healed."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest
import redis

from soak.proxy import TcpProxy


@pytest.fixture
def proxy(redis_url: str) -> Iterator[TcpProxy]:
    port = int(redis_url.rsplit(":", 1)[1].split("/")[0])
    tcp = TcpProxy(port).start()
    yield tcp
    tcp.close()


def client(proxy: TcpProxy, **kwargs: float) -> redis.Redis:
    return redis.Redis.from_url(proxy.url, retry=None, **kwargs)


def test_a_client_behind_the_proxy_reaches_redis(r: redis.Redis, proxy: TcpProxy) -> None:
    c = client(proxy)
    c.set("k", "v")
    assert r.get("k") == b"v"
    assert len(proxy.upstream_addresses()) == 1


def test_a_reset_cut_drops_live_connections_and_refuses_new_ones_until_healed(
    r: redis.Redis, proxy: TcpProxy
) -> None:
    c = client(proxy)
    c.ping()
    proxy.cut("reset")
    with pytest.raises(redis.ConnectionError):
        c.ping()
    with pytest.raises(redis.ConnectionError):
        client(proxy).ping()
    proxy.heal()
    assert client(proxy).ping()


def test_a_blackhole_holds_commands_and_delivers_them_on_heal(r: redis.Redis, proxy: TcpProxy) -> None:
    c = client(proxy, socket_timeout=10)
    c.ping()
    proxy.cut("blackhole")
    done = threading.Event()
    threading.Thread(target=lambda: (c.set("held", "1"), done.set()), daemon=True).start()
    assert not done.wait(0.5)  # nothing gets through, and nobody is told
    assert r.get("held") is None
    proxy.heal()
    assert done.wait(5)
    assert r.get("held") == b"1"


def test_a_cut_of_new_connections_keeps_live_ones(r: redis.Redis, proxy: TcpProxy) -> None:
    live = client(proxy)
    live.ping()
    proxy.cut("new")
    assert live.ping()
    with pytest.raises(redis.ConnectionError):
        client(proxy).ping()
    proxy.heal()
    assert client(proxy).ping()


def test_a_hang_lets_commands_through_and_holds_the_replies_until_the_client_gives_up(
    r: redis.Redis, proxy: TcpProxy
) -> None:
    """The soak's ``hang``: a renewal reaches Redis and runs, but its answer never comes; the
    client waits on its socket timeout (nothing is closed, so nothing tells it sooner)."""
    c = client(proxy, socket_timeout=0.3)
    c.ping()
    proxy.cut("hang")
    with pytest.raises(redis.TimeoutError):
        c.set("hung", "1")
    assert r.get("hung") == b"1"  # the command itself got through
    proxy.heal()
    assert client(proxy).ping()
