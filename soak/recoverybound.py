"""The recovery bound (``--worker lease``): a dead, long-stopped or cut-off holder's job
leaves it within lease + 2 sweep intervals of the fault (hold + a line wait + 2 sweeps
when another worker was hit too, counted from the end of any moment when every worker was
hit, since nobody sweeps then; a second for a death that was seen: a horse crash its
worker recovers at once, a worker killed while its watchdog lived, whose watchdog hands the
job back), plus the stated slack for a loaded machine; and the latencies the report shows.
"""

from __future__ import annotations

import statistics
from typing import Any

from .faults import CRASHING, HELD, KILLS, LAPSING, Fault, seen_death
from .verdict import Verdict


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))
    return ordered[index]


def check_recovery_bound(
    cfg: Any,
    faults: list[Fault],
    v: Verdict,
    ended: frozenset[str] | set[str] = frozenset(),
    final: dict[str, dict[str, Any]] | None = None,
) -> None:
    """A dead (or long-stopped, or cut-off) holder's job must leave it within the bound,
    lease + 2 sweep intervals from the fault, plus a stated slack for a loaded machine; a
    job that never left its holder at all fails the soak too, unless RQ ended it (a
    cancel, a delete: ``ended``), which the sweep rightly leaves where RQ put it."""
    lapsed = [
        f
        for f in faults
        if f.kind in LAPSING | CRASHING
        and f.lapse_at
        and f.token
        and f.job_id not in ended
        and not _done_before(f)
    ]
    seen = [f for f in lapsed if f.requeued_at]
    # "!": the holder finished the job as the fault began; its lease never lapsed
    not_back = [f for f in lapsed if not f.requeued_at and not f.detail.endswith("!")]
    after_lapse = [max(0.0, f.requeued_at - f.lapse_at) for f in seen if not seen_death(f)]  # type: ignore[operator]
    after_fault = [f.requeued_at - f.started for f in seen]  # type: ignore[operator]
    after_crash = [t for f, t in zip(seen, after_fault, strict=True) if seen_death(f)]
    over, double, outages = 0, 0, 0
    for f, t in zip(seen, after_fault, strict=True):
        bound, what, since = cfg.bound_s, "lease + 2 sweeps", f"its {f.kind}"
        outage_end = _fleet_hit_until(cfg, f, faults)
        if seen_death(f) and not _own_worker_hit(cfg, f, faults):
            bound = cfg.crash_bound_s
            what = (
                "a horse crash: its worker recovers it at once"
                if f.kind in CRASHING
                else f"a seen death ({f.kind}): its watchdog hands it back at once"
            )
        elif outage_end is not None:
            double, outages = double + 1, outages + 1
            t = f.requeued_at - outage_end  # type: ignore[operator]
            since = f"the end of an outage of every worker, {outage_end - f.started:.2f}s after its {f.kind}"
            bound, what = (
                cfg.double_bound_s,
                "a worker back from it takes the sweep: hold + a line wait + 2 sweeps",
            )
        elif _another_worker_hit(cfg, f, faults):
            double += 1
            bound, what = cfg.double_bound_s, "another worker hit too: hold + a line wait + 2 sweeps"
        if t > bound + cfg.bound_slack_s:
            over += 1
            v.violations.append(
                f"{f.job_id}: back {t:.2f}s after {since}; the bound is {bound:.2f}s "
                f"({what}) + {cfg.bound_slack_s:.2f}s slack"
            )
    for f in not_back:
        state = (final or {}).get(f.job_id or "", {})
        v.violations.append(
            f"{f.job_id}: never left its holder after its {f.kind} at {f.started:.3f} "
            f"(on {f.slot}; its token and its lease stood to the end; it ended {state.get('status')}, "
            f"last run by {state.get('worker')}, {state.get('attempts')} attempt(s))"
        )
    after_fault = [t for f, t in zip(seen, after_fault, strict=True) if not seen_death(f)]
    v.latency = {
        "crash_samples": len(after_crash),
        "crash_bound_s": cfg.crash_bound_s,
        "crash_p50": statistics.median(after_crash) if after_crash else None,
        "crash_max": max(after_crash) if after_crash else None,
        "samples": len(seen) - len(after_crash),
        "not_seen": len(not_back),
        "bound_s": cfg.bound_s,
        "double_bound_s": cfg.double_bound_s,
        "double": double,
        "outages": outages,
        "slack_s": cfg.bound_slack_s,
        "lapse_p50": statistics.median(after_lapse) if after_lapse else None,
        "lapse_p95": _percentile(after_lapse, 0.95) if after_lapse else None,
        "lapse_max": max(after_lapse) if after_lapse else None,
        "fault_p50": statistics.median(after_fault) if after_fault else None,
        "fault_p95": _percentile(after_fault, 0.95) if after_fault else None,
        "fault_max": max(after_fault) if after_fault else None,
        "over_bound": over,
    }


def _another_worker_hit(cfg: Any, fault: Fault, faults: list[Fault]) -> bool:
    """Another worker was killed, stopped or cut off between 1.5 leases before this fault
    and its job's return: the election's sweeper and deputy may both have been hit, which
    has its own, longer bound (a killed worker counts as hit for a lease after its kill,
    until its roles lapse)."""
    lease_s = cfg.lease_ms / 1000
    start, end = fault.started - 1.5 * lease_s, fault.requeued_at or fault.started
    return any(
        other is not fault
        and other.slot != fault.slot
        and other.kind in LAPSING | HELD
        and other.started <= end
        and max(other.ended or other.started, other.started + lease_s) >= start
        for other in faults
    )


def _position(slot: str) -> str:
    """A worker's place in the fleet, whichever process holds it (``soak-w1-3`` is the third
    worker in place ``soak-w1``: a killed one's replacement takes its place)."""
    head, _, generation = slot.rpartition("-")
    return head if head and generation.isdigit() else slot


def _hit_spans(cfg: Any, faults: list[Fault]) -> dict[str, list[tuple[float, float]]]:
    """Per lease worker's place, the spans in which it could not sweep, merged: stopped, cut
    off or hung until the fault's end; killed (or crashed) for a lease after, until its
    roles lapse and its replacement runs (a stock neighbour sweeps nothing and is no place)."""
    lease_s = cfg.lease_ms / 1000
    spans: dict[str, list[tuple[float, float]]] = {}
    for f in faults:
        if f.kind in HELD:
            end = f.ended if f.ended is not None else float("inf")
        elif f.kind in KILLS or f.kind == "crash":
            end = f.started + lease_s
        else:
            continue
        spans.setdefault(_position(f.slot), []).append((f.started, end))
    merged: dict[str, list[tuple[float, float]]] = {}
    for place, items in spans.items():
        out: list[tuple[float, float]] = []
        for start, end in sorted(items):
            if out and start <= out[-1][1]:
                out[-1] = (out[-1][0], max(out[-1][1], end))
            else:
                out.append((start, end))
        merged[place] = out
    return merged


def _fleet_hit_until(cfg: Any, fault: Fault, faults: list[Fault]) -> float | None:
    """The end of the last span, between the fault and its job's return, in which every
    lease worker was hit at once (each killed, stopped, cut off or hung): nobody could sweep
    then, so the job's bound counts from that end. None when one was free throughout."""
    spans = _hit_spans(cfg, faults)
    if len(spans) < cfg.workers:
        return None
    common: list[tuple[float, float]] = [(fault.started, fault.requeued_at or fault.started)]
    for place_spans in spans.values():
        common = [(max(a, c), min(b, d)) for a, b in common for c, d in place_spans if max(a, c) < min(b, d)]
        if not common:
            return None
    return max(end for _, end in common)


def _own_worker_hit(cfg: Any, fault: Fault, faults: list[Fault]) -> bool:
    """A horse crash whose own worker was then killed, stopped or cut off before the job
    was back: the sweep recovers it, within the lease bound, not the crash bound."""
    end = fault.requeued_at or fault.started
    return any(
        other is not fault
        and other.slot == fault.slot
        and other.kind in LAPSING | HELD
        and fault.started <= other.started <= end
        for other in faults
    )


def _done_before(fault: Fault) -> bool:
    """The fault hit a horse whose job's outcome was already committed (the token the soak
    read at the fault is the finish's ``done:<token>``): no lease was left to lapse."""
    token = fault.token
    text = token.decode(errors="replace") if isinstance(token, bytes) else str(token or "")
    return text.startswith(("done:", "b'done:", 'b"done:'))
