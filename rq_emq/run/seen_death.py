"""A worker death its watchdog saw, recovered at once: the watchdog, which outlives its
worker, ends the run's processes, waits until they are gone, then hands the lease the
worker held back through ``recover_crashed_job`` (one attempt counted, fenced by the
token, as for a horse the OOM killer took), instead of leaving it to lapse and to the sweep
(a lease and up to two sweep intervals later). A ``SimpleLeaseWorker`` ended by a cold stop
marks its lease ``hand back`` first (:meth:`rq_emq.run.horse_fence.HorseDeadline.hand_back_on_death`):
its watchdog then runs ``return_job_to_queue`` instead, no attempt counted, since the
process's death is the only proof that the run's threads are gone.

Two halves, one per process:

- the worker's: what the watchdog will need, handed to it as it starts (its stdin, never
  its command line: the Redis password is in it) — how to reach Redis (the worker's own
  connection settings, the Python path that finds redis-py) and the script — and, at each
  take, the lease it now holds, written in the memory it shares with its watchdog
  (:meth:`rq_emq.run.horse_fence.HorseDeadline.hold_lease`), forgotten as the run ends;
- the watchdog's: :func:`recover`, which opens a connection only then (a live worker's
  watchdog holds none), runs the script and closes it; over TCP or a Unix socket it
  speaks RESP itself (:mod:`.resp`: no import of redis-py, whose import on a loaded host
  could outlast a short lease), over TLS through redis-py.

What cannot be handed over is left to the sweep, as before: a connection whose class is
not redis-py's own TCP, TLS or Unix socket one (Sentinel, a custom class), settings that
are objects (a ``credential_provider``), a lease text over the memory's limit.
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any

#: redis-py's connection classes a watchdog can build from their settings alone.
PLAIN_CONNECTIONS = ("Connection", "SSLConnection", "UnixDomainSocketConnection")
#: Those the watchdog reaches with its own few lines of RESP (:mod:`.resp`), never
#: importing redis-py.
PLAIN_SOCKETS = ("Connection", "UnixDomainSocketConnection")
#: How long the watchdog gives a killed run's processes to be gone before it acts.
GONE_WITHIN_S = 5.0


def recovery_kit(connection: Any, default_max: int) -> bytes | None:
    """In the worker: what its watchdog needs to hand a lease back, or to renew it in a
    ``SimpleLeaseWorker``'s place (JSON: :mod:`.stand_in`), or None when its connection
    cannot be rebuilt from plain settings."""
    from .. import scripts
    from ..keys import RQ_PREFIX
    from ..recover.sweep import DEFAULT_FAILURE_TTL

    pool = connection.connection_pool
    cls = getattr(pool, "connection_class", None)
    if cls is None or cls.__module__ != "redis.connection" or cls.__name__ not in PLAIN_CONNECTIONS:
        return None
    settings = {
        name: value
        for name, value in pool.connection_kwargs.items()
        if isinstance(value, (str, int, float, bool)) or value is None
    }
    script = scripts.load("recover_crashed_job")
    returning = scripts.load("return_job_to_queue")
    renewing = scripts.load("renew_leases")
    return json.dumps(
        {
            "path": [entry for entry in sys.path if isinstance(entry, str)],
            "class": cls.__name__,
            "settings": settings,
            "script": script.source,
            "sha": script.sha,
            "return_script": returning.source,
            "return_sha": returning.sha,
            "renew_script": renewing.source,
            "renew_sha": renewing.sha,
            "rq_prefix": RQ_PREFIX,
            "default_max": default_max,
            "failure_ttl": DEFAULT_FAILURE_TTL,
        }
    ).encode()


def lease_text(lease: Any) -> str:
    """In the worker: the lease it took, as its watchdog reads it (job id, token, the
    script's keys)."""
    q = lease.keys
    keys = [*q.returning(lease.job_id), q.failed, q.outbox]
    return json.dumps({"job_id": lease.job_id, "token": lease.token, "keys": keys})


def call(
    kit: dict[str, Any], sha: str, source: str, keys: list[str], args: list[Any], timeout: float | None = None
) -> Any:
    """In the watchdog: one script call on a connection of its own, closed after it."""
    if kit["class"] in PLAIN_SOCKETS:
        # imported only now: a live worker's watchdog holds no socket module either
        if __package__:
            from .resp import call_script
        else:  # the watchdog's own interpreter: its neighbours by path
            from resp import call_script  # type: ignore[no-redef]
        return call_script(kit["settings"], sha, source, keys, args, timeout)
    return _call_with_redis_py(kit, sha, source, keys, args, timeout)


def _call_with_redis_py(
    kit: dict[str, Any], sha: str, source: str, keys: list[str], args: list[Any], timeout: float | None
) -> Any:
    """The script call over a connection only redis-py builds (TLS); ``timeout`` bounds
    its connect (the TLS handshake with it) and each reply, as the RESP path's."""
    for entry in kit["path"]:
        if entry not in sys.path:
            sys.path.append(entry)
    import redis
    import redis.connection

    settings = dict(kit["settings"])
    if timeout is not None:
        for name in ("socket_timeout", "socket_connect_timeout"):
            settings[name] = max(min(settings.get(name) or timeout, timeout), 0.001)
    pool = redis.ConnectionPool(connection_class=getattr(redis.connection, kit["class"]), **settings)
    client = redis.Redis(connection_pool=pool)
    try:
        try:
            return client.evalsha(sha, len(keys), *keys, *args)
        except redis.exceptions.NoScriptError:
            return client.eval(source, len(keys), *keys, *args)
    finally:
        pool.disconnect()


def recover(kit: dict[str, Any], lease: dict[str, Any], cause: str, hand_back: bool = False) -> str:
    """In the watchdog, its worker and the run seen gone: the lease recovered as a crash,
    or with ``hand_back`` (a cold stop) handed back with no attempt counted (the script's
    verdict, as one line)."""
    keys = lease["keys"]
    args = [lease["job_id"], lease["token"], kit["rq_prefix"]]
    sha, source = kit["sha"], kit["script"]
    if hand_back:
        keys = keys[:8]  # the job's, its lease's, its queue's and RQ's started registry
        sha, source = kit["return_sha"], kit["return_script"]
    else:
        ended_at = time.strftime("%Y-%m-%dT%H:%M:%S.000000Z", time.gmtime())
        args += [kit["default_max"], kit["failure_ttl"], ended_at, cause]
    reply = call(kit, sha, source, keys, args)
    verdict = int(reply[0])
    if hand_back:
        if verdict == 1:
            return f"job {lease['job_id']} back at the front of its queue (cold stop: attempt refunded)"
        return f"job {lease['job_id']} left as it is (its lease was no longer this worker's)"
    if verdict == 1:
        return f"job {lease['job_id']} back at the front of its queue (attempt {reply[1]} of {reply[2]})"
    if verdict == 2:
        return f"job {lease['job_id']} failed at max attempts ({reply[1]} of {reply[2]})"
    state = reply[1].decode() if isinstance(reply[1], bytes) else reply[1]
    return f"job {lease['job_id']} left as it is (its lease was {state})"
