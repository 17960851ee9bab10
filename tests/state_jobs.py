"""Jobs that change their Redis connection and leave it changed (the selected db, the user,
the protocol, tracking, the name, CLIENT REPLY, a subscription, an open MULTI or WATCH),
and what a worker whose memory a job reads looks like, for
tests/run/test_job_connection_state.py and tests/run/test_spare_age.py."""

from __future__ import annotations

import select
import time
from typing import Any

from rq import get_current_job

#: the user a job authenticates as: it may touch only its own keys, so a worker left on it
#: cannot take or record anything
JOB_USER, JOB_PASSWORD = "job-user", "job-password"
JOB_NAME = "left-by-a-job"
JOB_CHANNEL = "left-by-a-job"
#: where a job records the id of the connection it changed (read by the test)
CHANGED_KEY = "state-test:changed-connection"


def _other_protocol(connection: Any) -> int:
    return 2 if str(getattr(connection, "protocol", 2)) == "3" else 3


#: what each kind of change sends, and whether a reply comes back
CHANGES: dict[str, Any] = {
    "db": lambda c: (("SELECT", 1), True),
    "user": lambda c: (("AUTH", JOB_USER, JOB_PASSWORD), True),
    "protocol": lambda c: (("HELLO", _other_protocol(c)), True),
    "tracking": lambda c: (("CLIENT", "TRACKING", "ON"), True),
    "name": lambda c: (("CLIENT", "SETNAME", JOB_NAME), True),
    "reply": lambda c: (("CLIENT", "REPLY", "OFF"), False),
    "subscribe": lambda c: (("SUBSCRIBE", JOB_CHANNEL), True),
    "multi": lambda c: (("MULTI",), True),
    "watch": lambda c: (("WATCH", "state-test:watched"), True),
}


def _change(connection: Any, kind: str) -> None:
    """Send the change as raw bytes and drain its reply unparsed (a parser of one protocol
    would not read the other's HELLO reply, and redis-py would close the connection)."""
    args, replies = CHANGES[kind](connection)
    connection.send_command(*args)
    if replies:
        select.select([connection._sock], [], [], 5)
        connection._sock.recv(1 << 16)


def leave_changed_beside(kind: str) -> None:
    """Change the connection this run was given (its pool's first), and leave it idle in
    the pool, its finish going on another: as a job that used two connections leaves it."""
    job = get_current_job()
    pool = job.connection.connection_pool  # type: ignore[union-attr]
    changed = pool.get_connection()
    other = pool.get_connection()
    changed.send_command("CLIENT", "ID")
    changed_id = changed.read_response()
    other.send_command("SET", CHANGED_KEY, changed_id)
    other.read_response()
    _change(changed, kind)
    pool.release(changed)
    pool.release(other)


def select_db_1() -> None:
    """The job of issue 47: a SELECT on the job's connection, which its finish then uses."""
    job = get_current_job()
    connection = job.connection  # type: ignore[union-attr]
    connection.set(CHANGED_KEY, connection.client_id())
    connection.select(1)


def memory_age() -> float:
    """How old the worker's state this run sees is: the time since the stamp a thread of
    the worker (tests/big_heap_workers.py) moves every few ms was last moved."""
    import big_heap_workers

    return time.time() - big_heap_workers.STAMP[0]
