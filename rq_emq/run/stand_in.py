"""The watchdog's stand-in renewal: a ``SimpleLeaseWorker`` whose threads cannot run has
its lease renewed by its watchdog, so that nothing the job does stands between the lease
and its renewal.

A ``SimpleLeaseWorker`` runs the job in the process whose thread renews the lease. A job
that holds the GIL (a long C call, a regex backtracking) starves that thread, and without a
stand-in the watchdog would end a healthy run at its deadline. So the watchdog, a process of
its own, renews in the worker's place when the worker's renewals are late: from a third of
the trusted lease (``lease_ms - lease_margin_ms``, at least one renew interval) before the
local deadline, while the process runs (its state is not stopped, traced or dead: a
SIGSTOPped worker is no run to keep), while the run has not been stopped (the worker drops
the renewal part of the lease it wrote as it stops a run), and until the job's timeout.

Its renewal is the lock manager's own script for this one lease, over the watchdog's own
connection (:func:`.seen_death.call`), sent before the local deadline; the time it was sent
goes to the shared memory (:meth:`rq_emq.run.horse_fence.HorseDeadline.stand_in_renewed`),
where the watchdog reads its next deadline and the worker's lease clock adopts it once its
threads run again (``LockManager.outside_renewal``). A refusal (the lease lost, no
progress for the job's progress timeout) or no reply before the run's deadline changes
nothing: the watchdog ends the run at that deadline, as before.

Two halves, one per process: :func:`renewal_part` (the worker's, as each run starts) and
:class:`StandIn` (the watchdog's; this file is loaded by path in its interpreter, so only
the standard library and its neighbours).
"""

from __future__ import annotations

import json
import math
import time
from typing import Any

if __package__:
    from . import seen_death
    from .horse_fence import HorseDeadline
    from .process_tree import state
else:  # the watchdog's own interpreter: its neighbours by path
    import seen_death  # type: ignore[no-redef]
    from horse_fence import HorseDeadline  # type: ignore[no-redef]
    from process_tree import state  # type: ignore[no-redef]

#: Process states (``/proc/<pid>/stat``) of a run worth renewing: running, sleeping, in
#: the kernel. Stopped (T), traced (t), dead or zombie (X, Z) are not.
RUNNING_STATES = (b"R", b"S", b"D")


def renewal_part(lease: Any, settings: Any, after_s: float, job_timeout: Any) -> dict[str, Any]:
    """In the worker, as a run starts: what its watchdog needs to renew ``lease`` in its
    place. ``after_s``: how long after the lease's local deadline the run's deadline falls;
    ``job_timeout``: RQ's timeout of the job (seconds; -1 or None: none)."""
    q = lease.keys
    trusted_s = (settings.lease_ms - settings.lease_margin_ms) / 1000.0
    timeout, now = job_timeout, time.monotonic()
    progress = "" if lease.progress_timeout_ms is None else str(lease.progress_timeout_ms)
    return {
        "keys": [q.leases, q.stalled, q.stats],
        "args": [settings.lease_ms, q.prefix, "", q.job_prefix, lease.job_id, lease.token, "", progress],
        "trusted_s": trusted_s,
        "early_s": max(settings.renew_interval_ms / 1000.0, trusted_s / 3),
        "after_s": after_s,
        # past the job's timeout nothing is renewed for it: stock RQ would have ended it
        "until": now + float(timeout) if isinstance(timeout, (int, float)) and timeout > 0 else None,
    }


class StandIn:
    """In the watchdog of a ``SimpleLeaseWorker``: when to renew, and the renewal."""

    def __init__(self, kit: dict[str, Any], worker: int) -> None:
        self.kit = kit
        self.worker = worker
        #: when the last attempt that landed nothing may be tried again (monotonic), for
        #: the lease of this token
        self._retry_at = -math.inf
        self._token: str | None = None

    def plan(self, deadline: HorseDeadline, due: float) -> tuple[float, float | None]:
        """The run's deadline as the stand-in's renewals move it, and when to renew next
        (None: not now, nor until the memory changes)."""
        part = _part(deadline)
        if part is None:
            return due, None
        if part["args"][5] != self._token:  # another lease: the last one's attempts say nothing
            self._token, self._retry_at = part["args"][5], -math.inf
        renewed = deadline.stand_in_renewed
        if renewed > 0:
            due = max(due, renewed + part["trusted_s"] + part["after_s"])
        valid_until = due - part["after_s"]
        renew_at = max(valid_until - part["early_s"], self._retry_at)
        if renew_at >= valid_until or (part["until"] is not None and renew_at > part["until"]):
            return due, None
        return due, renew_at

    def renew(self, deadline: HorseDeadline, due: float) -> str | None:
        """One renewal in the worker's place, sent before the local deadline; the time it
        was sent goes to the memory once Redis renewed it. Returns a line to log on a
        change (a first stand-in for this lease, a refusal), else None."""
        part = _part(deadline)
        now = time.monotonic()
        valid_until = due - part["after_s"] if part is not None else now
        if part is None or now >= valid_until or state(self.worker) not in RUNNING_STATES:
            self._retry_at = math.inf if part is None else now + part["early_s"] / 4
            return None
        job_id = part["args"][4]
        try:
            kit = self.kit
            script = kit["renew_sha"], kit["renew_script"]
            reply = seen_death.call(kit, *script, part["keys"], part["args"], due - now)
        except Exception as error:  # noqa: BLE001 - no renewal: the run ends at its deadline
            self._retry_at = now + part["early_s"] / 4
            why = f"{type(error).__name__}: {error}"
            return f"could not renew job {job_id}'s lease in the worker's place ({why})"
        refused = {_text(v) for group in reply[:3] for v in group}
        if job_id in refused:
            self._retry_at = math.inf
            return f"job {job_id}'s lease was not renewed (the lease is not the worker's to keep)"
        first = deadline.stand_in_renewed <= 0
        deadline.stand_in_renewed = now
        self._retry_at = -math.inf
        if first:
            return f"renewed job {job_id}'s lease in the place of worker {self.worker}, whose threads did not"
        return None


def _part(deadline: HorseDeadline) -> dict[str, Any] | None:
    text = deadline.held_lease()
    if not text:
        return None
    try:
        part = json.loads(text).get("renew")
    except ValueError:
        return None
    return part if isinstance(part, dict) else None


def _text(value: Any) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)
