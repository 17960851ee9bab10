"""A ``prometheus_client`` collector for lease state (install the extra:
``pip install 'rq-emq[prometheus]'``).

    from prometheus_client import REGISTRY, start_http_server
    from rq_emq.operate.prometheus import LeaseCollector

    REGISTRY.register(LeaseCollector(redis))      # every queue in rq:queues, per scrape
    start_http_server(9121)

Each scrape reads Redis once (bounded: see :mod:`rq_emq.operate.inspection`); the metric names
and samples are those of ``rq-emq metrics`` (:mod:`rq_emq.operate.metrics`).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

try:
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
except ImportError as error:  # pragma: no cover - depends on the environment
    raise ImportError(
        "rq_emq.prometheus needs prometheus_client; install it with: pip install 'rq-emq[prometheus]'"
    ) from error

from redis import Redis

from ..settings import LeaseSettings
from . import metrics
from .inspection import known_queues, read_status


def _convert(family: metrics.MetricFamily) -> Metric:
    labels = sorted({key for sample in family.samples for key in sample.labels})
    cls: Any = CounterMetricFamily if family.kind == "counter" else GaugeMetricFamily
    converted = cls(family.name, family.help, labels=labels or None)
    for sample in family.samples:
        converted.add_metric([sample.labels[key] for key in labels], sample.value)
    return converted  # type: ignore[no-any-return]


class LeaseCollector:
    """Collects lease metrics for ``queues`` (default: every queue in ``rq:queues``)."""

    def __init__(
        self, connection: Redis, queues: Sequence[str] | None = None, settings: LeaseSettings | None = None
    ) -> None:
        self.connection = connection
        self.queues = list(queues) if queues is not None else None
        self.settings = settings or LeaseSettings.resolve()

    def collect(self) -> Iterator[Metric]:
        queues = self.queues if self.queues is not None else known_queues(self.connection)
        for family in metrics.families(read_status(self.connection, queues, self.settings)):
            yield _convert(family)

    def describe(self) -> Iterator[Metric]:
        """The families without samples, so that registering does not read Redis."""
        for family in metrics.empty_families():
            yield _convert(family)
