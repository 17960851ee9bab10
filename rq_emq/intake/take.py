"""Taking a job off its queue under a lease, without a moment in which a crash loses it.

When jobs are waiting, ``pop_job`` takes the first one across the worker's queues (in
order) and leases it in one EVALSHA, which also returns the job's hash: one round trip,
where RQ spends two (pop, then fetch). When the queues were empty at the last look, the
worker blocks straight away with one ``BLMOVE`` per queue into that queue's moving
list (:mod:`rq_emq.intake.wake`; a ``BLMOVE`` on a list that is not empty returns at once, so
it is the look too, and a wait answered at once switches the worker back to popping), so
Redis wakes one worker per push however many wait; ``claim_job`` then leases what
arrived, and a job a second queue moved at the same moment goes back to the head of its
queue. A crash between a move and its claim leaves the job in the moving list,
where the sweep finds it. RQ's multi-queue ``BLPOP`` (which drops a job popped by a
worker that dies before recording it) is never used.

The first pop after a job carries what RQ's loop would send in a round trip of its own
before it (:class:`Between`: its `rq suspend` check, the worker's heartbeat and state): the
pop refuses while RQ's workers are suspended (:class:`WorkersSuspended`).

Behind Sentinel, with a live replica, a take also waits for the replica to have it
(:class:`rq_emq.connection.confirm.TakeConfirmation`): one the replica never saw was
granted by a master being replaced, and is handed back instead of run.
"""

from __future__ import annotations

import _signal
import dataclasses
import logging
import signal
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from redis import Redis
from redis.client import Pipeline

from .. import malformed, scripts
from ..connection import failover
from ..connection.confirm import TAKE_WAIT_MS, TakeConfirmation
from ..hold.held import new_token
from ..keys import RQ_PREFIX, QueueKeys
from ..settings import LeaseSettings
from .wake import SELECT_MARGIN_S, QueueWait, WaitRefused
from .watch import ALL, STOP_POLL_S, QueueSetWatch

logger = logging.getLogger("rq_emq.lease")

# Ids of deleted jobs one pop may skip before it returns (bounds the script's run time).
SKIP_BUDGET = 100

#: A wait answered within this many seconds of being sent found a job already waiting.
AT_ONCE_S = 0.02

#: Less of the take's timeout than this left after a wait ends it: Redis counts a wait's
#: timeout in whole milliseconds, rounded down, so a wait may end a moment before the
#: deadline it was sent for, and another round of waits (one BLMOVE per queue) for what is
#: left would find nothing the first did not.
LEAST_WAIT_S = 0.01

#: A worker whose waits Redis refused (its client limit) polls its queues this often with
#: its one main connection, and tries the blocking waits again after RETRY_WAITS_S.
POLL_WHEN_REFUSED_S = 0.5
RETRY_WAITS_S = 60.0

#: How long a take that found only jobs held back by an earlier run of their id (deleted,
#: or enqueued again, while that run went on; ``take_verdict`` in lua/lib/lease.lua) waits
#: before the worker looks again, at most: that run ends at its holder's next renewal, and
#: its end releases the lock. Short, so a stop held back meanwhile is barely delayed.
HELD_BACK_RETRY_S = 0.05

#: Signals that stop a worker; held back while a take is granted and registered.
STOP_SIGNALS = frozenset({signal.SIGTERM, signal.SIGINT})


@contextmanager
def stop_signals_deferred() -> Iterator[None]:
    """Hold SIGTERM/SIGINT back for the block: a stop that lands between the lease grant
    and the worker recording it would leave a leased job nobody holds (stranded for a
    lease, and charged an attempt). Delivered as the block ends, the stop then finds the
    lease recorded, and the worker hands the job back.

    Held back in Python, not with the signal mask: the kernel hands a process-wide signal
    to any thread that does not block it (the lock manager's, the sweeper's, RQ's pubsub
    thread), and Python then runs the handler in the main thread at once.

    Swapped with ``_signal``, the C module behind ``signal``: ``signal``'s enum conversions
    of each number and handler were about 2% of a no-fork worker's CPU a job."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    caught: list[int] = []
    previous: dict[int, Any] = {}
    for stop in STOP_SIGNALS:
        handler = _signal.getsignal(stop)
        if callable(handler):  # a Python handler (RQ's): hold it back
            previous[stop] = handler
            _signal.signal(stop, lambda received, frame: caught.append(received))
    try:
        yield
    finally:
        for held, handler in previous.items():
            _signal.signal(held, handler)
        for received in caught:
            previous[received](received, None)


class WorkersSuspended(Exception):
    """The pop found RQ's workers suspended (``rq suspend``): nothing was taken."""


@dataclass(frozen=True)
class Between:
    """What rides with a pop, in its round trip, ahead of the script: RQ's `rq suspend`
    check (``suspended_key``: the pop refuses while it exists), and the worker's commands
    that RQ's check carried in its transaction (``queue``; ``sent`` is told whether they
    landed)."""

    suspended_key: str
    queue: Callable[[Pipeline], None]
    sent: Callable[[bool], None]
    #: RQ's check on its own: the take begins with a wait, not a pop
    alone: Callable[[], None]


@dataclass(frozen=True)
class Taken:
    """A job just leased: which queue (index into the worker's list), its lease, its hash."""

    queue_index: int
    job_id: str
    token: str
    attempts: int
    raw: dict[bytes, bytes]
    #: Monotonic time the granting call was sent: the start of the holder's local lease
    #: clock (a grant is never older than its request).
    sent_at: float = 0.0

    @property
    def fencing_token(self) -> int:
        """This grant's fencing token (``emq_fence``, written by the take itself); 0 when
        the job hash holds none (a take by a version without it)."""
        value = self.raw.get(b"emq_fence", b"")
        return int(value) if value.isdigit() else 0


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _keys(queue: str | QueueKeys) -> QueueKeys:
    """A queue given by name has RQ's default key layout."""
    return queue if isinstance(queue, QueueKeys) else QueueKeys(queue)


def _as_hash(flat: Sequence[Any]) -> dict[bytes, bytes]:
    items = [v if isinstance(v, bytes) else str(v).encode() for v in flat]
    return dict(zip(items[0::2], items[1::2], strict=True))


class Taker:
    """Takes jobs for one worker from its queues, in the worker's order."""

    def __init__(self, connection: Redis, worker_name: str, settings: LeaseSettings) -> None:
        self.connection = connection
        self.worker_name = worker_name
        self.settings = settings
        self._wait = QueueWait(connection)
        #: The idle wait of a worker on several queues, on its one work connection; None: a
        #: wait per queue, each on a connection of its own (one queue; a server refusing it)
        self.watch: QueueSetWatch | None = None
        #: The last job came after a wait: the next take looks first (one EXISTS), as the
        #: queues are most likely empty
        self._after_job = False
        #: The queues are most likely empty (the last look found nothing, or the last job
        #: came from a wait that had to wait): the next take goes straight to the wait,
        #: whose ``BLMOVE`` returns at once where a job is waiting. Cleared when the wait
        #: answered at once, so that a backlog is taken with ``pop_job`` (one call a job).
        #: A new worker pops first: it may start on a backlog (a deploy, a restart).
        self._expect_empty = False
        #: Monotonic time Redis last refused the waits' connections (-inf: never).
        self._waits_refused_at = float("-inf")
        #: The last pop found only jobs held back by an earlier run of their id: the next
        #: look comes after a moment, not after a wait (their old run's end writes no queue,
        #: which the idle watch would hear)
        self._holding_back = False
        #: The last job a claim found held back by an earlier run of its id (logged once).
        self._held_back_id: str | None = None
        #: Called as the take finds nothing and is about to wait: the worker's chores that
        #: may take a moment then and no sooner (reaping its last horse, rq_emq.run.horse_end)
        self.before_wait: Callable[[], None] | None = None
        #: The worker was told to stop. RQ's stop raises StopRequested from its signal
        #: handler into whatever the main thread runs, and where Python ignores exceptions
        #: (an at-fork hook: logging's, as the worker forks its next horse ahead) the stop
        #: is lost but for this flag: a wait looks at it before it starts and while it waits.
        self.stop_requested: Callable[[], bool] = lambda: False

    def pop(
        self, queues: Sequence[str | QueueKeys], only: frozenset[str] = ALL, between: Between | None = None
    ) -> Taken | None:
        """Lease the first waiting job across ``queues`` (those whose list is in ``only``,
        when the watch says where a push landed); None when all are empty, or hold only
        jobs that an earlier run of their id still holds (after a short wait). With
        ``between``, its commands ride in the same round trip, and the pop raises
        :class:`WorkersSuspended` instead of taking while RQ's workers are suspended."""
        script = scripts.load("pop_job")
        keys: list[str] = []
        prefixes: list[str] = []
        every = [_keys(queue) for queue in queues]
        places = [i for i, q in enumerate(every) if only is ALL or q.rq_queue in only]
        layouts = [every[i] for i in places]
        queue_names = [q.queue for q in layouts]
        for q in layouts:
            keys += [q.rq_queue, q.leases, q.stats]
            prefixes.append(q.prefix)
        # one job class per worker: its prefix names every queue's job hashes; RQ's prefix its registries
        prefixes += [layouts[0].job_prefix, RQ_PREFIX]
        while True:
            token = new_token(self.worker_name)
            args = [token, self.worker_name, self.settings.lease_ms, SKIP_BUDGET, *prefixes]
            args.append(between.suspended_key if between is not None else "")
            reply, confirm = self._granted(script, keys, args, between)
            between = None  # a pop again (ids skipped) carries nothing
            if not reply:
                return None
            index = int(reply[0])
            if index == -2:
                raise WorkersSuspended()
            skipped = [_text(v) for v in reply[1 if index <= 0 else 3]]
            for job_id in skipped:
                logger.warning(
                    "job %s was in one of queues %s but its hash is gone, or the entry is a stray "
                    "copy (the job runs under a live lease, or has left every queue); skipped",
                    job_id,
                    ",".join(queue_names),
                    extra={"job_id": job_id, "queue": None},
                )
            if index == 0:
                continue
            if index == -1:  # only jobs an earlier run of their id still holds
                self._held_back(int(reply[2]))
                self._holding_back = True
                return None
            malformed.report(reply[4])
            if not self._kept(confirm, layouts[index - 1], _text(reply[1]), token):
                return None
            return Taken(places[index - 1], _text(reply[1]), token, int(reply[2]), _as_hash(reply[5:]))

    def claim(self, queue: str | QueueKeys, job_id: str, queue_index: int = 0) -> Taken | None:
        """Lease a job that ``BLMOVE`` put in ``queue``'s moving list (``emq:{<q>}:moving``)."""
        q = _keys(queue)
        queue_name = q.queue
        token = new_token(self.worker_name)
        keys = [q.moving, q.job(job_id), q.lock(job_id), q.leases, q.stats, q.rq_queue]
        args = [job_id, token, self.worker_name, self.settings.lease_ms, RQ_PREFIX]
        reply, confirm = self._granted(scripts.load("claim_job"), keys, args)
        status = int(reply[0])
        if status == 0:
            logger.warning(
                "job %s was in queue %s but its hash is gone; skipped",
                job_id,
                queue_name,
                extra={"job_id": job_id, "queue": queue_name},
            )
        if status == -2:
            logger.warning(
                "job %s was moved from queue %s but the entry is a stray copy (the job runs under "
                "a live lease, or has left every queue); skipped",
                job_id,
                queue_name,
                extra={"job_id": job_id, "queue": queue_name},
            )
        if status == -3:
            if job_id != self._held_back_id:
                self._held_back_id = job_id
                logger.warning(
                    "job %s on queue %s: an earlier run of this job id (deleted, or enqueued again, "
                    "while it ran) still holds its lock; left in the queue until that run has ended",
                    job_id,
                    queue_name,
                    extra={"job_id": job_id, "queue": queue_name},
                )
            self._held_back(int(reply[1]))
        if status == 1:
            malformed.report(reply[2])
        if status != 1 or not self._kept(confirm, q, job_id, token):
            return None
        return Taken(queue_index, job_id, token, int(reply[1]), _as_hash(reply[3:]))

    def _held_back(self, lock_left_ms: int) -> None:
        """A take found only jobs that an earlier run of their id still holds: wait a
        moment (that run ends at its holder's next renewal, or its lock lapses within
        ``lock_left_ms``), so the worker does not spin on them meanwhile."""
        time.sleep(min(max(lock_left_ms, 1) / 1000.0, HELD_BACK_RETRY_S))

    def _granted(
        self, script: scripts.LuaScript, keys: list[str], args: list[Any], between: Between | None = None
    ) -> tuple[Any, tuple[TakeConfirmation, bool, Any] | None]:
        """Run a take script (``between``'s commands ahead of it, in the same round trip);
        behind Sentinel with a live replica, in one pipeline with ``WAIT 1`` on the same
        connection, whose answer says whether a replica has it; with the gate degraded (no
        acknowledgement for a while), with ``INFO replication`` instead, whose answer says
        whether a replica is online again (the take counts)."""
        confirm = failover.take_confirmation(self.connection)
        if confirm is None and between is None:
            return script(self.connection, keys, args), None
        waits = confirm is not None and confirm.wanted()
        # a degraded take asks whether a replica is online again; one just after a switch
        # too, so that an unacknowledged take can tell a master without a replica online yet
        asks = confirm is not None and (not waits or confirm.just_switched())
        for _ in range(2):
            pipe = self.connection.pipeline(transaction=False)
            if between is not None:
                between.queue(pipe)
            ahead = len(pipe)
            script.queue(pipe, keys, args)
            if waits:
                pipe.execute_command("WAIT", 1, TAKE_WAIT_MS)
            if asks:
                pipe.execute_command("INFO", "replication")
            try:
                replies = pipe.execute(raise_on_error=False)
            except BaseException:
                if between is not None:
                    between.sent(False)
                raise
            if between is not None:
                refused = [reply for reply in replies[:ahead] if isinstance(reply, Exception)]
                between.sent(not refused)
                between = None  # sent once
                if refused:  # the worker's own bookkeeping: never the reason to strand a take
                    logger.warning("the worker's heartbeat and state sent with a take failed: %s", refused[0])
            if scripts.is_noscript(replies[ahead]):
                script.load(self.connection)
                continue
            for reply in replies[ahead:]:
                if isinstance(reply, Exception):
                    raise reply
            taken = replies[ahead]
            replication = replies[-1] if asks else None
            if confirm is None:
                return taken, None
            if not waits:
                confirm.probed(replication)
                return taken, None
            acked = replies[ahead + 1]
            return taken, (confirm, isinstance(acked, int) and acked >= 1, replication)
        raise RuntimeError(f"{script.name}: the script would not load")

    def _kept(
        self, confirm: tuple[TakeConfirmation, bool, Any] | None, q: QueueKeys, job_id: str, token: str
    ) -> bool:
        """Whether a granted take may run: always, unless no replica acknowledged it, in
        which case it goes back to the front of its queue, attempt refunded (on a master
        being replaced the write is lost anyway; on a live one the job is simply next)."""
        if confirm is None or confirm[1]:
            if confirm is not None:
                confirm[0].acked()
            return True
        returned = scripts.load("return_job_to_queue")(
            self.connection, q.returning(job_id), [job_id, token, RQ_PREFIX]
        )
        malformed.report(returned[1])
        confirm[0].unacked(job_id, confirm[2])
        return False

    def take(
        self,
        queue_names: Sequence[str | QueueKeys],
        timeout: float | None,
        record: Callable[[Taken], None] = lambda taken: None,
        between: Between | None = None,
    ) -> Taken | None:
        """Take a job, waiting up to ``timeout`` seconds (None: do not wait, as in burst).
        ``record`` registers the lease with its holder; the grant and ``record`` run with
        stop signals held back (:func:`stop_signals_deferred`). ``between`` rides with the
        first pop (:meth:`pop`), or goes alone before a take that begins with a wait."""
        deadline = None if timeout is None else time.monotonic() + timeout
        least = 0.0  # a first wait is sent for any time left; a later one only for LEAST_WAIT_S
        look = ALL
        if self.watch is not None and self._after_job and len(queue_names) > 1:
            look = self.watch.after_job()
            self._expect_empty = not look
        self._after_job = False
        waited = False
        if between is not None and deadline is not None and self._expect_empty:
            between.alone()
            between = None
        while True:
            taken = None
            if deadline is None or not self._expect_empty:
                taken = self._pop_and_record(queue_names, record, look, between)
                between = None
                self._expect_empty = taken is None
            if taken is not None:
                # a job that came after a wait was likely the only one: the next take looks
                # with one EXISTS; one taken straight off a backlog, with the next pop
                self._after_job = waited
            if taken is not None or deadline is None:
                return taken
            remaining = deadline - time.monotonic()
            if remaining <= least:
                return None
            least = LEAST_WAIT_S
            if self.before_wait is not None and not waited:
                self.before_wait()
            if self.stop_requested():
                return None
            if self._holding_back:
                self._holding_back = False
                self._expect_empty = False
                continue
            if self.watch is not None and len(queue_names) > 1:
                look = self.watch.wait(remaining)
                self._expect_empty = not look
                waited = True
                continue
            taken = self._wait_and_claim(queue_names, remaining, record)
            if taken is not None:
                return taken

    def _wait_and_claim(
        self, queue_names: Sequence[str | QueueKeys], timeout: float, record: Callable[[Taken], None]
    ) -> Taken | None:
        """Block on every queue at once; claim the job of the first queue that hands one
        over and give back any other that arrived with it (never left in a moving
        list). A stop that interrupts the wait hands back whatever was moved meanwhile."""
        queues = [_keys(queue) for queue in queue_names]
        started = time.monotonic()
        if started - self._waits_refused_at < RETRY_WAITS_S:
            return self._poll(queues, timeout, record)
        try:
            waiting = self._wait.start(queues, timeout)
        except WaitRefused as error:
            if self._waits_refused_at == float("-inf"):
                logger.warning(
                    "Redis refused a connection for the wait on each of %d queues (%s): this worker "
                    "polls them every %.1f s on its main connection instead, and tries again each minute",
                    len(queues),
                    error,
                    POLL_WHEN_REFUSED_S,
                )
            self._waits_refused_at = time.monotonic()
            return self._poll(queues, timeout, record)
        moved: list[tuple[int, str]] = []
        try:
            until = started + timeout + SELECT_MARGIN_S
            while not waiting.ready(max(0.0, min(until - time.monotonic(), STOP_POLL_S))):
                if time.monotonic() >= until or self.stop_requested():
                    break
            # a wait answered at once found a job waiting: more may follow (a backlog)
            self._expect_empty = time.monotonic() - started > AT_ONCE_S
            with stop_signals_deferred():
                moved = waiting.collect()
                taken = None
                while moved and taken is None:
                    index, job_id = moved.pop(0)
                    sent_at = time.monotonic()
                    taken = self.claim(queues[index], job_id, index)
                    if taken is not None:
                        taken = dataclasses.replace(taken, sent_at=sent_at)
                        record(taken)
                return taken
        finally:
            with stop_signals_deferred():
                if not waiting.done:  # the wait was interrupted (a stop, a broken connection)
                    moved = waiting.collect()
                for index, job_id in moved:
                    self._wait.hand_back(queues[index], job_id)

    def _pop_and_record(
        self,
        queues: Sequence[str | QueueKeys],
        record: Callable[[Taken], None],
        only: frozenset[str] = ALL,
        between: Between | None = None,
    ) -> Taken | None:
        """``pop`` and, for a job taken, ``record``, with stop signals held back; the lease's
        clock starts when the pop was sent."""
        with stop_signals_deferred():
            sent_at = time.monotonic()
            taken = self.pop(queues, only, between)
            if taken is not None:
                taken = dataclasses.replace(taken, sent_at=sent_at)
                record(taken)
            return taken

    def _poll(
        self, queues: Sequence[QueueKeys], timeout: float, record: Callable[[Taken], None]
    ) -> Taken | None:
        """The wait of a worker whose waits' connections Redis refused: ``pop_job`` every
        :data:`POLL_WHEN_REFUSED_S`, on the main connection, for up to ``timeout``."""
        deadline = time.monotonic() + timeout
        while True:
            taken = self._pop_and_record(queues, record)
            if taken is not None:
                return taken
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None
            time.sleep(min(POLL_WHEN_REFUSED_S, remaining))

    def close(self) -> None:
        """A stopping watcher hands the watch on (the waits' connections belong to the
        client's pool)."""
        if self.watch is not None:
            try:
                self.watch.leave()
            except Exception as error:  # it lapses; the sweeper wakes a standby then
                logger.info("could not hand the idle watch on: %s", error)
