"""One job a process holds: the lease's token and where the job lives, the holder's local
lease clock, what the run has learned of the lease (lost, settled, expired), and the
job's reports waiting for the next renewal. The lock manager (:mod:`.lease`) renews
these; the worker and the job's own view of its lease (``rq_emq.current_lease()``) read
them.
"""

from __future__ import annotations

import math
import secrets
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from redis import Redis

from .. import malformed, scripts
from ..fence.fencing import Fence
from ..keys import RQ_PREFIX, QueueKeys


def new_token(worker_name: str) -> str:
    """A lease token: 128 random bits, then the holder's name for people reading Redis."""
    return f"{secrets.token_hex(16)}:{worker_name}"


@dataclass
class Lease:
    """One job this process holds: where it lives, the token that proves it, RQ objects."""

    queue: str
    job_id: str
    token: str
    job: Any = None
    execution: Any = None
    #: The job's own max attempts (from its meta), recorded with its start.
    max_attempts: int | None = None
    #: Renewal found the lease taken from us (recovered, or the job deleted).
    lost: bool = field(default=False)
    #: Renewal found the job already finished by us (a tick raced the finish).
    settled: bool = field(default=False)
    #: Local lease clock: monotonic time until which this holder trusts the lease (the
    #: last successful renewal's or the take's send time + lease - margin). Past it the
    #: job is stopped, whether or not Redis answers.
    valid_until: float = field(default=math.inf)
    #: The local clock ran out (the job was stopped for it).
    expired: bool = field(default=False)
    #: Where the job and its queue live (the worker's job and queue classes); None: RQ's
    #: default layout for ``queue``.
    layout: QueueKeys | None = None
    #: The attempt this take counted (1 for a first run), and the job's fencing token for
    #: this grant (``emq_fence``: higher on every grant of the job, never less): what
    #: the job itself reads through ``rq_emq.current_lease()``. 0: not known.
    attempt: int = 0
    fencing_token: int = 0
    #: The job's own progress timeout (``meta=rq_emq.progress_timeout(ms)``), in ms: a
    #: renewal refuses the lease once the job has not reported for that long. None: none.
    progress_timeout_ms: int | None = None
    #: Where the job's reports are read: the memory a horse shares with its worker
    #: (``HorseDeadline.read_report``); None: posted in this process (:meth:`post_report`).
    report_source: Callable[[], tuple[int, str] | None] | None = None
    #: The number of the last report a renewal landed, and its text (JSON).
    report_sent: int = 0
    last_report: str | None = None
    _posted: tuple[int, str] | None = field(default=None, repr=False)

    @property
    def keys(self) -> QueueKeys:
        return self.layout if self.layout is not None else QueueKeys(self.queue)

    @property
    def fence(self) -> Fence:
        own_max = "" if self.max_attempts is None else str(self.max_attempts)
        # past its local deadline this holder no longer trusts the lease: a token that
        # matches nothing makes every fenced write refused, so the lease lapses in Redis
        # and the sweep recovers the job (attempt counted) instead of a failure written
        token = f"expired:{self.token}" if self.expired else self.token
        execution_id = getattr(self.execution, "id", None)
        entry = f"{self.job_id}:{execution_id}" if execution_id else ""
        return Fence(
            self.queue, self.job_id, token, max_attempts=own_max, layout=self.layout, started_entry=entry
        )

    def post_report(self, text: str) -> None:
        """The job's newest report, in the process whose lock manager holds this lease
        (a ``SimpleLeaseWorker``); the next tick sends the newest only."""
        number = self._posted[0] + 1 if self._posted is not None else 1
        self._posted = (number, text)

    def pending_report(self) -> tuple[int, str] | None:
        """The newest report no renewal has landed yet: (its number, its JSON text)."""
        found = self.report_source() if self.report_source is not None else self._posted
        if found is None or found[0] <= self.report_sent:
            return None
        return found

    def hand_back(self, client: Redis) -> bool:
        """Put the job back at the front of its queue, attempt refunded, if this lease
        still owns it (``return_job_to_queue``); False when it was not ours any more."""
        keys = self.keys.returning(self.job_id)
        reply = scripts.load("return_job_to_queue")(client, keys, [self.job_id, self.token, RQ_PREFIX])
        malformed.report(reply[1])
        return bool(int(reply[0]))
