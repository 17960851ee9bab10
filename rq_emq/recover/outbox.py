"""The failure outbox drain: the one place a sweeper runs user code.

A job the sweep (or a worker, for a crashed horse) failed at max attempts still needs
what Lua cannot do: RQ's ``Result`` and the job's failure callback. The drain claims due
entries (``claim_outbox``), runs each callback, then commits the Result with the outbox
removal in one fenced step, so a Result is written once; dependents follow RQ's rules
after it. A claim is acted on only if Sentinel confirms the master it was made on
(:mod:`rq_emq.connection.confirm`): a failure callback is an outside effect, and a demoted or
soon-demoted master's failures may be of jobs that finish on the new one.
"""

from __future__ import annotations

import logging
from typing import Any

from redis import Redis
from redis.exceptions import RedisError
from rq.job import Job
from rq.queue import Queue
from rq.results import Result

from .. import compat, scripts
from ..connection import confirm
from ..fence.fencing import Fence, LeaseLost, fenced
from ..hold.held import new_token
from ..keys import QueueKeys
from ..settings import LeaseSettings

logger = logging.getLogger("rq_emq.sweep")

DEFAULT_FAILURE_TTL = 365 * 24 * 3600  # RQ's own default
#: Shortest outbox claim; a claim lasts at least the job's failure callback timeout plus
#: OUTBOX_MARGIN_MS, so another drainer never runs a callback that is still running.
OUTBOX_CLAIM_MS = 60_000
OUTBOX_MARGIN_MS = 30_000
#: RQ's default callback timeout (seconds), for a job hash that names none.
DEFAULT_CALLBACK_TIMEOUT_S = 60
OUTBOX_BATCH = 20


class JobStalled(Exception):
    """The exception a failure callback receives for a job failed at max attempts."""


def _ids(values: list[Any]) -> list[str]:
    return [v.decode() if isinstance(v, bytes) else str(v) for v in values]


class OutboxDrain:
    """The drain, as the :class:`rq_emq.recover.sweep.Sweeper` runs it."""

    client: Redis
    name: str
    settings: LeaseSettings
    job_class: type[Job]
    queue_class: type[Queue]
    serializer: Any
    #: queues whose unconfirmed claims were logged, until a claim is confirmed again
    _unconfirmed_logged: set[str]

    def keys(self, queue: str) -> QueueKeys:
        raise NotImplementedError

    def drain_outbox(self, queue: str) -> int:
        """Write RQ's Result (once) and run the failure callback for jobs failed at max
        attempts; returns how many were completed here."""
        q = self.keys(queue)
        tokens = ["outbox:" + new_token(self.name) for _ in range(OUTBOX_BATCH)]
        prefix = q.job_prefix
        args = [OUTBOX_CLAIM_MS, OUTBOX_MARGIN_MS, DEFAULT_CALLBACK_TIMEOUT_S, prefix]
        claimed = self._claim_outbox(q, [*args, *tokens])
        done = 0
        for job_id, token in zip(claimed[0::2], claimed[1::2], strict=True):
            try:
                done += self._complete_failure(queue, job_id, token)
            except Exception:
                logger.exception(
                    "job %s on queue %s: could not complete its stall failure; will retry",
                    job_id,
                    queue,
                    extra={"job_id": job_id, "queue": queue},
                )
        return done

    def _claim_outbox(self, q: QueueKeys, args: list[Any]) -> list[str]:
        """Claim due outbox entries, and keep them only if the claim was made on the
        master Sentinel names now and replicated (rq_emq.connection.confirm): the drain runs failure
        callbacks, and a claim on a demoted or soon-demoted master is for a job that may
        finish on the new one. An unconfirmed claim lapses; the next drain tries again."""
        script = scripts.load("claim_outbox")
        for _ in range(2):
            pipe = self.client.pipeline(transaction=False)
            script.queue(pipe, [q.outbox], args)
            wait_ms = int(self.settings.redis_timeout_s * 1000) // 2
            before = confirm.claim_checks(self.client, pipe, wait_ms)
            replies = pipe.execute(raise_on_error=False)
            if scripts.is_noscript(replies[0]):
                script.load(self.client)
                continue
            if isinstance(replies[0], Exception):
                raise replies[0]
            claimed = _ids(replies[0])
            if claimed and not confirm.claim_confirmed(self.client, before, replies[1:]):
                if q.queue not in self._unconfirmed_logged:  # once per spell, not per round
                    self._unconfirmed_logged.add(q.queue)
                    logger.warning(
                        "queue %s: not running %d failure callback(s): the master is not confirmed "
                        "by Sentinel (a failover?); the claims are given back and retried",
                        q.queue,
                        len(claimed) // 2,
                        extra={"queue": q.queue},
                    )
                self._give_back(q, claimed[0::2])
                return []
            self._unconfirmed_logged.discard(q.queue)
            return claimed
        return []

    def _give_back(self, q: QueueKeys, job_ids: list[str]) -> None:
        """Make unconfirmed claims due again. Left to lapse, a claim held its job's Result
        and failure callback for the whole claim (60-90 s) after every failover, although
        Sentinel confirms the new master within seconds (found by the Sentinel soak). On a
        demoted master the write is refused or discarded with it; the claim token stays,
        and the next claim (``claim_outbox``) takes an ``outbox:`` owner over."""
        pipe = self.client.pipeline(transaction=False)
        for job_id in job_ids:
            pipe.zadd(q.outbox, {job_id: 0}, xx=True)
        try:
            pipe.execute()
        except RedisError:
            pass

    def _complete_failure(self, queue: str, job_id: str, token: str) -> int:
        job = self.job_class.fetch(job_id, connection=self.client, serializer=self.serializer)
        raw = self.client.hget(job.key, "emq_failure")
        reason = raw.decode() if isinstance(raw, bytes) else "stalled"
        # a stall's reason is "stalled on attempt ..."; a crash's names its cause already
        why = " (its worker died or lost its lease)" if reason.startswith("stalled") else ""
        exc_string = f"JobStalled: job {job_id} {reason}{why}; moved to FailedJobRegistry by rq-emq"
        compat.run_failure_callback(job, JobStalled(exc_string))
        ttl = job.failure_ttl if job.failure_ttl is not None else DEFAULT_FAILURE_TTL
        try:
            layout = self.keys(queue)
            with fenced(self.client, Fence(queue, job_id, token, counter="outbox_completed", layout=layout)):
                pipe = self.client.pipeline()
                Result.create_failure(job, ttl, exc_string=exc_string, pipeline=pipe)
                pipe.zrem(layout.outbox, job_id)
                if ttl == 0:
                    # as RQ's failure with failure_ttl=0: the job goes once its callback ran
                    job.delete(pipeline=pipe, remove_from_queue=False)
                pipe.execute()
        except LeaseLost:
            return 0  # another drainer took this entry over
        queue_obj = self.queue_class(
            queue, connection=self.client, job_class=self.job_class, serializer=self.serializer
        )
        queue_obj.enqueue_dependents(job)
        return 1
