"""The watchdog's hand-back speaks RESP itself over TCP and Unix sockets (rq_emq/run/resp.py):
it reaches Redis as the worker's settings say (its db, its ACL user, its socket), falls
back from EVALSHA to EVAL on a server that lacks the script, raises Redis's errors, and
imports no redis-py, whose import on a loaded host could outlast a short lease."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import redis

from rq_emq.run import seen_death
from rq_emq.run.resp import ReplyError, call_script
from rq_emq.testing import RedisServer

SET_AND_ECHO = "redis.call('SET', KEYS[1], ARGV[1]); return {1, ARGV[1], {redis.call('DBSIZE')}}"
SHA = hashlib.sha1(SET_AND_ECHO.encode()).hexdigest()


def settings_of(client: redis.Redis) -> dict[str, object]:
    kwargs = client.connection_pool.connection_kwargs
    return {k: v for k, v in kwargs.items() if isinstance(v, (str, int, float, bool)) or v is None}


def test_a_script_call_falls_back_to_eval_and_reads_nested_replies(r: redis.Redis, redis_url: str) -> None:
    reply = call_script(settings_of(redis.Redis.from_url(redis_url)), SHA, SET_AND_ECHO, ["k"], ["v"])
    assert reply == [1, b"v", [1]]  # the script was not loaded: EVALSHA refused, EVAL ran it
    assert r.get("k") == b"v"
    assert r.script_exists(SHA) == [True]
    assert call_script(settings_of(redis.Redis.from_url(redis_url)), SHA, "", ["k"], ["w"])[1] == b"w"


def test_a_script_call_uses_the_workers_db_and_acl_user(r: redis.Redis, redis_url: str) -> None:
    r.acl_setuser(
        "handback",
        enabled=True,
        passwords=["+s3cret"],
        keys=["~*"],
        commands=["+evalsha", "+eval", "+set", "+dbsize", "+select"],
    )
    try:
        r.acl_log_reset()
        user_url = redis_url.replace("redis://", "redis://handback:s3cret@").rsplit("/", 1)[0] + "/3"
        reply = call_script(
            settings_of(redis.Redis.from_url(user_url)), SHA, SET_AND_ECHO, ["k"], ["in db 3"]
        )
        assert reply[1] == b"in db 3"
        assert redis.Redis.from_url(redis_url.rsplit("/", 1)[0] + "/3").get("k") == b"in db 3"
        assert r.get("k") is None
        assert r.acl_log() == []  # nothing it sent was denied
        with pytest.raises(ReplyError, match="WRONGPASS"):
            bad = redis.Redis.from_url(user_url.replace("s3cret", "wrong"))
            call_script(settings_of(bad), SHA, SET_AND_ECHO, ["k"], ["v"])
    finally:
        r.acl_deluser("handback")
        redis.Redis.from_url(redis_url.rsplit("/", 1)[0] + "/3").flushdb()


def test_a_scripts_error_is_raised(r: redis.Redis, redis_url: str) -> None:
    failing = "return redis.error_reply('ERR no such lease')"
    sha = hashlib.sha1(failing.encode()).hexdigest()
    with pytest.raises(ReplyError, match="no such lease"):
        call_script(settings_of(redis.Redis.from_url(redis_url)), sha, failing, [], [])


def test_a_script_call_reaches_redis_over_a_unix_socket(tmp_path: Path) -> None:
    sock = tmp_path / "redis.sock"
    server = RedisServer(extra_args=("--unixsocket", str(sock), "--unixsocketperm", "700")).start()
    try:
        client = redis.Redis(unix_socket_path=str(sock), db=2)
        assert client.connection_pool.connection_class.__name__ in seen_death.PLAIN_SOCKETS
        reply = call_script(settings_of(client), SHA, SET_AND_ECHO, ["k"], ["over the socket"])
        assert reply[1] == b"over the socket" and client.get("k") == b"over the socket"
    finally:
        server.stop()


def test_the_watchdogs_hand_back_imports_no_redis_py(r: redis.Redis, redis_url: str) -> None:
    """Run as the watchdog runs (``python -I -S``, its neighbours by path): the hand-back of a
    lease whose job is gone gets the script's verdict, and redis-py stays unimported."""
    kit = seen_death.recovery_kit(redis.Redis.from_url(redis_url), default_max=5)
    assert kit is not None
    lease = {"job_id": "gone", "token": "t:w", "keys": [f"k{i}" for i in range(10)]}
    run_dir = Path(seen_death.__file__).parent
    program = (
        "import json, sys\n"
        f"sys.path.append({str(run_dir)!r})\n"
        "import seen_death\n"
        "kit, lease = json.loads(sys.stdin.read())\n"
        "print(seen_death.recover(kit, lease, 'test'))\n"
        "print('redis-py imported' if 'redis' in sys.modules else 'no redis-py')\n"
    )
    done = subprocess.run(
        [sys.executable, "-I", "-S", "-c", program],
        input=json.dumps([json.loads(kit), lease]),
        capture_output=True,
        text=True,
        timeout=30,
        env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"},
    )
    assert done.returncode == 0, done.stderr
    said, imported = done.stdout.splitlines()
    assert said.startswith("job gone left as it is"), said
    assert imported == "no redis-py"


def test_a_call_to_a_frozen_redis_gives_up_at_its_timeout(tmp_path: Path) -> None:
    """The watchdog's stand-in renewal must not outlast the run's deadline: a Redis that
    accepts the connection and never answers (SIGSTOPped) ends the whole call at its
    timeout, the script's fallback included."""
    server = RedisServer().start()
    try:
        settings = settings_of(redis.Redis.from_url(server.url))
        assert server.process is not None
        os.kill(server.process.pid, signal.SIGSTOP)
        started = time.monotonic()
        with pytest.raises(OSError):
            call_script(settings, SHA, SET_AND_ECHO, ["k"], ["v"], timeout=0.5)
        # 0.5 s by the call; 1.5 s of slack for a loaded host
        assert time.monotonic() - started < 2.0
        os.kill(server.process.pid, signal.SIGCONT)
    finally:
        server.stop()
