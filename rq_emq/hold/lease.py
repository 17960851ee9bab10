"""The lock manager: one timer per process that renews every lease the process holds.

Each tick is one round trip: a ``renew_leases`` EVALSHA per queue with leases (one per
:data:`RENEW_BATCH` of them, so no single script runs long), plus the worker's and its
executions' RQ heartbeats, all in one pipeline. Renewal is token
checked in Lua, so nobody extends a lease they do not hold; leases reported lost are
handed to the worker (which by default stops the job). Tick work a worker adds plugs in
through ``on_tick`` (the worker's own heartbeat) and ``lease_writes`` (RQ's writes for
one lease's run, its execution heartbeat: packed into ``renew_executions`` calls that
apply them only while that lease is still held, so a late tick never re-creates what a
recovery or the finish removed).

The tick's thread and the lease clock's run nothing that can wait on the application: no
log handler (what they log goes to the reporter thread, :mod:`rq_emq.reporter`) and no
event hook (:mod:`rq_emq.events`). Callbacks given here run on them, and keep to that.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from typing import Any

from redis import Redis
from redis.client import Pipeline
from rq.utils import now, utcformat

from .. import events, malformed, reporter, scripts
from ..connection.blips import BLIPS
from ..keys import QueueKeys
from .background import BackgroundLoop, Stopping
from .held import Lease as Lease  # re-exported: where callers have always found it
from .held import new_token as new_token

#: What the lock manager's threads log goes to the reporter thread (rq_emq.reporter)
logger = reporter.PathLogger("rq_emq.lease")

#: How often a renewal also stamps RQ's ``last_heartbeat`` on the job hash (seconds), as
#: stock RQ's heartbeat does (``job_monitoring_interval``). Not every tick: RQ WATCHes the
#: job hash while it checks a finished job's dependents, and a write every tick would make
#: a parent whose check outlasts a tick retry its finish forever.
JOB_HEARTBEAT_EVERY_S = 30.0

#: Leases one ``renew_leases`` call renews; a tick holding more sends several calls in its
#: one pipeline, which bounds how long each script keeps Redis busy (~1 ms per 100).
RENEW_BATCH = 100


class LockManager(BackgroundLoop):
    """Renews, in one round trip per tick, every lease its process holds."""

    def __init__(
        self,
        client: Redis,
        lease_ms: int,
        renew_interval_ms: int,
        on_lost: Callable[[Lease], None],
        on_tick: Callable[[Pipeline, list[Lease]], None] | None = None,
        name: str = "rq-emq-lock-manager",
        lease_writes: Callable[[Lease, Pipeline], None] | None = None,
        margin_ms: int = 0,
        check_interval_s: float | None = None,
        on_expired: Callable[[Lease], None] | None = None,
        on_renewed: Callable[[Lease], None] | None = None,
        on_no_progress: Callable[[Lease], None] | None = None,
    ) -> None:
        """``on_renewed`` is told each time a lease's local deadline moves, and once when
        its job's outcome is found committed (``settled``: the run needs no deadline).
        ``on_no_progress`` is told of a lease a renewal refused because its job reported
        nothing for its progress timeout (the lease is then treated as expired)."""
        self.client = client
        self.lease_ms = lease_ms
        self.renew_interval_ms = renew_interval_ms
        self.on_lost = on_lost
        self.on_tick = on_tick
        self.lease_writes = lease_writes
        #: Local lease clock: a lease is trusted for ``lease_ms - margin_ms`` past the send
        #: of its last successful renewal; ``on_expired`` stops a job past that.
        self.margin_ms = margin_ms
        self.on_expired = on_expired
        #: When a renewal sent outside this process's ticks last landed for a lease
        #: (monotonic send time; None: none), set by a worker whose watchdog renews in its
        #: place (rq_emq/run/stand_in.py)
        self.outside_renewal: Callable[[Lease], float | None] | None = None
        self.on_renewed = on_renewed
        self.on_no_progress = on_no_progress
        super().__init__(name)
        self._clock = _LeaseClock(self, check_interval_s or renew_interval_ms / 4000.0, f"{name}:clock")
        self._leases: dict[str, Lease] = {}
        self._guard = threading.Lock()
        #: Serialises the marks on a lease (lost, expired), so that each loss is reported once
        self._claims = threading.Lock()
        self.ticks = 0
        self._job_heartbeat_at = -math.inf  # monotonic time of the last tick that stamped jobs

    def start(self) -> None:
        # the reporter thread started here, not by a renewal thread's first line
        reporter.start()
        reporter.keep_libraries_off()
        super().start()
        self._clock.start()

    def stop(self, timeout: float = 5.0) -> None:
        self._clock.stop(timeout)
        super().stop(timeout)

    def deadline(self, sent_at: float) -> float:
        """The local deadline of a lease granted or renewed by a call sent at ``sent_at``."""
        return sent_at + (self.lease_ms - self.margin_ms) / 1000.0

    def check_expiry(self) -> list[Lease]:
        """Stop every held job whose local lease clock ran out; returns their leases. Runs
        on its own thread, so a tick stuck on Redis (bounded by the client's socket
        timeout) never delays it."""
        now_m = time.monotonic()
        expired = [lease for lease in self.held() if self.expire_if_due(lease, now_m)]
        if self.on_expired is not None:
            for lease in expired:
                self.on_expired(lease)
        return expired

    def expire_if_due(self, lease: Lease, now_m: float | None = None, ended: bool = False) -> bool:
        """Mark ``lease`` expired if its local clock ran out and nothing marked it yet:
        logs the one clock line and emits ``lease_lost``, once per lease, whichever of
        the clock thread, the tick, the horse's reaper or the run's end sees it first
        (the horse fences itself on the same deadline and may be reaped before the clock
        thread looks). ``ended``: the run is already over (the line says so). Returns
        whether this call marked it."""
        now_m = time.monotonic() if now_m is None else now_m
        self._adopt_outside_renewal(lease)
        with self._claims:
            if lease.expired or lease.lost or lease.settled or lease.valid_until >= now_m:
                return False
            lease.expired = True
            lease.lost = True  # stop renewing: this holder no longer trusts the lease
        trusted_ms = self.lease_ms - self.margin_ms
        logger.warning(
            "job %s on queue %s: local lease clock ran out (no renewal landed for %d ms; the last one that "
            "did was sent %.0f ms ago)%s",
            lease.job_id,
            lease.queue,
            trusted_ms,
            (now_m - lease.valid_until) * 1000 + trusted_ms,
            " by the end of its run" if ended else "; stopping it",
            extra={"job_id": lease.job_id, "queue": lease.queue},
        )
        events.emit("lease_lost", lease.queue, [lease.job_id], self.name)
        return True

    def _adopt_outside_renewal(self, lease: Lease) -> None:
        """A renewal this process's ticks did not send (its watchdog's, standing in while the
        job kept this process's threads from running) moves the local deadline as a tick's
        would. Its sender sent each one before the local deadline as its own earlier ones
        had moved it, so a chain of them is adopted whole, from its last."""
        if self.outside_renewal is None or lease.expired or lease.lost:
            return
        sent_at = self.outside_renewal(lease)
        if sent_at is None or self.deadline(sent_at) <= lease.valid_until:
            return
        lease.valid_until = self.deadline(sent_at)
        if self.on_renewed is not None:
            self.on_renewed(lease)

    def _claim_loss(self, lease: Lease, expired: bool = False) -> bool:
        """Mark ``lease`` lost (and ``expired``) unless something marked it first; the
        one caller that gets True reports it."""
        with self._claims:
            if lease.lost:
                return False
            lease.lost = True
            lease.expired = lease.expired or expired
            return True

    # -- the set of leases -------------------------------------------------------------
    def add(self, lease: Lease) -> None:
        with self._guard:
            self._leases[lease.job_id] = lease

    def get(self, job_id: str) -> Lease | None:
        return self._leases.get(job_id)

    def remove(self, job_id: str) -> Lease | None:
        with self._guard:
            lease = self._leases.pop(job_id, None)
        if lease is not None:
            self.expire_if_due(lease, ended=True)
        return lease

    def held(self) -> list[Lease]:
        with self._guard:
            return [lease for lease in self._leases.values() if not (lease.lost or lease.settled)]

    # -- the timer -----------------------------------------------------------------------
    def loop(self, stop: Stopping) -> None:
        reporter.mark_renewal_thread()  # nothing on this thread calls a log handler
        interval = self.renew_interval_ms / 1000.0
        down = False  # Redis went away: said once, not a traceback per tick (a failover)
        serve_first = getattr(self.client.connection_pool, "serve_first", None)
        if serve_first is not None:  # a connection shared with the sweeper and the worker
            serve_first()
        while not stop.wait(interval):
            try:
                self.tick()
                down = False
            except BLIPS as error:
                if not down:
                    logger.warning(
                        "lock manager: Redis unreachable (%s); retrying every %.1fs", error, interval
                    )
                down = True
            except Exception:  # a tick must never kill the timer; the next one retries
                logger.exception("lock manager tick failed; retrying in %.1fs", interval)

    def tick(self) -> list[str]:
        """Renew every held lease now; returns the ids of leases found lost."""
        self.check_expiry()  # a lease past its local deadline is never renewed back to life
        leases = self.held()
        pipe = self.client.pipeline(transaction=False)
        by_queue: dict[QueueKeys, list[Lease]] = {}
        for lease in leases:
            by_queue.setdefault(lease.keys, []).append(lease)
        script = scripts.load("renew_leases")
        stamp_jobs = time.monotonic() - self._job_heartbeat_at >= JOB_HEARTBEAT_EVERY_S
        heartbeat = utcformat(now()) if stamp_jobs else ""
        calls: list[tuple[scripts.LuaScript, str]] = []  # each script call and its queue, in pipeline order
        reports: dict[str, tuple[int, str]] = {}  # the job's report each renewal carries
        for q, group in by_queue.items():
            queue = q.queue
            # several calls in the same round trip, so that no one script runs for long
            for start in range(0, len(group), RENEW_BATCH):
                args: list[Any] = [self.lease_ms, q.prefix, heartbeat, q.job_prefix]
                for lease in group[start : start + RENEW_BATCH]:
                    report = lease.pending_report()
                    if report is not None:
                        reports[lease.job_id] = report
                    progress = "" if lease.progress_timeout_ms is None else str(lease.progress_timeout_ms)
                    args += [lease.job_id, lease.token, report[1] if report else "", progress]
                script.queue(pipe, [q.leases, q.stalled, q.stats], args)
                calls.append((script, queue))
        if self.lease_writes is not None:
            calls += self._queue_lease_writes(pipe, by_queue)
        if self.on_tick is not None:
            self.on_tick(pipe, leases)
        if not len(pipe):
            return []
        sent_at = time.monotonic()
        replies = pipe.execute(raise_on_error=False)
        self.ticks += 1
        lost: list[str] = []
        settled: list[str] = []
        stuck: list[str] = []
        retry = False
        renewed: list[Lease] = []
        batches = iter(_batches(by_queue))
        for (called, queue), reply in zip(calls, replies, strict=False):
            batch = next(batches) if called is script else []
            if scripts.is_noscript(reply):
                called.load(self.client)
                retry = True
            elif isinstance(reply, Exception):
                logger.error("%s on queue %s failed: %s", called.name, queue, reply)
            elif called is script:
                lost += _ids(reply[0])
                settled += _ids(reply[1])
                stuck += _ids(reply[2])
                refused = {*_ids(reply[0]), *_ids(reply[2])}
                malformed.report(reply[3])
                renewed += [lease for lease in batch if lease.job_id not in refused]
        self._extend(renewed, sent_at)
        self._reports_landed([lease for lease in renewed if lease.job_id in reports], reports)
        if retry:
            return self.tick()
        if stamp_jobs:
            self._job_heartbeat_at = time.monotonic()
        for job_id in settled:
            done = self.get(job_id)
            if done is not None and not done.settled:
                done.settled = True
                if self.on_renewed is not None:
                    self.on_renewed(done)  # its outcome is committed: no deadline any more
        for job_id in stuck:
            self._no_progress(job_id)
        for job_id in lost:
            held = self.get(job_id)
            if held is None or not self._claim_loss(held):
                continue
            logger.warning(
                "job %s on queue %s: lease lost (renewal refused)",
                job_id,
                held.queue,
                extra={"job_id": job_id, "queue": held.queue},
            )
            events.emit("lease_lost", held.queue, [job_id], self.name)
            self.on_lost(held)
        return lost

    def _reports_landed(self, leases: list[Lease], reports: dict[str, tuple[int, str]]) -> None:
        for lease in leases:
            number, text = reports[lease.job_id]
            lease.report_sent, lease.last_report = number, text
            events.emit("reported", lease.queue, [lease.job_id], self.name, report=text)

    def _no_progress(self, job_id: str) -> None:
        """A renewal refused the lease: its job reported nothing for its progress timeout.
        The run is stopped as on an expired lease clock (its writes fenced out, its lock
        left to lapse); the sweep recovers the job with the attempt counted."""
        lease = self.get(job_id)
        if lease is None or not self._claim_loss(lease, expired=True):
            return
        logger.warning(
            "job %s on queue %s: no progress reported for %d ms (its progress timeout); stopping it",
            job_id,
            lease.queue,
            lease.progress_timeout_ms or 0,
            extra={"job_id": job_id, "queue": lease.queue},
        )
        events.emit("no_progress", lease.queue, [job_id], self.name, report=lease.last_report)
        callback = self.on_no_progress or self.on_expired
        if callback is not None:
            callback(lease)

    def _extend(self, renewed: list[Lease], sent_at: float) -> None:
        """Move the local deadline of each lease this tick renewed: never back, and only
        if the renewal was sent before the old deadline (else the job is being stopped)."""
        deadline = self.deadline(sent_at)
        for lease in renewed:
            if lease.expired or sent_at > lease.valid_until or deadline <= lease.valid_until:
                continue  # a renewal sent after the local deadline revives nothing
            lease.valid_until = deadline
            if self.on_renewed is not None:
                self.on_renewed(lease)

    def _queue_lease_writes(
        self, pipe: Pipeline, by_queue: dict[QueueKeys, list[Lease]]
    ) -> list[tuple[scripts.LuaScript, str]]:
        """Queue each lease's writes (``lease_writes``) in ``renew_executions`` calls,
        which run them only while that lease is still held."""
        assert self.lease_writes is not None
        script = scripts.load("renew_executions")
        recorder = self.client.pipeline(transaction=False)  # records only; never sent
        calls: list[tuple[scripts.LuaScript, str]] = []
        for q, group in by_queue.items():
            for start in range(0, len(group), RENEW_BATCH):
                args: list[Any] = [q.job_prefix]
                for lease in group[start : start + RENEW_BATCH]:
                    self.lease_writes(lease, recorder)
                    if recorder.command_stack:
                        args += [lease.job_id, lease.token, *pack(recorder.command_stack)]
                    recorder.reset()
                if len(args) > 1:
                    script.queue(pipe, [q.leases], args)
                    calls.append((script, q.queue))
        return calls


class _LeaseClock(BackgroundLoop):
    """The lock manager's second thread: checks local lease deadlines on its own schedule."""

    def __init__(self, manager: LockManager, interval_s: float, name: str) -> None:
        super().__init__(name)
        self.manager = manager
        self.interval_s = interval_s

    def loop(self, stop: Stopping) -> None:
        reporter.mark_renewal_thread()  # a stop is never held up by a log handler either
        while not stop.wait(self.interval_s):
            try:
                self.manager.check_expiry()
            except Exception:  # the clock must keep running
                logger.exception("lease clock check failed")


def _batches(by_queue: dict[QueueKeys, list[Lease]]) -> list[list[Lease]]:
    """The leases of each ``renew_leases`` call, in the order :meth:`LockManager.tick` queues them."""
    return [
        group[i : i + RENEW_BATCH] for group in by_queue.values() for i in range(0, len(group), RENEW_BATCH)
    ]


def pack(commands: list[tuple[tuple[Any, ...], dict[str, Any]]]) -> list[Any]:
    """A pipeline's queued commands as Lua's ``run_packed`` reads them: their number, then
    per command its argument count and arguments (a name of several words split)."""
    packed: list[Any] = [len(commands)]
    for args, _options in commands:
        name = args[0]
        words = [*(name.split() if isinstance(name, str) else [name]), *args[1:]]
        packed += [len(words), *words]
    return packed


def _ids(values: list[Any]) -> list[str]:
    return [v.decode() if isinstance(v, bytes) else str(v) for v in values]
