"""Lease events for applications: which job, on which queue, had what happen to it.

Seven kinds of event reach the hooks an application registers:

- ``marked``: a sweep found the job's lock gone and marked it stalled;
- ``recovered``: a sweep put a stalled job back at the front of its queue;
- ``failed``: a sweep failed a stalled job, or a worker a crashed one, that had used up
  its attempts;
- ``crashed``: a worker's work horse died without an outcome (killed by a signal the
  worker did not send, such as the OOM killer's SIGKILL, or a segfault); the worker put
  the job back at the front of its queue, or failed it at max attempts (then ``failed``
  follows);
- ``lease_lost``: a worker's renewal was refused (the job was recovered elsewhere, or
  deleted) while the worker still ran it, or its local lease clock ran out (no renewal
  landed in time): once per lease, whichever of the worker's threads saw it first;
- ``no_progress``: a worker's renewal was refused because the job reported nothing for its
  progress timeout (``meta=rq_emq.progress_timeout(ms)``); the worker stops the run and the
  sweep recovers the job, attempt counted (the event carries the job's last report);
- ``reported``: a job's report (``rq_emq.current_lease().report(...)``) landed with its
  lease's renewal, at most once per renew interval (``event.report``, JSON text).

A sweep event fires once, in the one process whose sweep did it (the sweep is one
script, so two sweepers never both report the same recovery); a crash event fires in the
worker that reaped the horse.

Hooks run on a thread of their own, one per process (``rq-emq-event-hooks``), fed by a
queue of at most :data:`CAPACITY` events: the sweeper, the lock manager and the worker's
main thread only put an event on it, so a slow hook (an HTTP call with no timeout) delays
its events, never a renewal, a sweep or a job. When the hooks fall that far behind, new
events are dropped: the first drop is logged once ("event hooks are behind"), and the
count once they have caught up; :func:`dropped` counts them. Events reach the hooks in
the order they happened (``event.at`` says when), one at a time; an exception in a hook
is logged and never reaches the worker. The thread is a daemon, so it never holds a
process's exit: a worker that stops gives the events still queued up to
:data:`EXIT_GRACE_S` to be delivered (a hook still blocked then loses what is left), and
so does any other process at its normal exit. A forked child starts with no queue and no
thread of its parent's, and starts its own on its first event.

Register with :func:`subscribe` in code the worker imports (for
instance RQ's ``-c`` settings module), or name hooks in the ``event_hooks`` setting
(``RQ_EMQ_EVENT_HOOKS="myapp.alerts:on_lease_event"``), which workers and the reaper
load at startup.
"""

from __future__ import annotations

import atexit
import importlib
import inspect
import os
import threading
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Literal

from . import reporter

logger = reporter.PathLogger("rq_emq.events")  # code the lock manager's threads run

EventKind = Literal["marked", "recovered", "failed", "lease_lost", "crashed", "no_progress", "reported"]
KINDS: tuple[EventKind, ...] = (
    "marked",
    "recovered",
    "failed",
    "lease_lost",
    "crashed",
    "no_progress",
    "reported",
)


@dataclass(frozen=True)
class LeaseEvent:
    """Something that happened to one job's lease."""

    kind: EventKind
    queue: str
    job_id: str
    #: The worker or sweeper that saw it (``rq-emq-sweeper:<worker name>`` and so on).
    source: str
    at: datetime = field(default_factory=lambda: datetime.now(timezone.utc))
    #: The job's last report (``current_lease().report(...)``) as JSON text, where the
    #: event knows one (``reported``, ``no_progress``); else None.
    report: str | None = None


Hook = Callable[[LeaseEvent], object]

#: Events a process keeps for its hooks at most; past that, new ones are dropped. A sweep
#: of a large stall emits one event per job at once, which a healthy hook must not lose,
#: and ten thousand events are a few megabytes at most.
CAPACITY = 10_000

#: How long a process that ends normally (a worker's stop, the reaper's) waits for its
#: hooks to take the events still queued: long enough for quick hooks to drain a backlog,
#: short enough that a blocked hook never holds a stop (a supervisor's grace period).
EXIT_GRACE_S = 1.0

_hooks: list[Hook] = []
_guard = threading.Lock()


def subscribe(hook: Hook) -> Hook:
    """Call ``hook(event)`` for every lease event in this process; usable as a decorator.
    Subscribing the same hook twice has no further effect."""
    with _guard:
        if hook not in _hooks:
            _hooks.append(hook)
    return hook


def unsubscribe(hook: Hook) -> None:
    with _guard:
        if hook in _hooks:
            _hooks.remove(hook)


def resolve(path: str) -> Hook:
    """The callable that ``"package.module:attribute"`` names; ValueError if it cannot be had."""
    module_name, sep, attribute = path.strip().partition(":")
    if not sep or not module_name or not attribute:
        raise ValueError(f"{path!r} is not of the form package.module:function")
    try:
        target: object = importlib.import_module(module_name)
        for part in attribute.split("."):
            target = getattr(target, part)
    except (ImportError, AttributeError) as error:
        raise ValueError(f"cannot load {path!r}: {error}") from None
    if not callable(target):
        raise ValueError(f"{path!r} is not callable")
    _require_one_argument(path, target)
    return target  # type: ignore[return-value]


def _require_one_argument(path: str, target: object) -> None:
    """A hook is called with one event: one that cannot take it would fail on every event,
    on the hooks' thread, long after startup; refused at once instead. A callable whose
    signature Python cannot read (some builtins) is given the benefit of the doubt."""
    try:
        signature = inspect.signature(target)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return
    try:
        signature.bind(object())
    except TypeError as error:
        raise ValueError(
            f"{path!r} cannot take an event (called as hook(event)): {path}{signature}: {error}"
        ) from None


def hook_paths(setting: str) -> list[str]:
    """The hook paths in an ``event_hooks`` setting (comma or space separated)."""
    return [part for part in setting.replace(",", " ").split() if part]


def subscribe_paths(setting: str) -> None:
    """Subscribe every hook an ``event_hooks`` setting names (already validated)."""
    for path in hook_paths(setting):
        subscribe(resolve(path))


def emit(kind: EventKind, queue: str, job_ids: Iterable[str], source: str, report: str | None = None) -> None:
    """Queue one event per job id for every hook, and return at once: the hooks get them
    on their own thread (see the module's docstring), so no caller ever waits on a hook."""
    with _guard:
        hooks = tuple(_hooks)
    if not hooks:
        return
    items = [(LeaseEvent(kind, queue, job_id, source, report=report), hooks) for job_id in job_ids]
    _dispatcher().put(items)


def flush(timeout: float = 5.0) -> bool:
    """Wait up to ``timeout`` seconds until the hooks have had every event this process
    emitted before the call (or dropped it); whether they have."""
    with _guard:
        current = _current
    return current is None or current.flush(timeout)


def dropped() -> int:
    """How many events this process dropped because its hooks were behind."""
    with _guard:
        current = _current
    return 0 if current is None else current.dropped


class _Dispatcher:
    """The hook thread of one process and the bounded queue that feeds it."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.pid = os.getpid()
        self.dropped = 0
        self._pending: deque[tuple[LeaseEvent, tuple[Hook, ...]]] = deque()
        self._changed = threading.Condition(threading.Lock())
        self._queued = 0  # events ever put on the queue (delivered or not yet)
        self._done = 0  # of those, delivered to every hook
        self._behind = 0  # events dropped since the hooks last caught up (0: not behind)
        self._thread: threading.Thread | None = None
        self.drained = False  # the process's exit grace is spent (drain_at_exit)

    def put(self, items: list[tuple[LeaseEvent, tuple[Hook, ...]]]) -> None:
        with self._changed:
            room = max(self.capacity - len(self._pending), 0)
            self._pending.extend(items[:room])
            self._queued += min(room, len(items))
            lost = len(items) - min(room, len(items))
            first = lost > 0 and self._behind == 0
            self._behind += lost
            self.dropped += lost
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="rq-emq-event-hooks", daemon=True)
                try:
                    self._thread.start()
                except RuntimeError:  # at interpreter shutdown: no thread to deliver on
                    self._thread = None
            self._changed.notify()
        if first:  # once per episode, not per event: a stuck hook would flood the log
            logger.warning(
                "event hooks are behind: %d events wait for them; dropping new events until they catch up",
                self.capacity,
            )

    def waiting(self) -> int:
        """Events queued and not yet delivered to every hook."""
        with self._changed:
            return self._queued - self._done

    def flush(self, timeout: float) -> bool:
        with self._changed:
            target = self._queued
            return self._changed.wait_for(lambda: self._done >= target, timeout)

    def _run(self) -> None:
        while True:
            with self._changed:
                self._changed.wait_for(lambda: bool(self._pending))
                event, hooks = self._pending.popleft()
            _deliver(event, hooks)
            with self._changed:
                caught_up, behind = not self._pending, self._behind
                if caught_up:
                    self._behind = 0
            if caught_up and behind:
                # said before the event counts as delivered, so a flush() that returns has
                # it said; and outside the lock, which emit() takes on a renewal's path
                logger.warning("event hooks are behind: dropped %d events (now caught up)", behind)
            with self._changed:
                self._done += 1
                self._changed.notify_all()


def _deliver(event: LeaseEvent, hooks: tuple[Hook, ...]) -> None:
    """One event to each hook; a failing hook is logged and skipped."""
    for hook in hooks:
        try:
            hook(event)
        except Exception:
            logger.exception(
                "lease event hook %r failed on %s of job %s",
                hook,
                event.kind,
                event.job_id,
                extra={"job_id": event.job_id, "queue": event.queue},
            )


_current: _Dispatcher | None = None


def _dispatcher() -> _Dispatcher:
    """This process's dispatcher, started on its first event (a forked child's own)."""
    global _current
    with _guard:
        if _current is None or _current.pid != os.getpid():
            _current = _Dispatcher(CAPACITY)
        return _current


def _forget_in_child() -> None:
    """In a forked child: the parent's hook thread did not come along, and a lock it held
    at the fork would stay held forever; the child starts afresh on its first event."""
    global _current, _guard
    _guard = threading.Lock()
    _current = None


def drain_at_exit() -> bool:
    """At a process's normal end: up to :data:`EXIT_GRACE_S` for the hooks to take the
    events still queued, once per process (a worker's teardown, then ``atexit``, share
    the one grace); whether they did."""
    with _guard:
        current = _current
    if current is None or current.pid != os.getpid() or current.drained:
        return True
    current.drained = True
    if current.flush(EXIT_GRACE_S):
        return True
    logger.warning(
        "event hooks are behind: %d events not delivered as this process ends (waited %.1f s)",
        current.waiting(),
        EXIT_GRACE_S,
    )
    return False


os.register_at_fork(after_in_child=_forget_in_child)
atexit.register(drain_at_exit)
