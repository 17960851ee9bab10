"""The two-phase stalled sweep, from the caller's side.

The decisions live in ``move_stalled_jobs_to_wait`` (one EVALSHA per call, bounded work,
rate limited fleet-wide); this module runs its rounds, continues a round while the script
says there is more, and then has the outbox of jobs it failed at max attempts drained
(:mod:`rq_emq.recover.outbox`: RQ's ``Result`` written exactly once, the failure callback before
that commit, dependents after it). The sweep itself never unpickles anything; only the
drain, like RQ's own cleanup, loads the job.

Every LeaseWorker runs a :class:`Sweeper` thread for its queues, but only the one elected
for its queue set (:mod:`rq_emq.recover.election`) sweeps; the others stand by (one deputy watching
the election, the rest waiting in a line). ``rq-emq reaper``
runs the same loop on its own, always sweeping. A sweeper that finds nothing in flight
(one ``EXISTS``) looks again only after half a lease: a job taken meanwhile cannot lapse
before that look, which then finds it and returns to rounds every sweep interval.
"""

from __future__ import annotations

import logging
import random
from dataclasses import dataclass, field
from typing import Any

from redis import Redis
from rq.job import Job
from rq.queue import Queue
from rq.utils import now, utcformat

from .. import events, malformed, scripts
from ..connection import failover
from ..connection.blips import BLIPS
from ..hold.background import BackgroundLoop, Stopping
from ..keys import RQ_PREFIX, QueueKeys
from ..settings import LeaseSettings
from .election import SweeperElection
from .outbox import DEFAULT_FAILURE_TTL, JobStalled, OutboxDrain

__all__ = ["DEFAULT_FAILURE_TTL", "JobStalled", "SweepReport", "Sweeper"]

logger = logging.getLogger("rq_emq.sweep")

MAX_CALLS_PER_ROUND = 100


@dataclass
class SweepReport:
    """What one sweep round of one queue did (or, dry, would do)."""

    queue: str
    ran: bool
    marked: list[str] = field(default_factory=list)
    requeued: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    dropped: list[str] = field(default_factory=list)
    #: Jobs RQ ended while they were leased (canceled, failed or requeued by stock cleanup,
    #: ...): their lease entry went, the job was left as RQ put it.
    ended: list[str] = field(default_factory=list)
    unmarked: int = 0
    calls: int = 0
    outbox_due: int = 0
    #: Why nothing was swept ("" when it ran or another sweeper had the round): the
    #: queue's workers keep their jobs under another job key prefix than this sweeper's.
    refused: str = ""
    #: Our keys the round found malformed, as "<key>: <what>" (skipped or replaced, never
    #: a reason to stop: lua/lib/own_keys.lua); each is logged once per process too.
    problems: list[str] = field(default_factory=list)


def _ids(values: list[Any]) -> list[str]:
    return [v.decode() if isinstance(v, bytes) else str(v) for v in values]


class Sweeper(OutboxDrain, BackgroundLoop):
    """Runs sweep rounds for some queues, and drains their failure outboxes."""

    def __init__(
        self,
        client: Redis,
        queues: list[str],
        settings: LeaseSettings,
        name: str = "rq-emq-sweeper",
        job_class: type[Job] = Job,
        serializer: Any = None,
        drain: bool = True,
        elect: bool = False,
        queue_class: type[Queue] = Queue,
    ) -> None:
        super().__init__(name)
        self.client = client
        self.queues = list(queues)
        self.settings = settings
        self.job_class = job_class
        #: With ``job_class``, where the queues' lists and jobs live (``--queue-class``).
        self.queue_class = queue_class
        self._refusals_logged: set[str] = set()
        self._unconfirmed_logged: set[str] = set()
        self.serializer = serializer
        #: Drain the outbox after a round; off where the app's code (the job's serializer,
        #: its failure callback) is not importable, leaving it to the workers' sweepers.
        self.drain = drain
        #: Sweep only while elected for this queue set (workers); None sweeps always (reaper).
        layout = QueueKeys.named("", queue_class, job_class)
        self.election = (
            SweeperElection(
                client,
                self.queues,
                self.idle_ms,
                name,
                layout.queue_prefix,
                layout.job_prefix,
                lease_ms=settings.lease_ms,
                stopping=self._stop,  # a standby waiting in the line stops waiting at once
            )
            if elect
            else None
        )
        events.subscribe_paths(settings.event_hooks)

    # A round runs at most once per window (0.8 interval) per queue, fleet-wide, and each
    # sweeper tries every 0.9 interval (from a random phase), so rounds are between 0.8 and
    # 0.9 intervals apart: a lapsed lease is marked within one interval and recovered
    # within the next, while an idle worker costs one round trip per 0.9 interval.
    @property
    def window_ms(self) -> int:
        return max(self.settings.sweep_interval_ms * 4 // 5, 1)

    @property
    def poll_ms(self) -> int:
        return max(self.settings.sweep_interval_ms * 9 // 10, 1)

    @property
    def idle_ms(self) -> int:
        """How long a sweeper that found nothing in flight waits before it looks again:
        half a lease, so that a job taken just after the look is seen at the next one,
        well before its lease could lapse (and never less than the poll)."""
        return max(self.settings.lease_ms // 2, self.poll_ms)

    @property
    def grace_ms(self) -> int:
        """How long a mark stands before recovery: a round's spacing, and at least one
        renew interval (plus a quarter) so that a live holder gets to renew after a
        stall of Redis itself let every lease lapse at once."""
        return max(self.window_ms, self.settings.renew_interval_ms * 5 // 4)

    def keys(self, queue: str) -> QueueKeys:
        """``queue``'s keys, as the sweeper's queue and job classes build them."""
        return QueueKeys.named(queue, self.queue_class, self.job_class)

    def _call(self, queue: str, mode: str) -> tuple[list[str], list[Any]]:
        q = self.keys(queue)
        keys = [
            q.leases,
            q.stalled,
            q.sweep,
            q.stats,
            q.rq_queue,
            q.moving,
            q.started,
            q.failed,
            q.outbox,
        ]
        args = [
            self.window_ms,
            self.settings.sweep_batch,
            q.prefix,
            DEFAULT_FAILURE_TTL,
            self.settings.max_attempts,
            mode,
            utcformat(now()),
            self.grace_ms,
            q.job_prefix,
            RQ_PREFIX,
            self.name,
        ]
        return keys, args

    def _refuse(self, report: SweepReport, recorded: str) -> SweepReport:
        mine = self.keys(report.queue).job_prefix
        report.refused = (
            f"queue {report.queue}: its workers keep jobs under {recorded!r} (their job class), "
            f"this sweeper's job class under {mine!r}; not swept (give it the workers' job class)"
        )
        return report

    def record_job_prefix(self) -> None:
        """Tell every sweeper of these queues where this process's jobs live, so that one
        with another job class refuses to sweep instead of taking each job for deleted."""
        pipe = self.client.pipeline(transaction=False)
        for queue in self.queues:
            q = self.keys(queue)
            pipe.set(q.jobs_at, q.job_prefix)
        pipe.execute()

    def sweep(self, queue: str, mode: str = "round", first_reply: Any = None) -> SweepReport:
        """One round on ``queue``: ``round`` (rate limited), ``force`` (ignore the rate
        limit, for ``--once``) or ``dry-run`` (change nothing, report what would happen)."""
        script = scripts.load("move_stalled_jobs_to_wait")
        report = SweepReport(queue, ran=False)
        call_mode = "continue" if mode == "force" else mode
        reply = first_reply
        while report.calls < MAX_CALLS_PER_ROUND:
            if reply is None:
                reply = script(self.client, *self._call(queue, call_mode))
            report.calls += 1
            if int(reply[0]) == -1:
                return self._refuse(report, _ids(reply[1:2])[0])
            if int(reply[0]) == 0:
                return report
            report.ran = True
            report.marked += _ids(reply[1])
            report.requeued += _ids(reply[2])
            report.failed += _ids(reply[3])
            report.unmarked += int(reply[4])
            report.dropped += _ids(reply[5])
            report.outbox_due = int(reply[7])
            report.ended += _ids(reply[8])
            for key, what in malformed.report(reply[9] if len(reply) > 9 else []):
                if f"{key}: {what}" not in report.problems:
                    report.problems.append(f"{key}: {what}")
            if mode == "dry-run" or not int(reply[6]):
                break
            call_mode, reply = "continue", None
        self._log(report, dry=mode == "dry-run")
        if mode != "dry-run":
            events.emit("marked", queue, report.marked, self.name)
            events.emit("recovered", queue, report.requeued, self.name)
            events.emit("failed", queue, report.failed, self.name)
        return report

    def sweep_all(self) -> list[SweepReport]:
        """A rate-limited round on every queue: the first calls share one round trip."""
        script = scripts.load("move_stalled_jobs_to_wait")
        pipe = self.client.pipeline(transaction=False)
        for queue in self.queues:
            script.queue(pipe, *self._call(queue, "round"))
        replies = pipe.execute(raise_on_error=False)
        if any(scripts.is_noscript(reply) for reply in replies):
            script.load(self.client)
            return [self.sweep(queue) for queue in self.queues]
        for reply in replies:
            if isinstance(reply, Exception):
                raise reply
        return [
            self.sweep(queue, first_reply=reply) for queue, reply in zip(self.queues, replies, strict=True)
        ]

    def _log(self, report: SweepReport, dry: bool) -> None:
        verb = "would be" if dry else "was"
        for level, job_ids, what in (
            (logging.INFO, report.marked, "job %s on queue %s %s marked stalled (lock gone)"),
            (logging.WARNING, report.requeued, "job %s on queue %s %s recovered to the front of its queue"),
            (logging.WARNING, report.failed, "job %s on queue %s %s failed at max attempts"),
            (logging.WARNING, report.dropped, "lease entry %s on queue %s names a deleted job; %s dropped"),
            (logging.INFO, report.ended, "job %s on queue %s: RQ ended it while leased; lease %s dropped"),
        ):
            for job_id in job_ids:
                logger.log(
                    level, what, job_id, report.queue, verb, extra={"job_id": job_id, "queue": report.queue}
                )

    # -- the loop --------------------------------------------------------------------------
    def _work_keys(self) -> list[str]:
        """Keys that exist whenever a round has anything to do on one of the queues: a
        lease, a mark, the moving list (a take's BLMOVE) or a failure to complete."""
        keys: list[str] = []
        for queue in self.queues:
            q = self.keys(queue)
            keys += [q.leases, q.stalled, q.moving, q.outbox]
        return keys

    def has_work(self) -> bool:
        """Whether any of the queues has anything a round would look at (one command)."""
        return bool(self.queues) and bool(self.client.exists(*self._work_keys()))

    def run_once(self) -> list[SweepReport]:
        """A rate-limited round on every queue, unless none has anything in flight (then
        no round runs and no report comes back)."""
        if not self.has_work():
            return []
        reports = self.sweep_all()
        for report in reports:
            if report.refused and report.queue not in self._refusals_logged:
                self._refusals_logged.add(report.queue)  # once: it is a setup to fix, not news
                logger.error("%s", report.refused, extra={"queue": report.queue})
            if report.outbox_due and self.drain:
                self.drain_outbox(report.queue)
        return reports

    def sweep_now(self) -> list[SweepReport]:
        """A round on every queue now, rate limit or not (a burst worker about to exit),
        with the outboxes drained."""
        reports = [self.sweep(queue, mode="force") for queue in self.queues]
        for report in reports:
            if report.outbox_due and self.drain:
                self.drain_outbox(report.queue)
        return reports

    def jobs_waiting(self) -> bool:
        """Whether any of the queues has a job waiting in it."""
        pipe = self.client.pipeline(transaction=False)
        for queue in self.queues:
            pipe.llen(QueueKeys(queue).rq_queue)
        return any(int(length) for length in pipe.execute())

    def marks_standing(self) -> bool:
        """Whether any of the queues has a job marked stalled and not yet recovered."""
        pipe = self.client.pipeline(transaction=False)
        for queue in self.queues:
            pipe.zcard(self.keys(queue).stalled)
        return any(int(count) for count in pipe.execute())

    def tick(self) -> float:
        """One step of the loop: sweep if elected (or not electing); returns the seconds
        to wait before the next step."""
        if self.election is not None and not self.election.hold():
            return self.election.standby_pause()
        busy = bool(self.run_once())
        return (self.poll_ms if busy else self.idle_ms) / 1000.0

    def start(self) -> None:
        failover.watch(self.client)  # a Sentinel switch breaks this client's connections at once
        super().start()

    def _failed(self, error: Exception, down: bool) -> bool:
        """Log a failed step: a traceback for a bug, one line when Redis went away (a
        failover, a restart), and nothing while it stays away. Returns whether it is away."""
        if not isinstance(error, BLIPS):
            logger.error("sweep failed; retrying", exc_info=error)
            return down
        if not down:
            logger.warning("sweep: Redis unreachable (%s); retrying quietly until it answers", error)
        return True

    def loop(self, stop: Stopping) -> None:
        # The first round runs at once, elected or not, so that a restarted worker recovers
        # its predecessor's job without waiting (one EXISTS when nothing is in flight).
        down = False
        try:
            pause = self.idle_ms / 1000.0 if not self.run_once() else self.poll_ms / 1000.0
        except Exception as error:
            down = self._failed(error, down)
            pause = self.poll_ms / 1000.0
        # then a random phase spreads the fleet's standbys (and reapers)
        stop.wait(random.uniform(0, min(pause, self.poll_ms / 1000.0)))
        while not stop.is_set():
            try:
                pause = self.tick()
                down = False
            except Exception as error:
                down = self._failed(error, down)
                pause = self.poll_ms / 1000.0
            stop.wait(pause)

    def stop(self, timeout: float = 5.0) -> None:
        super().stop(timeout)
        if self.election is not None:
            self.election.resign()
