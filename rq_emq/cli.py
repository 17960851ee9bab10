"""The ``rq-emq`` command line: operators' tools, with RQ's connection conventions
(``--url``, ``-c settings``, ``REDIS_URL``).

``status`` and ``leases`` show lease state (``rq_emq.inspection``), ``metrics`` prints it
as Prometheus text (``rq_emq.metrics``), ``sweep`` runs one sweep round now and
``reaper`` runs the sweep as a standalone process. Tables and JSON live in
``rq_emq.cli_output``. Bad input (an unknown queue, malformed settings) exits 2 with a
message naming it; an unreachable Redis exits 1 naming the URL, password redacted.
"""

from __future__ import annotations

import functools
import importlib
import logging
import os
import signal
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import click
from redis import Redis
from redis.exceptions import RedisError
from rq.cli.helpers import get_redis_from_config, read_config_file

from . import __version__, cli_output, inspection, metrics, scripts
from .settings import ENV_PREFIX, LeaseSettings, SettingsError
from .sweep import Sweeper, SweepReport

DEFAULT_URL = "redis://localhost:6379/0"
CONNECTION_SETTINGS = ("REDIS_URL", "SENTINEL", "REDIS_HOST", "REDIS_PORT", "REDIS_DB", "REDIS_PASSWORD")


class BadInput(click.ClickException):
    """Input the operator must fix: exits 2, like a usage error."""

    exit_code = 2


def redact(url: str) -> str:
    """``url`` with its password replaced by ``***``."""
    try:
        parts = urlsplit(url)
        if parts.password is None:
            return url
        netloc = parts.netloc.rsplit("@", 1)[1]
        user = f"{parts.username}:" if parts.username else ":"
        return urlunsplit(parts._replace(netloc=f"{user}***@{netloc}"))
    except ValueError:
        return "<unparsable Redis URL>"


@dataclass
class Target:
    """A reachable Redis and the settings to read it with."""

    client: Redis
    describe: str  # the URL (password redacted) or host:port, for messages
    settings: LeaseSettings


def connect(url: str | None, config: str | None, overrides: dict[str, Any] | None = None) -> Target:
    """Connect as ``rq`` does: ``--url`` (or RQ_REDIS_URL), else the ``-c`` module's
    REDIS_URL / SENTINEL / REDIS_HOST..., else ``REDIS_URL``, else localhost. Lease settings:
    options, then RQ_EMQ_* environment variables, then RQ_EMQ_* in the ``-c`` module."""
    module: dict[str, Any] = {}
    if config:
        if "." not in sys.path:
            sys.path.append(".")  # as rq's default --path
        importlib.invalidate_caches()  # a module written a moment ago (tests, scripts)
        try:
            module = read_config_file(config)
        except Exception as error:  # an import runs arbitrary code: any failure is bad input
            raise BadInput(f"cannot import settings module {config!r} (-c/--config): {error}") from None
    environ = {k: str(v) for k, v in module.items() if k.startswith(ENV_PREFIX)} | dict(os.environ)
    try:
        settings = LeaseSettings.resolve(overrides, environ=environ)
    except SettingsError as error:
        raise BadInput(f"invalid setting: {error}") from None
    if url:
        module["REDIS_URL"] = url
    elif not any(module.get(name) is not None for name in CONNECTION_SETTINGS):
        module["REDIS_URL"] = os.environ.get("REDIS_URL") or DEFAULT_URL
    describe = redact(module["REDIS_URL"]) if module.get("REDIS_URL") else "the Redis named in " + str(config)
    try:
        client: Redis = get_redis_from_config(module)
    except ValueError as error:
        raise BadInput(f"invalid Redis setting in {config or 'the URL'} ({describe}): {error}") from None
    try:
        client.ping()
    except RedisError as error:
        raise click.ClickException(f"cannot reach Redis at {describe}: {error}") from None
    return Target(client, describe, settings)


def select_queues(
    target: Target, options: tuple[str, ...], args: tuple[str, ...], must_exist: bool = True
) -> list[str]:
    """Queues named (``--queues`` values are lists, split on commas and spaces; a positional
    argument is one name, whatever it holds), else every queue RQ knows. A name neither RQ
    nor our keys know exits 2, or only warns (``must_exist=False``)."""
    listed = (part for item in options for part in item.replace(",", " ").split())
    names = list(dict.fromkeys([*listed, *args]))
    if not names:
        return inspection.known_queues(target.client)
    unknown = inspection.unknown_queues(target.client, names)
    if unknown:
        message = (
            f"unknown queue(s): {', '.join(map(cli_output.printable, unknown))} "
            f"(not in rq:queues and no rq-emq keys) at {target.describe}"
        )
        if must_exist:
            raise BadInput(message)
        click.echo(f"warning: {message}; sweeping them anyway", err=True)
    return names


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
                "--queues", "-q", "queue_options", multiple=True, help="Queues (default: all in rq:queues)."
            ),
            click.argument("queue_args", nargs=-1, metavar="[QUEUE]..."),
            click.option("--json", "as_json", is_flag=True, help="Print JSON for machines."),
        ]
    ):
        command = option(command)
    return redis_errors(command)


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
@watch_option
def status(
    url: str | None,
    config: str | None,
    queue_options: tuple[str, ...],
    queue_args: tuple[str, ...],
    as_json: bool,
    watch: float | None,
) -> None:
    """Per queue: jobs waiting and in flight, leases by time left, stalled jobs, oldest
    lease and mark, and the counters."""
    target = connect(url, config)
    queues = select_queues(target, queue_options, queue_args)

    def render() -> dict[str, Any] | str:
        statuses = inspection.read_status(target.client, queues, target.settings)
        return cli_output.status_json(statuses) if as_json else cli_output.status_text(statuses)

    show(target, render, as_json, watch)


@main.command(short_help="Per leased job: worker, token prefix, lock TTL, attempts.")
@common
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
    watch: float | None,
    limit: int,
) -> None:
    """Per leased job: worker, token prefix, lock TTL, deadline, attempts of max, mark."""
    target = connect(url, config)
    queues = select_queues(target, queue_options, queue_args)

    def render() -> dict[str, Any] | str:
        pages = inspection.read_leases(target.client, queues, target.settings, limit)
        return cli_output.leases_json(pages) if as_json else cli_output.leases_text(pages)

    show(target, render, as_json, watch)


@main.command(name="metrics", short_help="Counters and gauges as Prometheus text.")
@common
@watch_option
def metrics_command(
    url: str | None,
    config: str | None,
    queue_options: tuple[str, ...],
    queue_args: tuple[str, ...],
    as_json: bool,
    watch: float | None,
) -> None:
    """The counters and gauges in Prometheus text exposition format (e.g. for a textfile
    collector); ``rq_emq.prometheus`` serves the same from a prometheus_client registry."""
    target = connect(url, config)
    queues = select_queues(target, queue_options, queue_args)

    def render() -> dict[str, Any] | str:
        families = metrics.families(inspection.read_status(target.client, queues, target.settings))
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


def sweep_once(target: Target, queues: list[str], dry_run: bool) -> list[SweepReport]:
    """One sweep round on each queue now, ignoring the fleet-wide rate limit (or, dry,
    changing nothing); then the failure outbox of each queue is drained."""
    scripts.load_all(target.client)
    sweeper = Sweeper(target.client, queues, target.settings, name="rq-emq-cli")
    reports = []
    for queue in queues:
        report = sweeper.sweep(queue, mode="dry-run" if dry_run else "force")
        if report.outbox_due and not dry_run:
            sweeper.drain_outbox(queue)
        reports.append(report)
    return reports


@main.command(short_help="Run one sweep round now (--dry-run: show what it would do).")
@common
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
    dry_run: bool,
    sweep_interval_ms: int | None,
) -> None:
    """Run one sweep round now: mark lapsed leases, recover jobs marked a round ago."""
    target = connect(url, config, {"sweep_interval_ms": sweep_interval_ms})
    queues = select_queues(target, queue_options, queue_args)
    if not queues:
        raise BadInput("no queues to sweep: name them, or enqueue something first")
    reports = sweep_once(target, queues, dry_run)
    if as_json:
        cli_output.emit(cli_output.sweep_json(reports, dry_run), as_json=True)
    else:
        click.echo("\n".join(cli_output.sweep_text(report, dry_run) for report in reports))


@main.command(short_help="Run the stalled sweep as a standalone process.")
@click.option("--url", "-u", envvar="RQ_REDIS_URL", help="Redis URL (default: REDIS_URL, else localhost).")
@click.option("--config", "-c", help="Module holding RQ settings (REDIS_URL, ..., RQ_EMQ_*).")
@click.option("--queues", "-q", "queue_options", multiple=True, help="Queues to sweep (default: all).")
@click.argument("queue_args", nargs=-1)
@click.option("--once", is_flag=True, help="Run one sweep round, then exit.")
@click.option(
    "--dry-run", is_flag=True, help="Print which jobs are stalled and where each would land; change nothing."
)
@click.option("--sweep-interval-ms", type=int, help=f"Overrides {ENV_PREFIX}SWEEP_INTERVAL_MS.")
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
    verbose: bool,
) -> None:
    """Run the stalled sweep for QUEUES as a standalone process."""
    logging.basicConfig(level=logging.DEBUG if verbose else logging.INFO, format="%(asctime)s %(message)s")
    target = connect(url, config, {"sweep_interval_ms": sweep_interval_ms})
    # a long-running reaper may start before any job names its queue: it only warns
    queues = select_queues(target, queue_options, queue_args, must_exist=once or dry_run)
    if not queues:
        raise BadInput("no queues to sweep: name them, or enqueue something first")
    if dry_run or once:
        for report in sweep_once(target, queues, dry_run):
            click.echo(cli_output.sweep_text(report, dry_run))
        return
    scripts.load_all(target.client)
    sweeper = Sweeper(target.client, queues, target.settings, name="rq-emq-reaper")
    stop = threading.Event()

    def on_signal(signum: int, frame: Any) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    click.echo(f"rq-emq reaper sweeping {', '.join(map(cli_output.printable, queues))} every {target.settings.sweep_interval_ms} ms")
    sweeper.loop(stop)


if __name__ == "__main__":
    sys.exit(main())
