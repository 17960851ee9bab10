"""The ``rq-emq`` command line: operators' tools, with RQ's connection conventions
(``--url``, ``-c settings``, ``REDIS_URL``).

``rq-emq reaper`` runs the stalled sweep as a standalone monitor process; ``--once`` runs
one round; ``--dry-run`` prints which jobs are stalled and where each would land.
"""

from __future__ import annotations

import importlib
import logging
import os
import signal
import sys
import threading
from typing import Any

import click
from redis import Redis

from . import __version__, scripts
from .settings import LeaseSettings, SettingsError
from .sweep import Sweeper, SweepReport


def _connect(url: str | None, config: str | None) -> Redis:
    if config:
        try:
            settings = importlib.import_module(config)
        except ImportError as error:
            raise click.BadParameter(f"cannot import settings module {config!r}: {error}") from None
        url = url or getattr(settings, "REDIS_URL", None)
    url = url or os.environ.get("REDIS_URL") or "redis://localhost:6379/0"
    try:
        client = Redis.from_url(url)
        client.ping()
    except Exception as error:
        raise click.ClickException(f"cannot reach Redis at {url}: {error}") from None
    return client


def _queues(client: Redis, named: tuple[str, ...]) -> list[str]:
    names = [part for item in named for part in item.replace(",", " ").split()]
    if names:
        return names
    members: set[Any] = client.smembers("rq:queues")  # type: ignore[assignment]
    return sorted((m.decode() if isinstance(m, bytes) else str(m)).removeprefix("rq:queue:") for m in members)


def _print_report(report: SweepReport, dry: bool) -> None:
    head = "would be" if dry else "was"
    rows = [
        (job_id, "marked stalled (recovered next round if its lock stays gone)") for job_id in report.marked
    ]
    rows += [(job_id, f"{head} put back at the front of {report.queue}") for job_id in report.requeued]
    rows += [(job_id, f"{head} failed at max attempts") for job_id in report.failed]
    rows += [(job_id, f"lease entry of a deleted job, {head} dropped") for job_id in report.dropped]
    click.echo(
        f"queue {report.queue}: {len(report.marked)} marked, {len(report.requeued)} recovered, "
        f"{len(report.failed)} failed, {report.unmarked} unmarked"
        + ("" if report.ran else " (another sweeper ran this round)")
    )
    width = max((len(job_id) for job_id, _ in rows), default=6)
    for job_id, where in rows:
        click.echo(f"  {job_id:<{width}}  {where}")


@click.group()
@click.version_option(__version__, prog_name="rq-emq")
def main() -> None:
    """Lease-based crash recovery for RQ."""


@main.command()
@click.option("--url", "-u", envvar="RQ_REDIS_URL", help="Redis URL (default: REDIS_URL, else localhost).")
@click.option("--config", "-c", help="Module holding RQ settings (REDIS_URL).")
@click.option("--queues", "-q", "queue_options", multiple=True, help="Queues to sweep (default: all).")
@click.argument("queue_args", nargs=-1)
@click.option("--once", is_flag=True, help="Run one sweep round, then exit.")
@click.option(
    "--dry-run", is_flag=True, help="Print which jobs are stalled and where each would land; change nothing."
)
@click.option("--sweep-interval-ms", type=int, help="Overrides RQ_EMQ_SWEEP_INTERVAL_MS.")
@click.option("--verbose", "-v", is_flag=True)
def reaper(
    url: str | None,
    config: str | None,
    queue_options: tuple[str, ...],
    queue_args: tuple[str, ...],
    once: bool,
    dry_run: bool,
    sweep_interval_ms: int | None,
    verbose: bool,
) -> None:
    """Run the stalled sweep for QUEUES as a standalone process."""
    logging.basicConfig(level=logging.DEBUG if verbose else logging.INFO, format="%(asctime)s %(message)s")
    try:
        settings = LeaseSettings.resolve({"sweep_interval_ms": sweep_interval_ms})
    except SettingsError as error:
        raise click.ClickException(str(error)) from None
    client = _connect(url, config)
    queues = _queues(client, queue_options + queue_args)
    if not queues:
        raise click.ClickException("no queues to sweep: name them, or enqueue something first")
    scripts.load_all(client)
    sweeper = Sweeper(client, queues, settings, name="rq-emq-reaper")
    if dry_run or once:
        for queue in queues:
            report = sweeper.sweep(queue, mode="dry-run" if dry_run else "force")
            _print_report(report, dry=dry_run)
            if report.outbox_due and not dry_run:
                sweeper.drain_outbox(queue)
        return
    stop = threading.Event()

    def on_signal(signum: int, frame: Any) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    click.echo(f"rq-emq reaper sweeping {', '.join(queues)} every {settings.sweep_interval_ms} ms")
    sweeper.loop(stop)


if __name__ == "__main__":
    sys.exit(main())
