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

The gate turns itself off while no replica can acknowledge: just after a switch, when the
master lists no replica online and had none since (its only replica is the old master,
which Sentinel demotes up to 10 s later and which then resyncs), at once; elsewhere after
DEGRADE_AFTER_S of unacknowledged takes and no switch (a replica slow or gone). Takes then
go on without waiting, each carrying ``INFO replication`` in its pipeline instead, and the
gate waits again from the first take that finds a replica online. So a failback, which
needs that replica back, meets the gate on (before: off for a fixed 30 s after every
switch, through the failback).

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
import math
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
#: worker then takes without the replica's acknowledgement, saying so once, until a take
#: finds a replica online again, or for DEGRADED_S at most...
DEGRADE_AFTER_S = 3.0
DEGRADED_S = 30.0
#: ...where a replica is online when the master lists it ``state=online`` with a lag (s since
#: its last acknowledgement) of at most this: it acknowledges a take's ``WAIT`` again.
ONLINE_LAG_S = 1
#: After a switch, how long the new master's replica may be the old master on its way
#: back (demoted up to 10 s after the switch, then resynced; a full sync of a large
#: dataset takes longer): a take it does not acknowledge is explained by that while the
#: master lists no replica online.
REJOIN_S = 60.0


class Watch(Protocol):
    """What a take's gate reads of its process's failover watch (the watch's module
    imports this one to give each watch its gate, so the gate names no class of it)."""

    @property
    def live_replicas(self) -> int: ...

    @property
    def moves(self) -> int: ...

    def pause(self, seconds: float) -> None: ...


def online_replicas(replication: Any) -> list[str]:
    """The replicas a master's ``INFO replication`` (as redis-py parses it) lists online and
    caught up, as ``host:port``: those that acknowledge a ``WAIT`` again."""
    if not isinstance(replication, dict):
        return []
    return [
        f"{r.get('ip')}:{r.get('port')}"
        for key, r in replication.items()
        if key.startswith("slave")
        and isinstance(r, dict)
        and r.get("state") == "online"
        and str(r.get("lag", "")).isdigit()
        and int(r["lag"]) <= ONLINE_LAG_S
    ]


class TakeConfirmation:
    """Whether a worker's takes wait for a replica's acknowledgement, and what it learned
    from the last ones (one per watch: every worker thread of the process shares it)."""

    def __init__(self, watch: Watch) -> None:
        self.watch = watch
        self._unacked_since: float | None = None
        self._unacked_moves = 0
        self._degraded_until = 0.0
        #: While degraded, a take's reply says whether a replica is online again (probing)
        self._probing = False
        #: The gate was turned back on by a replica found online, and no take has been
        #: acknowledged since: one that is "online" yet never acknowledges in time must not
        #: turn it on and off every few seconds (each time, 3 s of takes handed back)
        self._rearmed = False
        #: Replicas the master listed online at the last look (Sentinel's count, which the
        #: watch reads every few seconds, may not have them yet)
        self._seen_online = 0
        #: The last switch this gate saw (the watch's count) and when (monotonic), and
        #: whether a replica was seen online since (listed online, or acknowledging a take):
        #: a master that had one and lists none now may be being replaced (a failback)
        self._moves_seen = watch.moves
        self._switch_seen_at = -math.inf
        self._online_since_switch = False

    def wanted(self) -> bool:
        """Whether a take waits for a replica's acknowledgement now."""
        replicas = max(self.watch.live_replicas, self._seen_online)
        return replicas > 0 and time.monotonic() >= self._degraded_until

    def probing(self) -> bool:
        """Whether a take, not waiting (degraded), asks the master for its replicas."""
        return self._probing and time.monotonic() < self._degraded_until

    def just_switched(self) -> bool:
        """Whether the master moved within REJOIN_S: its replica may be the old master,
        still being demoted or resynced (a waiting take then asks for the replicas too)."""
        if self.watch.moves != self._moves_seen:
            self._moves_seen, self._switch_seen_at = self.watch.moves, time.monotonic()
            self._online_since_switch = False
        return time.monotonic() - self._switch_seen_at < REJOIN_S

    def acked(self) -> None:
        self._unacked_since = None
        self._rearmed = False
        self._online_since_switch = True

    def probed(self, replication: Any) -> None:
        """A degraded take's ``INFO replication``: once the master lists a replica online,
        the next takes wait for its acknowledgement again."""
        if not self._probing:
            return
        online = online_replicas(replication)
        self._seen_online = len(online)
        if not online:
            return
        self._online_since_switch = True
        self._degraded_until, self._probing, self._rearmed = 0.0, False, True
        logger.warning(
            "replica %s is online: takes wait for a replica's acknowledgement again", ", ".join(online)
        )

    def unacked(self, job_id: str, replication: Any = None) -> None:
        """A take no replica acknowledged (it was handed back): log the first of a run of
        them, and give up waiting for replicas when no switch explains the run. Just after
        a switch, a master whose ``replication`` lists no replica online, and that had none
        online since, has none that could acknowledge (the old master is still being
        demoted or resynced): no waiting then. One that had one may be being replaced (a
        failback): its takes are handed back as any."""
        now = time.monotonic()
        fresh = replication is not None and self.just_switched() and not self._online_since_switch
        if fresh and not online_replicas(replication):
            self._degrade(
                now, "the new master has no replica online yet (the old one is being demoted or resynced)"
            )
            return
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
            self._degrade(
                now,
                f"no replica has acknowledged a take for {DEGRADE_AFTER_S:.0f} s and Sentinel announced no "
                "switch (a replica slow or gone)",
            )
        self.watch.pause(UNCONFIRMED_PAUSE_S)

    def _degrade(self, now: float, why: str) -> None:
        """Take without waiting for a replica, until one is found online (probing) or for
        DEGRADED_S; a gate a replica "online" turned back on, with no acknowledgement since,
        stays off the full DEGRADED_S."""
        self._unacked_since, self._degraded_until, self._seen_online = None, now + DEGRADED_S, 0
        self._probing, self._rearmed = not self._rearmed, False
        until = "a take finds a replica online, at most" if self._probing else "the next"
        logger.warning(
            "%s: taking without a replica's acknowledgement until %s %.0f s; a failover "
            "meanwhile may lose such a take, and the job then runs again beside this run until "
            "its next renewal",
            why,
            until,
            DEGRADED_S,
        )


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
