"""A lease holder's start and normal finish commit as RQ's own MULTI/EXEC, under a WATCH of
the job hash whose read showed the lease held; every other case keeps the fenced scripts.
Driven directly against a real Redis: what lands, what is refused, what aborts."""

from __future__ import annotations

from typing import Any

import pytest
import redis
from helpers import leased_job, rq_moves
from redis.connection import AbstractConnection

from rq_emq import compat, scripts
from rq_emq.fence import watched_commit
from rq_emq.fence.fencing import LeaseLost, fenced
from rq_emq.keys import QueueKeys, job_key

pytestmark = pytest.mark.rq_versions

#: Under RQ 2.x a finish keeps the script (compat.SUCCESS_LOOP_RETRIES_WHOLE).
RQ_3_FINISH = pytest.mark.skipif(
    not compat.SUCCESS_LOOP_RETRIES_WHOLE, reason="RQ 2.x's success loop drops the execution on a retry"
)


@pytest.fixture(autouse=True)
def loaded(r: redis.Redis) -> None:
    """The scripts loaded, as a worker loads them at start: a first call under a WATCH would
    otherwise end in a WatchError for RQ's loop to retry."""
    scripts.load_all(r)


def _sent(monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    """From now on, the names of the commands in each send to Redis (one per round trip)."""
    sends: list[list[str]] = []
    original = AbstractConnection.send_packed_command

    def recording(self: AbstractConnection, command: Any, check_health: bool = True) -> None:
        chunks = command if isinstance(command, list) else [command]
        data = b"".join(bytes(chunk) for chunk in chunks)
        names = [word.decode().upper() for word in _command_names(data)]
        sends.append(names)
        original(self, command, check_health)

    monkeypatch.setattr(AbstractConnection, "send_packed_command", recording)
    return sends


def _command_names(data: bytes) -> list[bytes]:
    """The first word of each RESP array command in ``data``."""
    names, at = [], 0
    while at < len(data) and data[at : at + 1] == b"*":
        end = data.index(b"\r\n", at)
        count = int(data[at + 1 : end])
        at = end + 2
        for index in range(count):
            end = data.index(b"\r\n", at)
            size = int(data[at + 1 : end])
            word = data[end + 2 : end + 2 + size]
            if index == 0:
                names.append(word)
            at = end + 2 + size + 2
    return names


def _rq_finish(r: redis.Redis, job_id: str, between: Any = None) -> list[Any]:
    """RQ's success path as it talks to Redis: WATCH the dependents key, read it, then the
    outcome's transaction (status, registry, expiry); ``between`` runs after the read."""
    with r.pipeline() as pipe:
        pipe.watch(f"rq:job:{job_id}:dependents")
        pipe.smembers(f"rq:job:{job_id}:dependents")
        if between is not None:
            between()
        pipe.multi()
        pipe.hset(job_key(job_id), "status", "finished")
        pipe.zadd("rq:finished:q", {job_id: 1})
        pipe.expire(job_key(job_id), 500)
        return pipe.execute()


def _rq_start(r: redis.Redis, job_id: str) -> list[Any]:
    """RQ's start as it talks to Redis: one transaction that marks the job started."""
    with r.pipeline() as pipe:
        pipe.hset(job_key(job_id), mapping={"status": "started", "started_at": "2026-12-06T00:00:00Z"})
        pipe.zadd("rq:wip:q", {f"{job_id}:e1": float("inf")})
        pipe.persist(job_key(job_id))
        return pipe.execute()


@RQ_3_FINISH
def test_a_holders_finish_is_rqs_transaction_with_the_release_and_no_script(
    r: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    job, lease = leased_job(r)
    q = QueueKeys("q")
    sends = _sent(monkeypatch)
    with fenced(r, lease.fence) as session:
        replies = _rq_finish(r, job.id)
    assert session.committed
    assert replies == [0, 1, True]  # RQ's own replies, as redis-py gives them
    assert sends == [
        ["WATCH", "SMEMBERS", "HMGET"],
        ["MULTI", "HSET", "ZADD", "EXPIRE", "DEL", "ZREM", "ZREM", "HDEL", "HSET", "HINCRBY", "EXEC"],
    ]
    fields = r.hgetall(job_key(job.id))
    assert fields[b"status"] == b"finished"
    assert fields[b"emq_token"] == f"done:{lease.token}".encode()
    assert not [field for field in fields if field in {f.encode() for f in watched_commit.ENDED_FIELDS}]
    assert not r.exists(q.lock(job.id)) and r.zscore(q.leases, job.id) is None
    assert int(r.hget(q.stats, "finished")) == 1


def test_a_watched_commit_leaves_the_job_as_the_fenced_script_would(r: redis.Redis) -> None:
    """The same outcome, once by the watched transaction and once by ``finish_job`` (no
    WATCH of RQ's: the script's path), leaves the same job hash, lock and indexes."""
    states = []
    for watched in (True, False):
        r.flushdb()
        scripts.load_all(r)
        job, lease = leased_job(r)
        r.zadd(QueueKeys("q").stalled, {job.id: 1})
        r.hset(job_key(job.id), mapping={"emq_report": "{}", "emq_crashes": "1"})
        with fenced(r, lease.fence):
            if watched:
                _rq_finish(r, job.id)
            else:
                with r.pipeline() as pipe:
                    pipe.hset(job_key(job.id), "status", "finished")
                    pipe.zadd("rq:finished:q", {job.id: 1})
                    pipe.expire(job_key(job.id), 500)
                    pipe.execute()
        fields = r.hgetall(job_key(job.id))
        q = QueueKeys("q")
        states.append(
            (
                sorted(field for field in fields if field != b"emq_token"),
                fields[b"emq_token"] == f"done:{lease.token}".encode(),
                r.exists(q.lock(job.id)),
                r.zcard(q.leases),
                r.zcard(q.stalled),
                r.hget(q.stats, "finished"),
            )
        )
    assert states[0] == states[1]


@RQ_3_FINISH
def test_a_write_to_the_job_after_the_read_aborts_the_finish_and_rqs_retry_is_refused(
    r: redis.Redis,
) -> None:
    """A recovery between the finish's read and its EXEC (another holder now) aborts the
    EXEC: nothing of it lands, RQ's loop runs the block again, and that run is refused."""
    job, lease = leased_job(r)

    def recovered() -> None:
        r.hset(job_key(job.id), "emq_token", "another-holder")

    with fenced(r, lease.fence) as session:
        with pytest.raises(redis.WatchError):
            _rq_finish(r, job.id, between=recovered)
        assert r.hget(job_key(job.id), "status") != b"finished" and not r.exists("rq:finished:q")
        with pytest.raises(LeaseLost):
            _rq_finish(r, job.id)
    assert not session.committed
    assert r.hget(job_key(job.id), "status") != b"finished" and not r.exists("rq:finished:q")


def test_a_finish_whose_lease_was_lost_before_the_read_writes_nothing(r: redis.Redis) -> None:
    job, lease = leased_job(r)
    r.hset(job_key(job.id), "emq_token", "another-holder")
    with fenced(r, lease.fence), pytest.raises(LeaseLost):
        _rq_finish(r, job.id)
    assert r.hget(job_key(job.id), "status") != b"finished" and not r.exists("rq:finished:q")


def test_a_finish_after_rq_changed_the_job_goes_to_the_script_that_reads_the_evidence(
    r: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A job whose status RQ changed since the lease's last write is not committed on the
    read: ``finish_job`` decides (here a stale save put it nowhere: still the holder's)."""
    job, lease = leased_job(r)
    r.hset(job_key(job.id), "status", "failed")  # a stale whole-hash save: in no registry
    sends = _sent(monkeypatch)
    with fenced(r, lease.fence) as session:
        _rq_finish(r, job.id)
    assert session.committed
    assert "EVALSHA" in sends[-1]
    assert r.hget(job_key(job.id), "status") == b"finished"


def test_a_finish_after_rq_ended_the_job_is_refused_and_the_job_left_as_rq_put_it(r: redis.Redis) -> None:
    """A cancel while the job ran (canceled, in RQ's canceled registry): the read shows the
    lease touched, so no watched commit; the script reads RQ's placement and refuses."""
    job, lease = leased_job(r)
    rq_moves(r, job.id, "canceled")
    with fenced(r, lease.fence) as session, pytest.raises(LeaseLost):
        _rq_finish(r, job.id)
    assert session.ended_status == "canceled"
    assert r.hget(job_key(job.id), "status") == b"canceled" and not r.exists("rq:finished:q")


def test_a_start_after_rq_ended_the_job_is_refused(r: redis.Redis) -> None:
    job, lease = leased_job(r)
    rq_moves(r, job.id, "canceled")
    with fenced(r, lease.fence, release=False), pytest.raises(LeaseLost):
        _rq_start(r, job.id)
    assert r.hget(job_key(job.id), "status") == b"canceled" and not r.exists("rq:wip:q")


def test_a_finish_that_deletes_the_job_goes_to_the_script_that_leaves_the_tombstone(
    r: redis.Redis,
) -> None:
    """``result_ttl=0``: RQ's transaction deletes the job, so the lease's end is kept on the
    lock (``done:<token>``) by ``finish_job``; no job hash is written again."""
    job, lease = leased_job(r)
    with fenced(r, lease.fence), r.pipeline() as pipe:
        pipe.watch(f"rq:job:{job.id}:dependents")
        pipe.smembers(f"rq:job:{job.id}:dependents")
        pipe.multi()
        pipe.delete(job_key(job.id))
        pipe.execute()
    assert not r.exists(job_key(job.id))
    assert r.get(QueueKeys("q").lock(job.id)) == f"done:{lease.token}".encode()


def test_keeps_job_reads_every_command_that_names_the_job(r: redis.Redis) -> None:
    key = "rq:job:x"
    assert watched_commit.keeps_job([(("HSET", key, "a", "b"), {}), (("EXPIRE", key, 5), {})], key)
    assert watched_commit.keeps_job([(("PERSIST", key), {}), (("ZADD", "z", 1, "x"), {})], key)
    assert not watched_commit.keeps_job([(("DEL", "other", key), {})], key)
    assert not watched_commit.keeps_job([(("EXPIRE", key, 0), {})], key)
    assert not watched_commit.keeps_job([(("HDEL", key, "status"), {})], key)
    assert not watched_commit.keeps_job([(("RENAME", key, "elsewhere"), {})], key)


def test_a_holders_start_is_one_transaction_after_one_watched_read(
    r: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    job, lease = leased_job(r)
    sends = _sent(monkeypatch)
    with fenced(r, lease.fence, release=False) as session:
        replies = _rq_start(r, job.id)
    assert session.committed and len(replies) == 3 and replies[1] == 1
    assert sends == [["WATCH", "HMGET"], ["MULTI", "HSET", "ZADD", "PERSIST", "EXEC"]]
    fields = r.hgetall(job_key(job.id))
    # the lease records RQ's start as its own, in RQ's own HSET
    assert fields[b"status"] == fields[b"emq_status"] == b"started"
    assert fields[b"emq_started_at"] == b"2026-12-06T00:00:00Z"
    assert fields[b"emq_token"] == lease.token.encode()
    assert r.exists(QueueKeys("q").lock(job.id))


def test_a_start_whose_lease_was_lost_writes_nothing(r: redis.Redis) -> None:
    job, lease = leased_job(r)
    r.hset(job_key(job.id), "emq_token", "another-holder")
    with fenced(r, lease.fence, release=False), pytest.raises(LeaseLost):
        _rq_start(r, job.id)
    assert r.hget(job_key(job.id), "status") == b"queued" and not r.exists("rq:wip:q")


def test_a_start_whose_job_was_written_after_the_read_is_decided_by_the_script(
    r: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A recovery between the start's read and its EXEC aborts the EXEC; RQ's start does
    not retry a WatchError, so the script decides at once: the lease is lost, refused."""
    job, lease = leased_job(r)
    read_held = watched_commit.held

    def held_then_recovered(read: list[Any], token: str) -> bool:
        shown = read_held(read, token)
        r.hset(job_key(job.id), "emq_token", "another-holder")
        return shown

    monkeypatch.setattr(watched_commit, "held", held_then_recovered)
    with fenced(r, lease.fence, release=False), pytest.raises(LeaseLost):
        _rq_start(r, job.id)
    assert r.hget(job_key(job.id), "status") == b"queued" and not r.exists("rq:wip:q")


def _cut_every_client_but(r: redis.Redis) -> redis.Redis:
    """A client of its own that cuts every other connection (a blip for the others)."""
    kwargs = r.connection_pool.connection_kwargs
    other = redis.Redis(host=kwargs["host"], port=kwargs["port"])
    other.client_kill_filter(_type="normal", skipme=True)
    return other


@RQ_3_FINISH
def test_a_blip_before_a_watched_finish_lands_is_rqs_watch_error_and_the_retry_commits(
    r: redis.Redis,
) -> None:
    """The connection lost between the read and the EXEC: as under the script's call, a
    WatchError that RQ's loop answers by running its block again, which then commits once."""
    job, lease = leased_job(r)
    with fenced(r, lease.fence) as session:
        with pytest.raises(redis.WatchError):
            _rq_finish(r, job.id, between=lambda: _cut_every_client_but(r))
        assert r.hget(job_key(job.id), "status") != b"finished"
        _rq_finish(r, job.id)
    assert session.committed and r.hget(job_key(job.id), "status") == b"finished"
    assert int(r.hget(QueueKeys("q").stats, "finished")) == 1


def test_a_blip_before_a_watched_start_lands_is_the_blip(
    r: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """RQ's start does not retry a WatchError: a lost connection reaches the worker's retry
    of the start as the ConnectionError the script's call would raise, nothing written."""
    job, lease = leased_job(r)
    read_held = watched_commit.held

    def held_then_cut(read: list[Any], token: str) -> bool:
        _cut_every_client_but(r)
        return read_held(read, token)

    monkeypatch.setattr(watched_commit, "held", held_then_cut)
    with fenced(r, lease.fence, release=False), pytest.raises(redis.ConnectionError):
        _rq_start(r, job.id)
    assert r.hget(job_key(job.id), "status") == b"queued" and not r.exists("rq:wip:q")


@pytest.mark.skipif(compat.SUCCESS_LOOP_RETRIES_WHOLE, reason="RQ 2.x only")
def test_under_rq_2_a_finish_keeps_the_one_script_call(
    r: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """RQ 2.x's success loop drops the run's execution in its first pass: a second pass
    (after a renewal's write aborted a watched finish) would leave the started-registry
    entry behind. Its finish is the script call inside RQ's own transaction, which no
    write to the job hash aborts."""
    job, lease = leased_job(r)
    sends = _sent(monkeypatch)
    with fenced(r, lease.fence) as session:
        _rq_finish(r, job.id, between=lambda: r.hset(job_key(job.id), "last_heartbeat", "now"))
    finish = [names for names in sends if "HSET" not in names or "EXEC" in names]
    assert finish[0] == ["WATCH", "SMEMBERS"] and "EVALSHA" in finish[-1]
    assert session.committed and r.hget(job_key(job.id), "status") == b"finished"
