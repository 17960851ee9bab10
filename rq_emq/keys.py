"""Redis key names: ours (``emq:{<queue>}:...``) and the RQ keys our scripts touch.

The ``{queue}`` hash tag keeps one queue's lease keys in one cluster slot. RQ's own keys
keep their meaning so ``rq info``, rq-dashboard and django-rq read them as usual.

Every RQ key is built the way RQ builds it, never hard-coded: a job's hash from its job
class's ``redis_job_namespace_prefix``, a queue's list from its queue class's
``redis_queue_namespace_prefix`` (``--job-class``, ``--queue-class``), the registries from
RQ's own ``key_template`` and executions from RQ's key prefix (``RQ_KEY_PREFIX`` in RQ 3).
The scripts get each prefix from the caller.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from rq.job import Job
from rq.queue import Queue
from rq.registry import FailedJobRegistry, StartedJobRegistry

#: RQ's defaults (RQ 3 reads them from ``RQ_KEY_PREFIX``; RQ 2 has ``rq``).
JOB_PREFIX: str = Job.redis_job_namespace_prefix
QUEUE_PREFIX: str = Queue.redis_queue_namespace_prefix
#: The prefix of RQ's per-run keys, which no class overrides: ``<p>executions:<job id>``,
#: ``<p>execution:<job id>:<execution id>``, ``<p>worker:<name>:executions``.
RQ_PREFIX: str = StartedJobRegistry.key_template.split(":wip:")[0].replace("{{", "{").replace("}}", "}") + ":"

#: The queue prefix whose lease keys keep the plain ``emq:{<queue>}:`` form.
_PLAIN_QUEUE_PREFIX = "rq:queue:"


#: The job-hash field that names the started-registry entry a lease worker pinned for the
#: job's run (``<job_id>:<execution_id>``, :mod:`rq_emq.recover.registries`), so that our scripts
#: find it even after RQ's execution records expired (a fleet down for hours).
PINNED_FIELD = "emq_started"


def job_key(job_id: str, job_prefix: str = JOB_PREFIX) -> str:
    return job_prefix + job_id


@dataclass(frozen=True)
class QueueKeys:
    """Every key that belongs to one queue, RQ's and ours."""

    queue: str
    #: The queue class's ``redis_queue_namespace_prefix``.
    queue_prefix: str = QUEUE_PREFIX
    #: The job class's ``redis_job_namespace_prefix``: where this queue's jobs live.
    job_prefix: str = JOB_PREFIX

    @classmethod
    def of(cls, queue: Any) -> QueueKeys:
        """The keys of an RQ ``Queue`` object, by its class and its job class."""
        return cls.named(queue.name, type(queue), queue.job_class)

    @classmethod
    def named(cls, name: str, queue_class: Any = None, job_class: Any = None) -> QueueKeys:
        return cls(
            name,
            getattr(queue_class, "redis_queue_namespace_prefix", QUEUE_PREFIX),
            getattr(job_class, "redis_job_namespace_prefix", JOB_PREFIX),
        )

    @property
    def prefix(self) -> str:
        """Prefix of per-job lease keys: ``<prefix><job_id>:lock``. A queue class with its
        own namespace gets lease keys of its own, so that its ``default`` queue and RQ's
        ``default`` queue never share a lease index."""
        if self.queue_prefix == _PLAIN_QUEUE_PREFIX:
            return f"emq:{{{self.queue}}}:"
        return f"emq:{{{self.queue}}}:{self.queue_prefix}"

    def job(self, job_id: str) -> str:
        return self.job_prefix + job_id

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
    def events(self) -> str:
        """The queue's recent lease events: a capped stream (``lua/lib/record.lua``)."""
        return self.prefix + "events"

    @property
    def minutes(self) -> str:
        """Marks, recoveries, failures and crashes per minute of the last hour (a ring hash)."""
        return self.prefix + "minutes"

    @property
    def swept(self) -> str:
        """When the queue's last sweep round ran, and by which sweeper (``"<ms> <name>"``)."""
        return self.prefix + "swept"

    @property
    def jobs_at(self) -> str:
        """Where the queue's workers keep its jobs: their job class's prefix (a string)."""
        return self.prefix + "job_prefix"

    @property
    def rq_queue(self) -> str:
        return self.queue_prefix + self.queue

    @property
    def intermediate(self) -> str:
        """RQ's own list between a stock worker's ``BLMOVE`` and its start: ours never go there."""
        return self.rq_queue + ":intermediate"

    @property
    def moving(self) -> str:
        """Where an idle LeaseWorker's ``BLMOVE`` puts a job until its claim leases it (a
        list of our own, so that no stock worker's job is ever in it and RQ's
        intermediate-list cleanup never sees one of ours)."""
        return self.prefix + "moving"

    def returning(self, job_id: str) -> list[str]:
        """The keys a script that takes a leased job out of flight and back to its queue
        names first (``return_job_to_queue``, ``recover_crashed_job``): the job, its lock,
        the lease index, the stall marks, the counters, the queue, the moving list and
        RQ's started registry."""
        return [
            self.job(job_id),
            self.lock(job_id),
            self.leases,
            self.stalled,
            self.stats,
            self.rq_queue,
            self.moving,
            self.started,
        ]

    @property
    def started(self) -> str:
        return str(StartedJobRegistry.key_template.format(self.queue))

    @property
    def failed(self) -> str:
        return str(FailedJobRegistry.key_template.format(self.queue))


def sweeper_election_key(
    queues: list[str], queue_prefix: str = QUEUE_PREFIX, job_prefix: str = JOB_PREFIX
) -> str:
    """The sweeper election of one set of queues (order and repeats do not matter): JSON
    keeps every set apart, even of names holding commas or quotes. Queues of another
    namespace (queue or job class) are other queues: their set gets an election of its
    own, so that RQ's ``default`` and a custom class's ``default`` each have a sweeper."""
    names = json.dumps(sorted(set(queues)))
    if queue_prefix == _PLAIN_QUEUE_PREFIX and job_prefix == JOB_PREFIX:
        return "emq:sweeper:" + names
    return "emq:sweeper:" + json.dumps([queue_prefix, job_prefix]) + names


def sweeper_deputy_key(election_key: str) -> str:
    """The deputy of one sweeper election (its token, with an expiry): the one standby that
    watches the election; the others wait in :func:`sweeper_line_key`."""
    return election_key + ":deputy"


def sweeper_line_key(election_key: str) -> str:
    """The line of one sweeper election's standbys: a list holding the sweeper's call when
    its set has no deputy, announced on the pubsub channel of the same name, on which
    every standby listens."""
    return election_key + ":line"


def watch_key(election_key: str) -> str:
    """The idle watcher of one set of several queues (its token, with an expiry)."""
    return election_key + ":watch"


def wake_key(election_key: str) -> str:
    """The wake list of one set of several queues: its other idle workers block on it."""
    return election_key + ":wake"
