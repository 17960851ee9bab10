"""Handing leased jobs back to stock RQ, for a fleet rolled back to stock workers
(``rq-emq rollback``).

A lease worker pins the started-registry entry of every run it holds (score ``+inf``,
:mod:`rq_emq.recover.registries`), so that no stock process fails a leased job however long the
lease fleet is down: the sweep decides. Once no lease worker will ever sweep again, that
pin would keep a dead worker's job *started* forever. :func:`release_to_rq` ends every
lease whose lock is gone, one bounded script call at a time
(``release_leases_to_rq``): a run that started gets its entry scored due now (stock
cleanup then fails or retries it as stock RQ treats an abandoned job), a take that never
started goes back to the front of its queue, and our bookkeeping goes. Leases whose lock
is alive belong to lease workers still running: they are left, and counted.

One queue that cannot be handed back (RQ's queue list or started registry of another
type, or any error Redis answers) stops only that queue: it is named with why, and the
others are handed back all the same. Our own keys found malformed are no reason to stop
(``lua/lib/own_keys.lua``): they are reported with the queue.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from redis import Redis
from redis.exceptions import ResponseError

from .. import malformed, scripts
from ..keys import RQ_PREFIX, QueueKeys

#: Entries one script call looks at per part (bounds its run time).
BATCH = 200


@dataclass
class Released:
    """What one queue's release did."""

    queue: str
    #: runs whose started-registry entry was handed to stock cleanup
    unpinned: int = 0
    #: jobs put back in their queue (taken but never started, or moved and never claimed)
    requeued: int = 0
    #: leases left because their lock is alive: a lease worker still runs the job
    alive: int = 0
    #: why this queue could not be handed back (all of it or the rest of it); "" when it was
    error: str = ""
    #: our keys found malformed on this queue, as "<key>: <what>" (skipped or replaced)
    problems: list[str] = field(default_factory=list)


def release_to_rq(
    client: Redis, queues: Sequence[str], layout: Callable[[str], QueueKeys] = QueueKeys
) -> list[Released]:
    script = scripts.load("release_leases_to_rq")
    results = []
    for queue in queues:
        q = layout(queue)
        released = Released(queue)
        keys = [q.leases, q.stalled, q.started, q.rq_queue, q.moving, q.stats]
        try:
            _release_queue(client, script, keys, q, released)
        except ResponseError as error:
            released.error = str(error)
        results.append(released)
    return results


def _release_queue(
    client: Redis, script: scripts.LuaScript, keys: list[str], q: QueueKeys, released: Released
) -> None:
    """Call the script until the queue is done, adding up into ``released``."""
    while True:
        args = [q.prefix, q.job_prefix, RQ_PREFIX, BATCH, released.alive]
        reply = script(client, keys, args)
        if int(reply[0]) == -1:
            released.error = reply[1].decode() if isinstance(reply[1], bytes) else str(reply[1])
            return
        unpinned, requeued, alive, more = (int(n) for n in reply[:4])
        released.unpinned += unpinned
        released.requeued += requeued
        released.alive += alive
        for key, what in malformed.report(reply[4]):
            if f"{key}: {what}" not in released.problems:
                released.problems.append(f"{key}: {what}")
        if not more:
            return
