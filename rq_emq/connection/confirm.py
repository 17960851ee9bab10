"""What a worker may act on while Sentinel may be moving the master: a take counts only
once a replica has it, and the outbox drain runs user code only from a claim on the master
Sentinel names.

After ``SENTINEL FAILOVER`` promotes the replica, the old master still grants takes until
the switch is announced, and none of them reaches the new master, where another worker
would take the same job: run, the two would overlap. So while Sentinel knows a live
replica, :class:`TakeConfirmation` (the take's gate, one per process's watch,
:mod:`rq_emq.connection.failover`) makes a take count only once a replica acknowledged it
(``WAIT 1`` on the take's own connection); an unconfirmed take is handed back at once
(harmless on either master), and the worker pauses until the switch is heard.

:func:`claim_checks` and :func:`claim_confirmed` are the outbox drain's gate (the one place
a sweeper runs user code): a claim counts only if it was made on the master Sentinel names
(same run id, read on the claim's own connection), a replica acknowledged it (``WAIT``),
and Sentinel still names that master afterwards. A claim on a demoted or soon-demoted
master is left to lapse; its data goes with the resync.

A client that is not Sentinel-managed is left alone (every gate here lets it through).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from typing import Any, Protocol

from redis import Redis

from .discovery import Master, confirmed_master, live_replicas, sentinel_of, text_of

logger = logging.getLogger("rq_emq.failover")  # the name operators filter on, as before the split

#: How long a take waits for a replica's acknowledgement; it takes about one replication
#: round trip on a healthy link, so this is all slack for a loaded host.
TAKE_WAIT_MS = 250
#: A worker whose takes go unacknowledged pauses this long (cut short by a switch).
UNCONFIRMED_PAUSE_S = 0.5
#: Takes unacknowledged this long with no switch announced mean a replica that is slow or
#: gone, not a promotion (Sentinel announces a promotion within a second or two): the
#: worker then takes without the replica's acknowledgement for DEGRADED_S, saying so once.
DEGRADE_AFTER_S = 3.0
DEGRADED_S = 30.0


class Watch(Protocol):
    """What a take's gate reads of its process's failover watch (the watch's module
    imports this one to give each watch its gate, so the gate names no class of it)."""

    @property
    def live_replicas(self) -> int: ...

    @property
    def moves(self) -> int: ...

    def pause(self, seconds: float) -> None: ...


class TakeConfirmation:
    """Whether a worker's takes wait for a replica's acknowledgement, and what it learned
    from the last ones (one per watch: every worker thread of the process shares it)."""

    def __init__(self, watch: Watch) -> None:
        self.watch = watch
        self._unacked_since: float | None = None
        self._unacked_moves = 0
        self._degraded_until = 0.0

    def wanted(self) -> bool:
        return self.watch.live_replicas > 0 and time.monotonic() >= self._degraded_until

    def acked(self) -> None:
        self._unacked_since = None

    def unacked(self, job_id: str) -> None:
        """A take no replica acknowledged (it was handed back): log the first of a run of
        them, and give up waiting for replicas when no switch explains the run."""
        now = time.monotonic()
        if self._unacked_since is None or self._unacked_moves != self.watch.moves:
            self._unacked_since, self._unacked_moves = now, self.watch.moves
            logger.warning(
                "job %s: no replica acknowledged its take within %d ms (a failover under way?): "
                "handed back; takes resume once the switch is heard or a replica answers",
                job_id,
                TAKE_WAIT_MS,
                extra={"job_id": job_id},
            )
        elif now - self._unacked_since > DEGRADE_AFTER_S:
            self._unacked_since, self._degraded_until = None, now + DEGRADED_S
            logger.warning(
                "no replica has acknowledged a take for %.0f s and Sentinel announced no switch: "
                "taking without a replica's acknowledgement for %.0f s",
                DEGRADE_AFTER_S,
                DEGRADED_S,
            )
        self.watch.pause(UNCONFIRMED_PAUSE_S)


# -- acting only on a confirmed master --------------------------------------------------


def claim_checks(client: Redis, pipe: Any, timeout_ms: int) -> Master | None:
    """Before a claim whose holder will run user code: the master Sentinel names now, and
    the checks queued on ``pipe`` after the claim (the claim's own connection): the
    server's run id, and ``WAIT`` for one replica when Sentinel sees one up. None for a
    client that is not Sentinel-managed (nothing is queued)."""
    found = sentinel_of(client)
    if found is None:
        return None
    master = confirmed_master(*found)
    if master is not None:
        # a replica Sentinel knows but sees down (a killed master that has not rejoined)
        # acknowledges nothing: waiting for it would hold every failure callback until it
        # is back, however long (the Sentinel soak's seed 3 never got them run)
        master = dataclasses.replace(master, replicas=live_replicas(*found))
    pipe.execute_command("INFO", "server")
    if master is not None and master.replicas > 0:
        pipe.execute_command("WAIT", 1, max(timeout_ms, 1))
    return master


def claim_confirmed(client: Redis, before: Master | None, replies: list[Any]) -> bool:
    """Whether a claim made on the connection that answered ``replies`` (those queued by
    :func:`claim_checks`) may be acted on: it was made on the master Sentinel named,
    replicated, and Sentinel names the same master still."""
    found = sentinel_of(client)
    if found is None:
        return True
    if before is None or not replies or not isinstance(replies[0], dict):
        return False
    if text_of(replies[0].get("run_id", "")) != before.run_id:
        return False
    if before.replicas > 0 and (len(replies) < 2 or not isinstance(replies[1], int) or replies[1] < 1):
        return False
    after = confirmed_master(*found)
    return after is not None and after.run_id == before.run_id and after.epoch == before.epoch
