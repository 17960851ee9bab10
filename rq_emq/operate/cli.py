"""The ``rq-emq`` command line: operators' tools, with RQ's connection conventions
(``--url``, ``-c settings``, ``REDIS_URL``).

``status`` and ``leases`` show lease state (``rq_emq.operate.inspection``), ``metrics`` prints it
as Prometheus text (``rq_emq.operate.metrics``), ``sweep`` runs one sweep round now and
``reaper`` runs the sweep as a standalone process, ``rollback`` hands every leased job
back to stock RQ after a fleet moved back to stock workers. Tables and JSON live in
``rq_emq.operate.cli_output``, connecting and reading the input in ``rq_emq.operate.cli_connect``. Bad
input (an unknown queue, malformed settings) exits 2 with a message naming it; an
unreachable Redis exits 1 naming the URL, password redacted.
"""

from __future__ import annotations

import functools
import logging
import signal
import sys
import threading
from collections.abc import Callable
from typing import Any

import click
from redis.exceptions import RedisError
from rq.job import Job
from rq.queue import Queue

from .. import scripts
from .._version import __version__
from ..keys import QueueKeys
from ..recover import rollback
from ..recover.sweep import Sweeper, SweepReport
from ..settings import ENV_PREFIX
from . import cli_output, inspection, metrics
from .cli_connect import BadInput, Target, connect, load_class, load_serializer, redact, select_queues

__all__ = ["BadInput", "main", "redact"]

#: The workers' job and queue classes, which say where their jobs and queues live.
Classes = tuple[type[Job], type[Queue]]


def load_classes(job_class: str | None, queue_class: str | None) -> Classes:
    return load_class(job_class, "--job-class", Job), load_class(queue_class, "--queue-class", Queue)


def redis_errors(command: Callable[..., None]) -> Callable[..., None]:
    """Turn a Redis failure mid-command into a clear message and exit 1, not a traceback."""

    @functools.wraps(command)
    def wrapper(*args: Any, **kwargs: Any) -> None:
        try:
            command(*args, **kwargs)
        except RedisError as error:
            raise click.ClickException(f"Redis error: {error}") from None

    return wrapper


def common(command: Callable[..., None]) -> Callable[..., None]:
    """Options every inspecting command shares."""
    for option in reversed(
        [
            click.option(
                "--url", "-u", envvar="RQ_REDIS_URL", help="Redis URL (default: REDIS_URL, else localhost)."
            ),
            click.option("--config", "-c", help="Module holding RQ settings (REDIS_URL, ..., RQ_EMQ_*)."),
            click.option(
                "--queues",
                "-q",
                "queue_options",
                multiple=True,
                help="Queues, split on commas or spaces (default: all in rq:queues).",
            ),
            click.argument("queue_args", nargs=-1, metavar="[QUEUE]..."),
            click.option("--json", "as_json", is_flag=True, help="Print JSON for machines."),
        ]
    ):
        command = option(command)
    return redis_errors(command)


def class_options(command: Callable[..., None]) -> Callable[..., None]:
    """``--job-class`` and ``--queue-class``, as the workers were given them (RQ's CLI
    options): they say where the workers' jobs and queues live."""
    command = click.option(
        "--queue-class", help="The workers' --queue-class (import path): where their queues live."
    )(command)
    return click.option("--job-class", help="The workers' --job-class (import path): where their jobs live.")(
        command
    )


def layout_of(classes: Classes) -> inspection.Layout:
    return functools.partial(QueueKeys.named, queue_class=classes[1], job_class=classes[0])


def watch_option(command: Callable[..., None]) -> Callable[..., None]:
    return click.option(
        "--watch",
        type=click.FloatRange(min=0.1),
        is_flag=False,
        flag_value=2.0,
        default=None,
        metavar="[SECONDS]",
        help="Refresh every SECONDS (default 2) until Ctrl-C; put it after the queue names.",
    )(command)


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
        pages = inspection.read_leases(target.client, queues, target.settings, limit, layout_of(classes))
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


def drain_options(command: Callable[..., None]) -> Callable[..., None]:
    """``--serializer`` and ``--no-drain``, for the commands that drain the outbox."""
    for option in reversed(
        [
            click.option(
                "--serializer",
                "-S",
                help="The jobs' serializer, as RQ's CLI takes it: an import path "
                "(e.g. rq.serializers.JSONSerializer; RQ 3 also takes json, pickle). Default: RQ's.",
            ),
            click.option(
                "--no-drain",
                is_flag=True,
                help="Leave the outbox drain (the Result and on_failure of jobs failed at max "
                "attempts) to the workers: for a process without the app's code.",
            ),
        ]
    ):
        command = option(command)
    return command


def sweep_once(
    target: Target,
    queues: list[str],
    dry_run: bool,
    serializer: Any = None,
    drain: bool = True,
    classes: Classes | None = None,
) -> list[SweepReport]:
    """One sweep round on each queue now, ignoring the fleet-wide rate limit (or, dry,
    changing nothing); then the failure outbox of each queue is drained (unless not)."""
    scripts.load_all(target.client)
    job_class, queue_class = classes or (Job, Queue)
    sweeper = Sweeper(
        target.client,
        queues,
        target.settings,
        name="rq-emq-cli",
        serializer=serializer,
        job_class=job_class,
        queue_class=queue_class,
    )
    reports = []
    for queue in queues:
        report = sweeper.sweep(queue, mode="dry-run" if dry_run else "force")
        if report.refused:
            raise BadInput(report.refused)
        if report.outbox_due and not dry_run and drain:
            sweeper.drain_outbox(queue)
        reports.append(report)
    return reports


@main.command(short_help="Run one sweep round now (--dry-run: show what it would do).")
@common
@class_options
@drain_options
@click.option(
    "--dry-run", is_flag=True, help="Print which jobs are stalled and where each would land; change nothing."
)
@click.option(
    "--sweep-interval-ms", type=int, help=f"Overrides {ENV_PREFIX}SWEEP_INTERVAL_MS (sets the grace)."
)
def sweep(
    url: str | None,
    config: str | None,
    queue_options: tuple[str, ...],
    queue_args: tuple[str, ...],
    as_json: bool,
    serializer: str | None,
    no_drain: bool,
    job_class: str | None,
    queue_class: str | None,
    dry_run: bool,
    sweep_interval_ms: int | None,
) -> None:
    """Run one sweep round now: mark lapsed leases, recover jobs marked a round ago.

    Jobs failed at max attempts then get RQ's Result here (the outbox drain): each job is
    loaded with --serializer and its on_failure callback runs in this process, so the
    app's code must be importable here; without it, use --no-drain and let the workers
    do it."""
    target = connect(url, config, {"sweep_interval_ms": sweep_interval_ms})
    classes = load_classes(job_class, queue_class)
    queues = select_queues(target, queue_options, queue_args, queue_class=classes[1])
    if not queues:
        raise BadInput("no queues to sweep: name them, or enqueue something first")
    reports = sweep_once(target, queues, dry_run, load_serializer(serializer), not no_drain, classes)
    if as_json:
        cli_output.emit(cli_output.sweep_json(reports, dry_run), as_json=True)
    else:
        click.echo(cli_output.sweep_texts(reports, dry_run, not no_drain))


@main.command(name="rollback", short_help="Hand every leased job back to stock RQ (a fleet back on stock).")
@common
@class_options
def rollback_command(
    url: str | None,
    config: str | None,
    queue_options: tuple[str, ...],
    queue_args: tuple[str, ...],
    as_json: bool,
    job_class: str | None,
    queue_class: str | None,
) -> None:
    """Run once every LeaseWorker (and reaper) is stopped for good: each job a dead
    LeaseWorker still held is handed to stock RQ (a started run: stock cleanup fails or
    retries it as abandoned; a job that never started: back to the front of its queue).
    A lease whose lock is alive is left and counted, and the command exits 1."""
    target = connect(url, config)
    classes = load_classes(job_class, queue_class)
    queues = select_queues(target, queue_options, queue_args, queue_class=classes[1])
    scripts.load_all(target.client)
    results = rollback.release_to_rq(target.client, queues, layout_of(classes))
    if as_json:
        cli_output.emit({"queues": [vars(r) for r in results]}, as_json=True)
    else:
        for r in results:
            click.echo(
                f"{r.queue}: {r.unpinned} started run(s) handed to stock cleanup, "
                f"{r.requeued} job(s) back in the queue, {r.alive} lease(s) still alive"
            )
    if any(r.alive for r in results):
        raise click.ClickException("leases still alive: stop every LeaseWorker first, then run this again")


@main.command(short_help="Run the stalled sweep as a standalone process.")
@click.option("--url", "-u", envvar="RQ_REDIS_URL", help="Redis URL (default: REDIS_URL, else localhost).")
@click.option("--config", "-c", help="Module holding RQ settings (REDIS_URL, ..., RQ_EMQ_*).")
@click.option(
    "--queues",
    "-q",
    "queue_options",
    multiple=True,
    help="Queues to sweep, split on commas or spaces (default: all).",
)
@click.argument("queue_args", nargs=-1)
@click.option("--once", is_flag=True, help="Run one sweep round, then exit.")
@click.option(
    "--dry-run", is_flag=True, help="Print which jobs are stalled and where each would land; change nothing."
)
@click.option("--sweep-interval-ms", type=int, help=f"Overrides {ENV_PREFIX}SWEEP_INTERVAL_MS.")
@drain_options
@class_options
@click.option("--verbose", "-v", is_flag=True)
@redis_errors
def reaper(
    url: str | None,
    config: str | None,
    queue_options: tuple[str, ...],
    queue_args: tuple[str, ...],
    once: bool,
    dry_run: bool,
    sweep_interval_ms: int | None,
    serializer: str | None,
    no_drain: bool,
    job_class: str | None,
    queue_class: str | None,
    verbose: bool,
) -> None:
    """Run the stalled sweep for QUEUES as a standalone process.

    Jobs failed at max attempts then get RQ's Result here (the outbox drain): each job is
    loaded with --serializer and its on_failure callback runs in this process, so the
    app's code must be importable here; without it, use --no-drain and let the workers
    do it."""
    logging.basicConfig(level=logging.DEBUG if verbose else logging.INFO, format="%(asctime)s %(message)s")
    target = connect(url, config, {"sweep_interval_ms": sweep_interval_ms})
    classes = load_classes(job_class, queue_class)
    # a long-running reaper may start before any job names its queue: it only warns
    queues = select_queues(
        target, queue_options, queue_args, must_exist=once or dry_run, queue_class=classes[1]
    )
    if not queues:
        raise BadInput("no queues to sweep: name them, or enqueue something first")
    loads = load_serializer(serializer)
    if dry_run or once:
        reports = sweep_once(target, queues, dry_run, loads, not no_drain, classes)
        click.echo(cli_output.sweep_texts(reports, dry_run, not no_drain))
        return
    scripts.load_all(target.client)
    sweeper = Sweeper(
        target.client,
        queues,
        target.settings,
        name="rq-emq-reaper",
        serializer=loads,
        drain=not no_drain,
        job_class=classes[0],
        queue_class=classes[1],
    )
    for queue in queues:  # a reaper with another job class than the workers' would sweep nothing
        report = sweeper.sweep(queue, mode="dry-run")
        if report.refused:
            raise BadInput(report.refused)
    stop = threading.Event()

    def on_signal(signum: int, frame: Any) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    names = ", ".join(map(cli_output.printable, queues))
    click.echo(f"rq-emq reaper sweeping {names} every {target.settings.sweep_interval_ms} ms")
    sweeper.loop(stop)


if __name__ == "__main__":
    sys.exit(main())
