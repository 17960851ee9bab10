"""Prometheus metrics for lease state: the metric names, their help texts, the samples
taken from :class:`~rq_emq.operate.inspection.QueueStatus`, and the text exposition format.

``rq-emq metrics`` prints :func:`exposition`; :mod:`rq_emq.operate.prometheus` hands the same
families to ``prometheus_client``. Counter family names carry no ``_total``: the text
format (and ``prometheus_client``) add it to the sample and HELP/TYPE lines.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from .inspection import QueueStatus, remaining_buckets

#: stats-hash counter -> (family name, help)
COUNTER_METRICS: dict[str, tuple[str, str]] = {
    "taken": ("rq_emq_jobs_taken", "Jobs taken from a queue under a lease (every attempt counts)."),
    "renewed": ("rq_emq_lease_renewals", "Lease renewals by worker lock managers."),
    "finished": (
        "rq_emq_jobs_finished",
        "Outcomes (success, failure, Retry, stop) a lease holder wrote while it held the lease.",
    ),
    "lease_lost": (
        "rq_emq_leases_lost",
        "Renewals that found the lease taken away (job recovered or deleted).",
    ),
    "fenced": ("rq_emq_outcomes_fenced", "Outcomes discarded because their worker no longer held the lease."),
    "marked": (
        "rq_emq_stall_marks",
        "Leased jobs marked stalled by the sweep (lock gone past the deadline).",
    ),
    "unmarked": ("rq_emq_stall_unmarks", "Stall marks cleared because the lock came back or the job ended."),
    "recovered": ("rq_emq_jobs_recovered", "Stalled jobs put back at the front of their queue."),
    "crashed": (
        "rq_emq_horse_crashes",
        "Work horses that died without an outcome (a signal their worker did not send, such as "
        "the OOM killer's SIGKILL, or an exit) whose job their worker recovered at once.",
    ),
    "failed": (
        "rq_emq_jobs_failed_at_max_attempts",
        "Stalled or crashed jobs moved to RQ's failed registry at max attempts.",
    ),
    "returned": (
        "rq_emq_jobs_returned",
        "In-flight jobs handed back to their queue by a stopping worker (attempt refunded).",
    ),
    "ended_by_rq": (
        "rq_emq_leases_ended_by_rq",
        "Leases dropped because RQ ended or moved the job while it was leased (cancel, stock "
        "cleanup, requeue); the job was left as RQ put it.",
    ),
    "outbox_completed": (
        "rq_emq_outbox_failures_completed",
        "Stall failures whose RQ Result and failure callback the outbox drain completed.",
    ),
    "unreadable": (
        "rq_emq_jobs_failed_unreadable",
        "Jobs moved to failed because their hash could not be read as a job.",
    ),
}
GAUGE_HELP: dict[str, str] = {
    "rq_emq_jobs_waiting": "Jobs waiting in the RQ queue.",
    "rq_emq_jobs_in_flight": "Jobs holding a lease entry (taken and not finished or recovered).",
    "rq_emq_leases_by_remaining": "Leases by time left until their deadline (label remaining).",
    "rq_emq_jobs_stalled": "Jobs marked stalled and awaiting the sweep's recovery round.",
    "rq_emq_oldest_lease_age_seconds": "Since the least recently renewed unmarked lease was renewed (s).",
    "rq_emq_oldest_stall_mark_age_seconds": "Seconds the oldest stall mark has stood.",
    "rq_emq_outbox_jobs": "Jobs failed at max attempts whose RQ Result is not yet written.",
}


@dataclass
class Sample:
    labels: dict[str, str]
    value: float


@dataclass
class MetricFamily:
    name: str
    kind: str  # "counter" or "gauge"
    help: str
    samples: list[Sample] = field(default_factory=list)

    @property
    def exposed_name(self) -> str:
        return self.name + "_total" if self.kind == "counter" else self.name


def empty_families() -> list[MetricFamily]:
    """Every family we expose, without samples (for a collector's ``describe``)."""
    counters = [MetricFamily(name, "counter", help_) for name, help_ in COUNTER_METRICS.values()]
    return counters + [MetricFamily(name, "gauge", help_) for name, help_ in GAUGE_HELP.items()]


def families(statuses: Iterable[QueueStatus]) -> list[MetricFamily]:
    """Samples for every queue; a value that could not be read is left out, not zeroed."""
    by_name = {family.name: family for family in empty_families()}

    def add(name: str, queue: str, value: float | None, **labels: str) -> None:
        if value is not None:
            by_name[name].samples.append(Sample({"queue": queue, **labels}, value))

    for status in statuses:
        q = status.queue
        for counter, (name, _) in COUNTER_METRICS.items():
            add(name, q, status.counters.get(counter))
        add("rq_emq_jobs_waiting", q, status.waiting)
        add("rq_emq_jobs_in_flight", q, status.in_flight)
        for label in remaining_buckets():
            add("rq_emq_leases_by_remaining", q, status.by_remaining.get(label), remaining=label)
        add("rq_emq_jobs_stalled", q, status.stalled)
        if status.in_flight is not None:
            age = status.oldest_lease.age_ms / 1000 if status.oldest_lease else 0.0
            add("rq_emq_oldest_lease_age_seconds", q, age)
        if status.stalled is not None:
            add(
                "rq_emq_oldest_stall_mark_age_seconds",
                q,
                status.oldest_mark.age_ms / 1000 if status.oldest_mark else 0.0,
            )
        add("rq_emq_outbox_jobs", q, status.outbox)
    return list(by_name.values())


def _escape_help(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n")


def _escape_label(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _number(value: float) -> str:
    if value == int(value):
        return f"{int(value)}.0" if abs(value) < 1e15 else repr(float(value))
    return repr(float(value))


def exposition(metric_families: Sequence[MetricFamily]) -> str:
    """The Prometheus text exposition format (version 0.0.4) of ``metric_families``."""
    lines: list[str] = []
    for family in metric_families:
        name = family.exposed_name
        lines.append(f"# HELP {name} {_escape_help(family.help)}")
        lines.append(f"# TYPE {name} {family.kind}")
        for sample in family.samples:
            labels = ",".join(f'{key}="{_escape_label(value)}"' for key, value in sample.labels.items())
            lines.append(f"{name}{{{labels}}} {_number(sample.value)}")
    return "\n".join(lines) + "\n"
