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

Behind Sentinel, with a live replica, a take also waits for the replica to have it
(:class:`rq_emq.connection.confirm.TakeConfirmation`): one the replica never saw was
granted by a master being replaced, and is handed back instead of run.
"""

from __future__ import annotations

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

from .. import malformed, scripts
from ..connection import failover
from ..connection.confirm import TAKE_WAIT_MS, TakeConfirmation
from ..hold.held import new_token
from ..keys import RQ_PREFIX, QueueKeys
from ..settings import LeaseSettings
from .wake import SELECT_MARGIN_S, QueueWait, WaitRefused

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
    thread), and Python then runs the handler in the main thread at once."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    caught: list[int] = []
    previous: dict[int, Any] = {}
    for stop in STOP_SIGNALS:
        handler = signal.getsignal(stop)
        if callable(handler):  # a Python handler (RQ's): hold it back
            previous[stop] = handler
            signal.signal(stop, lambda received, frame: caught.append(received))
    try:
        yield
    finally:
        for held, handler in previous.items():
            signal.signal(held, handler)
        for received in caught:
            previous[received](received, None)


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
        #: The queues are most likely empty (the last look found nothing, or the last job
        #: came from a wait that had to wait): the next take goes straight to the wait,
        #: whose ``BLMOVE`` returns at once where a job is waiting. Cleared when the wait
        #: answered at once, so that a backlog is taken with ``pop_job`` (one call a job).
        #: A new worker pops first: it may start on a backlog (a deploy, a restart).
        self._expect_empty = False
        #: Monotonic time Redis last refused the waits' connections (-inf: never).
        self._waits_refused_at = float("-inf")

    def pop(self, queues: Sequence[str | QueueKeys]) -> Taken | None:
        """Lease the first waiting job across ``queues``; None when all are empty."""
        script = scripts.load("pop_job")
        keys: list[str] = []
        prefixes: list[str] = []
        layouts = [_keys(queue) for queue in queues]
        queue_names = [q.queue for q in layouts]
        for q in layouts:
            keys += [q.rq_queue, q.leases, q.stats]
            prefixes.append(q.prefix)
        # one job class per worker: its prefix names every queue's job hashes; RQ's prefix its registries
        prefixes += [layouts[0].job_prefix, RQ_PREFIX]
        while True:
            token = new_token(self.worker_name)
            args = [token, self.worker_name, self.settings.lease_ms, SKIP_BUDGET]
            reply, confirm = self._granted(script, keys, [*args, *prefixes])
            if not reply:
                return None
            index = int(reply[0])
            skipped = [_text(v) for v in reply[1 if index == 0 else 3]]
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
            malformed.report(reply[4])
            if not self._kept(confirm, layouts[index - 1], _text(reply[1]), token):
                return None
            return Taken(index - 1, _text(reply[1]), token, int(reply[2]), _as_hash(reply[5:]))

    def claim(self, queue: str | QueueKeys, job_id: str, queue_index: int = 0) -> Taken | None:
        """Lease a job that ``BLMOVE`` put in ``queue``'s moving list (``emq:{<q>}:moving``)."""
        q = _keys(queue)
        queue_name = q.queue
        token = new_token(self.worker_name)
        keys = [q.moving, q.job(job_id), q.lock(job_id), q.leases, q.stats]
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
        if status == 1:
            malformed.report(reply[2])
        if status != 1 or not self._kept(confirm, q, job_id, token):
            return None
        return Taken(queue_index, job_id, token, int(reply[1]), _as_hash(reply[3:]))

    def _granted(
        self, script: scripts.LuaScript, keys: list[str], args: list[Any]
    ) -> tuple[Any, tuple[TakeConfirmation, bool] | None]:
        """Run a take script; behind Sentinel with a live replica, in one pipeline with
        ``WAIT 1`` on the same connection, whose answer says whether a replica has it."""
        confirm = failover.take_confirmation(self.connection)
        if confirm is None:
            return script(self.connection, keys, args), None
        for _ in range(2):
            pipe = self.connection.pipeline(transaction=False)
            script.queue(pipe, keys, args)
            pipe.execute_command("WAIT", 1, TAKE_WAIT_MS)
            replies = pipe.execute(raise_on_error=False)
            if scripts.is_noscript(replies[0]):
                script.load(self.connection)
                continue
            for reply in replies:
                if isinstance(reply, Exception):
                    raise reply
            return replies[0], (confirm, isinstance(replies[1], int) and replies[1] >= 1)
        raise RuntimeError(f"{script.name}: the script would not load")

    def _kept(
        self, confirm: tuple[TakeConfirmation, bool] | None, q: QueueKeys, job_id: str, token: str
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
        confirm[0].unacked(job_id)
        return False

    def take(
        self,
        queue_names: Sequence[str | QueueKeys],
        timeout: float | None,
        record: Callable[[Taken], None] = lambda taken: None,
    ) -> Taken | None:
        """Take a job, waiting up to ``timeout`` seconds (None: do not wait, as in burst).
        ``record`` registers the lease with its holder; the grant and ``record`` run with
        stop signals held back (:func:`stop_signals_deferred`)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        least = 0.0  # a first wait is sent for any time left; a later one only for LEAST_WAIT_S
        while True:
            taken = None
            if deadline is None or not self._expect_empty:
                taken = self._pop_and_record(queue_names, record)
                self._expect_empty = taken is None
            if taken is not None or deadline is None:
                return taken
            remaining = deadline - time.monotonic()
            if remaining <= least:
                return None
            least = LEAST_WAIT_S
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
            waiting.ready(timeout + SELECT_MARGIN_S)
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
        self, queues: Sequence[str | QueueKeys], record: Callable[[Taken], None]
    ) -> Taken | None:
        """``pop`` and, for a job taken, ``record``, with stop signals held back; the lease's
        clock starts when the pop was sent."""
        with stop_signals_deferred():
            sent_at = time.monotonic()
            taken = self.pop(queues)
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
        """Nothing to close: the waits' connections belong to the client's pool."""
