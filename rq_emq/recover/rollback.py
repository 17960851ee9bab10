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
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from redis import Redis

from .. import scripts
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


def release_to_rq(
    client: Redis, queues: Sequence[str], layout: Callable[[str], QueueKeys] = QueueKeys
) -> list[Released]:
    script = scripts.load("release_leases_to_rq")
    results = []
    for queue in queues:
        q = layout(queue)
        released = Released(queue)
        keys = [q.leases, q.stalled, q.started, q.rq_queue, q.moving, q.stats]
        while True:
            args = [q.prefix, q.job_prefix, RQ_PREFIX, BATCH, released.alive]
            unpinned, requeued, alive, more = (int(n) for n in script(client, keys, args))
            released.unpinned += unpinned
            released.requeued += requeued
            released.alive += alive
            if not more:
                break
        results.append(released)
    return results
