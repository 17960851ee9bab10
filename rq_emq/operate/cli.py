"""The ``rq-emq`` command line: operators' tools, with RQ's connection conventions
(``--url``, ``-c settings``, ``REDIS_URL``).

``status`` and ``leases`` show lease state (``rq_emq.operate.inspection``), ``metrics`` prints it
as Prometheus text (``rq_emq.operate.metrics``), ``sweep`` runs one sweep round now and
``reaper`` runs the sweep as a standalone process, ``rollback`` hands every leased job
back to stock RQ after a fleet moved back to stock workers, ``dashboard`` serves
rq-dashboard with the lease panel (``rq_emq.operate.cli_dashboard``). This module owns the command
group and the reading commands; the writing ones live in ``rq_emq.operate.cli_write``,
the options they share in ``rq_emq.operate.cli_options``. Tables and JSON live in
``rq_emq.operate.cli_output``, connecting and reading the input in
``rq_emq.operate.cli_connect``. Bad
input (an unknown queue, malformed settings, a password missing or refused) exits 2 with a
message naming it; an unreachable Redis exits 1 naming the URL, password redacted (a
long-running reaper waits for it instead).
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable
from typing import Any

import click

from .._version import __version__
from . import cli_dashboard, cli_output, cli_write, inspection, lease_list, metrics
from .cli_connect import BadInput, Target, connect, redact, select_queues
from .cli_options import class_options, common, layout_of, load_classes, watch_option

__all__ = ["BadInput", "main", "redact"]


def show(
    target: Target, render: Callable[[], dict[str, Any] | str], as_json: bool, watch_every: float | None
) -> None:
    if watch_every is None:
        cli_output.emit(render(), as_json)
    else:
        cli_output.watch(render, watch_every, as_json, target.describe)


@click.group()
@click.version_option(__version__, prog_name="rq-emq")
def main() -> None:
    """Lease-based crash recovery for RQ: inspect leases, sweep, export metrics."""
    # the inspecting commands print what they found malformed; no second copy on stderr
    logging.getLogger("rq_emq.inspection").setLevel(logging.ERROR)


@main.command(short_help="Per queue: in flight, leases by time left, stalled, counters.")
@common
@class_options
@watch_option
def status(
    url: str | None,
    config: str | None,
    queue_options: tuple[str, ...],
    queue_args: tuple[str, ...],
    as_json: bool,
    job_class: str | None,
    queue_class: str | None,
    watch: float | None,
) -> None:
    """Per queue: jobs waiting and in flight, leases by time left, stalled jobs, oldest
    lease and mark, and the counters."""
    target = connect(url, config)
    classes = load_classes(job_class, queue_class)
    queues = select_queues(target, queue_options, queue_args, queue_class=classes[1])

    def render() -> dict[str, Any] | str:
        statuses = inspection.read_status(target.client, queues, target.settings, layout_of(classes))
        return cli_output.status_json(statuses) if as_json else cli_output.status_text(statuses)

    show(target, render, as_json, watch)


@main.command(short_help="Per leased job: worker, token prefix, lock TTL, attempts.")
@common
@class_options
@watch_option
@click.option(
    "--limit",
    type=click.IntRange(min=1, max=10_000),
    default=100,
    show_default=True,
    help="Leases shown per queue (earliest deadline first).",
)
def leases(
    url: str | None,
    config: str | None,
    queue_options: tuple[str, ...],
    queue_args: tuple[str, ...],
    as_json: bool,
    job_class: str | None,
    queue_class: str | None,
    watch: float | None,
    limit: int,
) -> None:
    """Per leased job: worker, token prefix, lock TTL, deadline, attempts of max, mark."""
    target = connect(url, config)
    classes = load_classes(job_class, queue_class)
    queues = select_queues(target, queue_options, queue_args, queue_class=classes[1])

    def render() -> dict[str, Any] | str:
        pages = lease_list.read_leases(target.client, queues, target.settings, limit, layout_of(classes))
        return cli_output.leases_json(pages) if as_json else cli_output.leases_text(pages)

    show(target, render, as_json, watch)


@main.command(name="metrics", short_help="Counters and gauges as Prometheus text.")
@common
@class_options
@watch_option
def metrics_command(
    url: str | None,
    config: str | None,
    queue_options: tuple[str, ...],
    queue_args: tuple[str, ...],
    as_json: bool,
    job_class: str | None,
    queue_class: str | None,
    watch: float | None,
) -> None:
    """The counters and gauges in Prometheus text exposition format (e.g. for a textfile
    collector); ``rq_emq.operate.prometheus`` serves the same from a prometheus_client registry."""
    target = connect(url, config)
    classes = load_classes(job_class, queue_class)
    queues = select_queues(target, queue_options, queue_args, queue_class=classes[1])

    def render() -> dict[str, Any] | str:
        statuses = inspection.read_status(target.client, queues, target.settings, layout_of(classes))
        families = metrics.families(statuses)
        if not as_json:
            return metrics.exposition(families).rstrip("\n")
        return {
            "metrics": [
                {
                    "name": f.exposed_name,
                    "type": f.kind,
                    "help": f.help,
                    "samples": [vars(s) for s in f.samples],
                }
                for f in families
            ]
        }

    show(target, render, as_json, watch)


for _command in (cli_write.sweep, cli_write.rollback_command, cli_write.reaper):
    main.add_command(_command)  # the writing commands, in cli_write.py
main.add_command(cli_dashboard.dashboard)  # rq-dashboard with the lease panel


if __name__ == "__main__":
    sys.exit(main())
