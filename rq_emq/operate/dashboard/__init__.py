"""The lease panel for rq-dashboard: one Flask blueprint, registered beside rq-dashboard's.

An app that mounts rq-dashboard adds the panel in one line, at the same prefix::

    app.register_blueprint(rq_dashboard.blueprint, url_prefix="/rq")
    app.register_blueprint(rq_emq.operate.dashboard.lease_panel, url_prefix="/rq")

The panel's page is ``<prefix>/leases`` (``<prefix>/<instance>/view/leases`` for another of
rq-dashboard's Redis instances). It extends rq-dashboard's own ``base.html``, adds a
*Leases* link to rq-dashboard's navigation (by wrapping its ``navbar.html``, never copying
it) and links each job to rq-dashboard's job page. It shows what :mod:`..panel` reads,
refreshed by rq-dashboard's own auto-refresh switch. It is read-only: it has no action
and no form, every value in it is escaped in every context, attributes and tooltips
included (queue names, job ids, descriptions, worker names and reports are user data),
its pages carry a Content-Security-Policy that lets no injected script run (:mod:`.csp`),
and every request first passes rq-dashboard's own request
guards (its basic auth, its Redis instance switch), so it is exactly as protected as
rq-dashboard itself. ``rq-emq dashboard`` serves rq-dashboard with the panel added, the
whole app behind :func:`.guard.protect` (host names, same-origin writes, a policy on
rq-dashboard's pages too); an app that mounts both calls it itself.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from flask import Blueprint, Flask, Response, current_app, make_response, render_template, url_for
from flask.blueprints import BlueprintSetupState
from jinja2 import BaseLoader, ChoiceLoader, FileSystemLoader, PrefixLoader
from redis import Redis
from redis.exceptions import RedisError

from ...settings import LeaseSettings, SettingsError
from ..inspection import known_queues
from ..panel import QueuePanel, read_panels
from ..reports import report_json, short_report
from .chart import svg
from .csp import policy, trusted_script_hashes
from .guard import protect

HERE = Path(__file__).resolve().parent
#: rq-dashboard's blueprint name: the guards and templates the panel stands behind.
RQ_DASHBOARD = "rq_dashboard"

lease_panel = Blueprint("rq_emq_dashboard", __name__, template_folder="templates")


@lease_panel.record_once
def _wrap_navbar(state: BlueprintSetupState) -> None:
    """Serve rq-dashboard's ``navbar.html`` through ours, which includes the one the app
    had (its own override, else rq-dashboard's, by a prefixed name) and adds the link."""
    app = state.app
    import rq_dashboard

    stock: list[BaseLoader] = [
        FileSystemLoader(str(Path(rq_dashboard.__file__).resolve().parent / "templates"))
    ]
    if app.jinja_loader is not None:
        stock.insert(0, app.jinja_loader)
    app.jinja_loader = ChoiceLoader(  # type: ignore[method-assign,assignment]
        [
            FileSystemLoader(str(HERE / "overrides")),
            PrefixLoader({"rq_emq_stock": ChoiceLoader(stock)}),
            *stock,
        ]
    )


@lease_panel.before_request
def _behind_rq_dashboards_guards() -> Any:
    """rq-dashboard's own before-request functions (its basic auth when configured, its
    switch to the requested Redis instance), run for the panel's requests too."""
    if RQ_DASHBOARD not in current_app.blueprints:
        return make_response("the lease panel needs rq-dashboard's blueprint registered", 500)
    for guard in current_app.before_request_funcs.get(RQ_DASHBOARD, ()):
        answer = guard()
        if answer is not None:
            return answer
    return None


@lease_panel.route("/leases", defaults={"instance_number": 0})
@lease_panel.route("/<int:instance_number>/view/leases")
def leases(instance_number: int) -> Response:
    """The panel's page: rq-dashboard's frame around every queue's panel."""
    return _page("rq_emq/leases.html", instance_number, scripts=True)


@lease_panel.route("/<int:instance_number>/view/leases/panels")
def panels(instance_number: int) -> Response:
    """The panels alone, which the page fetches again on each auto-refresh."""
    return _page("rq_emq/panels.html", instance_number, scripts=False)


def _page(template: str, instance_number: int, scripts: bool) -> Response:
    """``template`` rendered with every queue's panel, under a policy that lets run only the
    inline scripts of the same page rendered with no panel (see :mod:`.csp`)."""
    connection: Redis = current_app.redis_conn  # type: ignore[attr-defined]
    context = _frame(instance_number)
    try:
        settings = LeaseSettings.resolve()
        panels: list[QueuePanel] = read_panels(connection, known_queues(connection), settings)
        error = None
    except SettingsError as bad:
        panels, error = [], f"invalid setting in the dashboard's environment: {bad}"
    except RedisError as down:
        panels, error = [], f"cannot read Redis ({_redis_where(connection)}): {type(down).__name__}: {down}"
    body = render_template(template, panels=panels, error=error, **context)
    hashes = (
        trusted_script_hashes(render_template(template, panels=[], error=None, **context))
        if scripts
        else None
    )
    response = make_response(body)
    response.headers.set("Cache-Control", "no-store")
    response.headers.set("Content-Security-Policy", policy(hashes))
    response.headers.set("X-Content-Type-Options", "nosniff")
    return response


def _redis_where(connection: Redis) -> str:
    """Host and port of the panel's Redis, never its password."""
    kwargs = connection.connection_pool.connection_kwargs
    return str(kwargs.get("path") or f"{kwargs.get('host', '?')}:{kwargs.get('port', '?')}")


def _frame(instance_number: int) -> dict[str, Any]:
    """What the templates need beside the panels: rq-dashboard's frame and our helpers."""
    from rq import __version__ as rq_version
    from rq_dashboard.version import VERSION as rq_dashboard_version
    from rq_dashboard.web import escape_format_instance_list

    return dict(
        chart=svg,
        short_report=short_report,
        report_json=report_json,
        ago=_ago,
        job_url=_job_urls(instance_number),
        panels_url=url_for(".panels", instance_number=instance_number),
        current_instance=instance_number,
        instance_list=escape_format_instance_list(current_app.config.get("RQ_DASHBOARD_REDIS_URL")),
        rq_url_prefix=url_for(f"{RQ_DASHBOARD}.queues_overview"),
        rq_dashboard_version=rq_dashboard_version,
        rq_version=rq_version,
        active_tab="leases",
        poll_interval=current_app.config.get("RQ_DASHBOARD_POLL_INTERVAL", 2500),
        deprecation_options_usage=current_app.config.get("DEPRECATED_OPTIONS", False),
    )


def _job_urls(instance_number: int) -> Callable[[str], str]:
    """Links to rq-dashboard's job pages: ``url_for`` once per page, each job id quoted by
    the URL map's own converter, as ``url_for`` would (a page of ten queues links 1,500
    jobs: 26 ms in 1,500 ``url_for`` calls, 3 ms this way)."""
    marker = "rq-emq-job-id"
    url = url_for(f"{RQ_DASHBOARD}.job_view", instance_number=instance_number, job_id=marker)
    head, _, tail = url.rpartition(marker)
    url_map = current_app.url_map
    to_url = url_map.converters["default"](url_map).to_url
    return lambda job_id: head + to_url(job_id) + tail


def _ago(ms: int | None) -> str:
    """``850 ms``, ``12.3 s``, ``4 min``, ``2.1 h``; negative as ``in ...``; None as ``-``."""
    if ms is None:
        return "-"
    sign, ms = ("in " if ms < 0 else ""), abs(ms)
    if ms < 1000:
        return f"{sign}{ms} ms"
    if ms < 60_000:
        return f"{sign}{ms / 1000:.1f} s"
    if ms < 3_600_000:
        return f"{sign}{ms // 60_000} min"
    return f"{sign}{ms / 3_600_000:.1f} h"


def create_app(
    redis_url: str,
    url_prefix: str = "",
    username: str | None = None,
    password: str | None = None,
    allowed_hosts: Iterable[str] = (),
) -> Flask:
    """rq-dashboard's own app (its settings, ``RQ_DASHBOARD_SETTINGS``) with the panel
    added, behind :func:`.guard.protect` (``allowed_hosts``: the host names it answers to
    besides addresses and ``localhost``); with ``username``, rq-dashboard's basic auth
    guards the whole app (set on the app, not on rq-dashboard's blueprint, which a process
    can register only once)."""
    from rq_dashboard.cli import add_basic_auth, make_flask_app
    from rq_dashboard.web import setup_rq_connection

    app: Flask = make_flask_app(None, None, None, url_prefix)
    protect(app, allowed_hosts)
    if username:
        add_basic_auth(app, username, password)
    app.config["RQ_DASHBOARD_REDIS_URL"] = redis_url
    setup_rq_connection(app)
    app.register_blueprint(lease_panel, url_prefix=url_prefix)
    return app
