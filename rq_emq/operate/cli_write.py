"""The ``rq-emq`` commands that write: ``sweep`` (one sweep round now), ``reaper`` (the
sweep as a standalone process) and ``rollback`` (every leased job handed back to stock RQ).
:mod:`rq_emq.operate.cli` adds them to its command group; the reading commands are there."""

from __future__ import annotations

import logging
from typing import Any

import click
from rq.job import Job
from rq.queue import Queue

from .. import scripts
from ..recover import rollback
from ..recover.sweep import Sweeper, SweepReport
from ..settings import ENV_PREFIX
from . import cli_output
from .cli_connect import BadInput, Target, connect, load_serializer, select_queues
from .cli_options import Classes, class_options, common, drain_options, layout_of, load_classes, redis_errors
from .stop_signals import StopSignals


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


@click.command(short_help="Run one sweep round now (--dry-run: show what it would do).")
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
    reports = _sweep_named(
        url,
        config,
        sweep_interval_ms,
        job_class,
        queue_class,
        (queue_options, queue_args),
        dry_run,
        serializer,
        not no_drain,
    )
    if as_json:
        cli_output.emit(cli_output.sweep_json(reports, dry_run), as_json=True)
    else:
        click.echo(cli_output.sweep_texts(reports, dry_run, not no_drain))


@click.command(name="rollback", short_help="Hand every leased job back to stock RQ (a fleet back on stock).")
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
    A lease whose lock is alive is left and counted, and the command exits 1. Every queue
    is handed back that can be: one that cannot (RQ's keys of another type, an error) is
    named with why, the others done all the same, and the command exits 1."""
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
                + (f"; NOT handed back: {r.error}" if r.error else "")
            )
            for problem in r.problems:
                click.echo(f"  problem: {cli_output.printable(problem)}")
    failed = [r.queue for r in results if r.error]
    if failed:
        raise click.ClickException(
            f"could not hand back queue(s) {', '.join(map(cli_output.printable, failed))}: see above, "
            "fix, then run this again"
        )
    if any(r.alive for r in results):
        raise click.ClickException("leases still alive: stop every LeaseWorker first, then run this again")


@click.command(short_help="Run the stalled sweep as a standalone process.")
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
    if dry_run or once:  # a one-off: an unreachable Redis exits 1 at once
        reports = _sweep_named(
            url,
            config,
            sweep_interval_ms,
            job_class,
            queue_class,
            (queue_options, queue_args),
            dry_run,
            serializer,
            not no_drain,
        )
        click.echo(cli_output.sweep_texts(reports, dry_run, not no_drain))
        return
    with StopSignals() as stop:
        # started before its Redis (a deploy, a reboot): waits for it, bad settings still exit 2
        target = connect(url, config, {"sweep_interval_ms": sweep_interval_ms}, wait=stop.wait)
        classes = load_classes(job_class, queue_class)
        # a long-running reaper may start before any job names its queue: it only warns
        queues = select_queues(target, queue_options, queue_args, must_exist=False, queue_class=classes[1])
        if not queues:
            raise BadInput("no queues to sweep: name them, or enqueue something first")
        loads = load_serializer(serializer)
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
        names = ", ".join(map(cli_output.printable, queues))
        click.echo(f"rq-emq reaper sweeping {names} every {target.settings.sweep_interval_ms} ms")
        sweeper.loop(stop)


def _sweep_named(
    url: str | None,
    config: str | None,
    sweep_interval_ms: int | None,
    job_class: str | None,
    queue_class: str | None,
    named: tuple[Any, Any],
    dry_run: bool,
    serializer: str | None,
    drain: bool,
) -> Any:
    """One sweep of the queues the options name (``sweep``, and ``reaper --once``)."""
    target = connect(url, config, {"sweep_interval_ms": sweep_interval_ms})
    classes = load_classes(job_class, queue_class)
    queues = select_queues(target, *named, queue_class=classes[1])
    if not queues:
        raise BadInput("no queues to sweep: name them, or enqueue something first")
    return sweep_once(target, queues, dry_run, load_serializer(serializer), drain, classes)
