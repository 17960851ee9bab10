"""``rq-emq dashboard``: rq-dashboard, served with the lease panel added, for operators who
run rq-dashboard standalone (``rq-dashboard --redis-url ...``). Same defaults as
rq-dashboard (``0.0.0.0:9181``, no prefix); ``--username``/``--password`` turn on
rq-dashboard's basic auth for every page, the panel's included. Needs the ``dashboard``
extra (``pip install 'rq-emq[dashboard]'``); without it the command says so and exits 2.
"""

from __future__ import annotations

import importlib.util
import os

import click

from .cli_connect import DEFAULT_URL, BadInput, redact


@click.command(short_help="Serve rq-dashboard with the lease panel (/leases) added.")
@click.option("--url", "-u", envvar="RQ_REDIS_URL", help="Redis URL (default: REDIS_URL, else localhost).")
@click.option("--bind", "-b", default="0.0.0.0", show_default=True, help="Address to listen on.")
@click.option("--port", "-p", default=9181, show_default=True, type=click.IntRange(1, 65535))
@click.option("--url-prefix", default="", help="URL prefix, e.g. behind a reverse proxy (/rq).")
@click.option("--username", envvar="RQ_DASHBOARD_USERNAME", help="Basic auth user (off when not set).")
@click.option("--password", envvar="RQ_DASHBOARD_PASSWORD", help="Basic auth password.")
@click.option(
    "--poll-interval", default=2500, show_default=True, type=click.IntRange(500), help="Auto-refresh, in ms."
)
def dashboard(
    url: str | None,
    bind: str,
    port: int,
    url_prefix: str,
    username: str | None,
    password: str | None,
    poll_interval: int,
) -> None:
    """Serve rq-dashboard with the lease panel at <prefix>/leases (and a link to it in
    rq-dashboard's navigation). The panel only reads; rq-dashboard's pages keep theirs."""
    if importlib.util.find_spec("rq_dashboard") is None:
        raise BadInput("rq-emq dashboard needs rq-dashboard: pip install 'rq-emq[dashboard]'")
    if username and not password:
        raise BadInput("--username needs --password (or RQ_DASHBOARD_PASSWORD)")
    from .dashboard import create_app

    redis_url = url or os.environ.get("REDIS_URL") or DEFAULT_URL
    app = create_app(redis_url, url_prefix.rstrip("/"), username, password)
    app.config["RQ_DASHBOARD_POLL_INTERVAL"] = poll_interval
    click.echo(f"rq-dashboard with the lease panel on http://{bind}:{port}{url_prefix.rstrip('/')}/leases")
    click.echo(f"Redis: {redact(redis_url)}")
    app.run(host=bind, port=port, threaded=True)
