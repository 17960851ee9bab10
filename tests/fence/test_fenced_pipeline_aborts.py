"""A job's fenced pipeline (``current_lease().fenced_pipeline()``) commits as MULTI/EXEC
does: a command MULTI refuses as it is queued (unknown, wrong arity, an ACL denial) aborts
the whole block, nothing written; a command that fails as it runs (WRONGTYPE) gets its
error in place and the others are written. Each case is checked beside a stock
``pipeline(transaction=True)`` on the same Redis."""

from __future__ import annotations

import math
import secrets
from collections.abc import Callable
from typing import Any

import pytest
import redis
from helpers import leased_job
from redis.client import Pipeline
from redis.exceptions import NoPermissionError, ResponseError

from rq_emq.run.job_lease import JobLease

pytestmark = pytest.mark.rq_versions

#: Commands queued after a good SET; each is refused by MULTI as it is queued.
QUEUE_TIME: dict[str, Callable[[Pipeline], Any]] = {
    "wrong arity": lambda pipe: pipe.execute_command("HSET", "b", "field-without-value"),
    "unknown command": lambda pipe: pipe.execute_command("NOSUCHCOMMAND", "b"),
}


def job_pipeline(r: redis.Redis, client: redis.Redis | None = None) -> Pipeline:
    """The fenced pipeline of a job leased on ``r``, on ``client`` (default: ``r``)."""
    _, lease = leased_job(r)
    job_lease = JobLease(lease, client or r, held_until=lambda: math.inf, stopping=lambda: False)
    return job_lease.fenced_pipeline()


@pytest.mark.parametrize("refused", QUEUE_TIME)
def test_a_command_multi_refuses_as_queued_aborts_the_whole_block_writing_nothing(
    r: redis.Redis, refused: str
) -> None:
    """The old fenced pipeline ran the commands one by one: the SET before the refused
    command was committed, where EXEC writes nothing."""
    stock = r.pipeline(transaction=True)
    stock.set("a", "stock")
    QUEUE_TIME[refused](stock)
    with pytest.raises(ResponseError) as stock_error:
        stock.execute()
    assert not r.exists("a")

    fenced = job_pipeline(r)
    fenced.set("a", "fenced")
    QUEUE_TIME[refused](fenced)
    fenced.set("c", "fenced")
    with pytest.raises(ResponseError) as fenced_error:
        fenced.execute()
    assert not r.exists("a") and not r.exists("c")
    assert "Command # 2" in str(fenced_error.value) and "Command # 2" in str(stock_error.value)
    assert str(stock_error.value).split("caused error: ")[1].split(" ")[0] in str(fenced_error.value)
    # the pipeline is reset: it can be used again, and commits then
    fenced.set("a", "again")
    assert fenced.execute() == [True] and r.get("a") == b"again"


def test_a_command_that_fails_as_it_runs_gets_its_error_in_place_as_exec_gives_it(r: redis.Redis) -> None:
    r.set("s", "a string")
    replies = []
    for pipe in (r.pipeline(transaction=True), job_pipeline(r)):
        pipe.set("a", "1")
        pipe.hset("s", "f", "v")  # WRONGTYPE as it runs
        pipe.set("c", "2")
        replies.append(pipe.execute(raise_on_error=False))
        assert r.get("a") == b"1" and r.get("c") == b"2"
        r.delete("a", "c")
    for got in replies:
        assert got[0] is True and isinstance(got[1], ResponseError) and got[2] is True


@pytest.fixture
def limited(r: redis.Redis) -> Any:
    """A client of an ACL user who may run everything but SADD."""
    if int(r.info("server")["redis_version"].split(".")[0]) < 7:
        pytest.skip("Redis 6.2's scripts cannot ask the ACL before running a command")
    user, password = f"emq-{secrets.token_hex(4)}", secrets.token_hex(8)
    r.acl_setuser(user, enabled=True, passwords=[f"+{password}"], commands=["+@all", "-sadd"], keys=["*"])
    client = redis.Redis(
        connection_pool=redis.ConnectionPool(
            **{**r.connection_pool.connection_kwargs, "username": user, "password": password}
        )
    )
    yield client
    client.close()
    r.acl_deluser(user)


def test_a_command_the_acl_denies_aborts_the_whole_block_as_exec_does(
    r: redis.Redis, limited: redis.Redis
) -> None:
    stock = limited.pipeline(transaction=True)
    stock.set("a", "stock")
    stock.sadd("s", "m")
    with pytest.raises(NoPermissionError):
        stock.execute()
    assert not r.exists("a")

    fenced = job_pipeline(r, limited)
    fenced.set("a", "fenced")
    fenced.sadd("s", "m")
    with pytest.raises(NoPermissionError, match="Command # 2"):
        fenced.execute()
    assert not r.exists("a") and not r.exists("s")
