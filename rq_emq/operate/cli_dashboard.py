"""``rq-emq dashboard``: rq-dashboard, served with the lease panel added, for operators who
run rq-dashboard standalone (``rq-dashboard --redis-url ...``). It listens on loopback
(``127.0.0.1:9181``) unless ``--bind`` says otherwise: rq-dashboard's pages hold actions
(delete, empty, requeue) with no CSRF token, so a dashboard reachable from the network
without a password is warned about once at start. Every request passes
:func:`.dashboard.guard.protect`: a host name not given (``--allowed-host``, besides
addresses, ``localhost`` and the ``--bind`` name) is refused, and so is an action that is
not a POST from the dashboard's own pages. ``--username`` with the password from
``RQ_DASHBOARD_PASSWORD`` turns on rq-dashboard's basic auth for every page, the panel's
included (``--password`` works too, but shows in ``ps``: that is warned about). Needs the
``dashboard`` extra (``pip install 'rq-emq[dashboard]'``); without it the command says so
and exits 2.
"""

from __future__ import annotations

import importlib.util
import ipaddress
import os

import click
from click.core import ParameterSource

from .cli_connect import DEFAULT_URL, BadInput, redact


@click.command(short_help="Serve rq-dashboard with the lease panel (/leases) added.")
@click.option("--url", "-u", envvar="RQ_REDIS_URL", help="Redis URL (default: REDIS_URL, else localhost).")
@click.option(
    "--bind", "-b", default="127.0.0.1", show_default=True, help="Address to listen on (0.0.0.0: every one)."
)
@click.option("--port", "-p", default=9181, show_default=True, type=click.IntRange(1, 65535))
@click.option("--url-prefix", default="", help="URL prefix, e.g. behind a reverse proxy (/rq).")
@click.option("--username", envvar="RQ_DASHBOARD_USERNAME", help="Basic auth user (off when not set).")
@click.option(
    "--password", envvar="RQ_DASHBOARD_PASSWORD", help="Basic auth password (prefer RQ_DASHBOARD_PASSWORD)."
)
@click.option(
    "--poll-interval", default=2500, show_default=True, type=click.IntRange(500), help="Auto-refresh, in ms."
)
@click.option(
    "--allowed-host",
    "allowed_hosts",
    multiple=True,
    envvar="RQ_EMQ_DASHBOARD_ALLOWED_HOSTS",
    help="A host name browsers reach it by, besides addresses and localhost (repeat, or comma-separate "
    "in RQ_EMQ_DASHBOARD_ALLOWED_HOSTS; '*': any).",
)
def dashboard(
    url: str | None,
    bind: str,
    port: int,
    url_prefix: str,
    username: str | None,
    password: str | None,
    poll_interval: int,
    allowed_hosts: tuple[str, ...],
) -> None:
    """Serve rq-dashboard with the lease panel at <prefix>/leases (and a link to it in
    rq-dashboard's navigation). The panel only reads; rq-dashboard's pages keep theirs."""
    if importlib.util.find_spec("rq_dashboard") is None:
        raise BadInput("rq-emq dashboard needs rq-dashboard: pip install 'rq-emq[dashboard]'")
    if username and not password:
        raise BadInput("--username needs a password: set RQ_DASHBOARD_PASSWORD")
    if password and not username:
        raise BadInput("a password needs --username (or RQ_DASHBOARD_USERNAME)")
    if click.get_current_context().get_parameter_source("password") == ParameterSource.COMMANDLINE:
        warn("--password shows in the process list (ps); set RQ_DASHBOARD_PASSWORD instead")
    if not password and not is_loopback(bind):
        warn(
            f"listening on {bind} without a password: anyone who reaches this port can delete, "
            "empty and requeue jobs through rq-dashboard; set --username and RQ_DASHBOARD_PASSWORD"
        )
    from .dashboard import create_app

    redis_url = url or os.environ.get("REDIS_URL") or DEFAULT_URL
    names = [name.strip() for value in allowed_hosts for name in value.split(",") if name.strip()]
    if not is_address(bind):
        names.append(bind)  # the name it was told to listen on
    app = create_app(redis_url, url_prefix.rstrip("/"), username, password, names)
    app.config["RQ_DASHBOARD_POLL_INTERVAL"] = poll_interval
    click.echo(f"rq-dashboard with the lease panel on http://{bind}:{port}{url_prefix.rstrip('/')}/leases")
    click.echo(f"Redis: {redact(redis_url)}")
    app.run(host=bind, port=port, threaded=True)


def is_address(bind: str) -> bool:
    """Whether ``bind`` is an IP address (``0.0.0.0`` and ``::`` included), not a name."""
    try:
        ipaddress.ip_address(bind.strip("[]"))
    except ValueError:
        return False
    return True


def is_loopback(bind: str) -> bool:
    """Whether ``bind`` is reachable only from this host (``localhost``, 127.0.0.0/8, ::1)."""
    if bind == "localhost":
        return True
    try:
        return ipaddress.ip_address(bind.strip("[]")).is_loopback
    except ValueError:
        return False  # a host name: it may resolve to anything


def warn(message: str) -> None:
    click.echo(f"warning: {message}", err=True)
