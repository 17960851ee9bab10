"""Redis key names: ours (``emq:{<queue>}:...``) and the RQ keys our scripts touch.

The ``{queue}`` hash tag keeps one queue's lease keys in one cluster slot. RQ's own keys
keep their meaning so ``rq info``, rq-dashboard and django-rq read them as usual.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

JOB_PREFIX = "rq:job:"
QUEUE_PREFIX = "rq:queue:"


def job_key(job_id: str) -> str:
    return JOB_PREFIX + job_id


@dataclass(frozen=True)
class QueueKeys:
    """Every key that belongs to one queue, RQ's and ours."""

    queue: str

    @property
    def prefix(self) -> str:
        """Prefix of per-job lease keys: ``<prefix><job_id>:lock``."""
        return f"emq:{{{self.queue}}}:"

    def lock(self, job_id: str) -> str:
        return f"{self.prefix}{job_id}:lock"

    @property
    def leases(self) -> str:
        return self.prefix + "leases"

    @property
    def stalled(self) -> str:
        return self.prefix + "stalled"

    @property
    def sweep(self) -> str:
        return self.prefix + "sweep"

    @property
    def stats(self) -> str:
        return self.prefix + "stats"

    @property
    def outbox(self) -> str:
        return self.prefix + "outbox"

    @property
    def rq_queue(self) -> str:
        return QUEUE_PREFIX + self.queue

    @property
    def intermediate(self) -> str:
        return QUEUE_PREFIX + self.queue + ":intermediate"

    @property
    def started(self) -> str:
        return "rq:wip:" + self.queue

    @property
    def failed(self) -> str:
        return "rq:failed:" + self.queue


def sweeper_election_key(queues: list[str]) -> str:
    """The sweeper election of one set of queues (order and repeats do not matter): JSON
    keeps every set apart, even of names holding commas or quotes."""
    return "emq:sweeper:" + json.dumps(sorted(set(queues)))
