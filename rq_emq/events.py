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
worker that reaped the horse. Hooks run synchronously in the sweeper, lock-manager or
worker thread that saw the event, so they should be quick (a
metric increment, a log line, a queue put); an exception in a hook is logged and never
reaches the worker. Register with :func:`subscribe` in code the worker imports (for
instance RQ's ``-c`` settings module), or name hooks in the ``event_hooks`` setting
(``RQ_EMQ_EVENT_HOOKS="myapp.alerts:on_lease_event"``), which workers and the reaper
load at startup.
"""

from __future__ import annotations

import importlib
import logging
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Literal

logger = logging.getLogger("rq_emq.events")

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
    return target  # type: ignore[return-value]


def hook_paths(setting: str) -> list[str]:
    """The hook paths in an ``event_hooks`` setting (comma or space separated)."""
    return [part for part in setting.replace(",", " ").split() if part]


def subscribe_paths(setting: str) -> None:
    """Subscribe every hook an ``event_hooks`` setting names (already validated)."""
    for path in hook_paths(setting):
        subscribe(resolve(path))


def emit(kind: EventKind, queue: str, job_ids: Iterable[str], source: str, report: str | None = None) -> None:
    """Deliver one event per job id to every hook; a failing hook is logged and skipped."""
    with _guard:
        hooks = list(_hooks)
    if not hooks:
        return
    for job_id in job_ids:
        event = LeaseEvent(kind, queue, job_id, source, report=report)
        for hook in hooks:
            try:
                hook(event)
            except Exception:
                logger.exception(
                    "lease event hook %r failed on %s of job %s",
                    hook,
                    kind,
                    job_id,
                    extra={"job_id": job_id, "queue": queue},
                )
