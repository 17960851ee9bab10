"""The lease panel in rq-dashboard, through Flask's test client against a real Redis: what
an operator reads there (a leased job's worker, attempt, report and fencing token; the
stalls, recoveries, crashes, poison pills and refused outcomes; the chart), that it sits
inside rq-dashboard (its frame, its navigation, its auth) and that it only ever reads."""

from __future__ import annotations

import base64
import hashlib
import html as html_module
import json
import re
from collections.abc import Iterator
from html.parser import HTMLParser
from pathlib import Path

import pytest
import redis
from integration_scenarios import require
from procs import RQ_BIN, Processes, wait_for
from redis_server import RedisServer
from rq import Queue
from stalls import Q, next_round, stall, sweeper

from rq_emq import scripts
from rq_emq.hold.lease import Lease, LockManager
from rq_emq.intake.take import Taker
from rq_emq.keys import job_key
from rq_emq.run.job_lease import encode_report
from rq_emq.settings import LeaseSettings
from rq_emq.testing import free_port

require("rq_dashboard")
from flask import Flask  # noqa: E402
from flask.testing import FlaskClient  # noqa: E402

from rq_emq.operate.dashboard import create_app, lease_panel  # noqa: E402

RQ_EMQ = str(Path(RQ_BIN).parent / "rq-emq")
SETTINGS = LeaseSettings(lease_ms=60_000, renew_interval_ms=1_000)


@pytest.fixture
def client(r: redis.Redis, redis_url: str) -> Iterator[FlaskClient]:
    yield create_app(redis_url).test_client()


def page(client: FlaskClient, path: str = "/leases") -> str:
    answer = client.get(path)
    assert answer.status_code == 200, answer.data[:500]
    return answer.get_data(as_text=True)


def cell(html: str, job_id: str, column: str) -> str:
    """The text of a leased job's ``column`` cell."""
    row = re.search(
        rf'<tr class="rq-emq-lease[^"]*" data-job-id="{re.escape(job_id)}">(.*?)</tr>', html, re.S
    )
    assert row, f"no row for {job_id}"
    found = re.search(rf'<td class="{column}">(.*?)</td>', row.group(1), re.S)
    assert found, f"no {column} cell for {job_id}"
    return html_module.unescape(re.sub(r"<[^>]+>", "", found.group(1))).strip()


def events(html: str) -> list[tuple[str, str]]:
    return re.findall(r'<tr class="rq-emq-event [^"]*" data-kind="([^"]+)" data-job-id="([^"]+)">', html)


def chart_counts(html: str, series: str) -> tuple[int, set[int]]:
    """A chart series' drawn points (only a minute that counted one is drawn): their summed
    count, and the minutes they sit at (59 is the current one)."""
    points = re.findall(rf'class="point point-{series}" data-minute="(\d+)" data-count="(\d+)"', html)
    return sum(int(c) for _, c in points), {int(m) for m, _ in points}


def held_job(r: redis.Redis, report: str | None = None) -> Lease:
    """A job taken by worker w1 (its lease in a lock manager the test ticks), maybe reported."""
    Queue("q", connection=r).enqueue("jobs.noop", description="adds things")
    taken = Taker(r, "w1", SETTINGS).pop(["q"])
    assert taken is not None
    lease = Lease("q", taken.job_id, taken.token)
    if report is not None:
        manager = LockManager(r, SETTINGS.lease_ms, SETTINGS.renew_interval_ms, on_lost=lambda _: None)
        manager.add(lease)
        lease.post_report(report)
        manager.tick()
    return lease


def test_a_leased_job_shows_its_worker_attempt_report_and_fencing_token(
    r: redis.Redis, client: FlaskClient
) -> None:
    lease = held_job(r, encode_report(0.4, {"step": "upload"}))
    html = page(client)
    assert cell(html, lease.job_id, "worker") == "w1"
    assert cell(html, lease.job_id, "attempt") == "1 of 3"
    assert cell(html, lease.job_id, "fencing-token") == r.hget(job_key(lease.job_id), "emq_fence").decode()
    assert cell(html, lease.job_id, "lock") == "held"
    assert cell(html, lease.job_id, "report").startswith('40% step="upload" (')
    assert re.fullmatch(r"(\d+ ms|\d+\.\d s) ago", cell(html, lease.job_id, "age"))  # since the grant
    assert '<td class="in-flight">1</td>' in html


def test_stalls_recoveries_crashes_poison_pills_and_refused_outcomes_are_listed_with_the_chart(
    r: redis.Redis, client: FlaskClient
) -> None:
    recovered, poisoned = stall(r, 2)
    r.hset(job_key(poisoned), mapping={"emq_max_attempts": 1})
    s = sweeper(r)
    s.sweep("q")
    next_round(s)
    s.sweep("q")
    r.delete(Q.rq_queue)  # the recovered job out of the way of the next takes
    crashed = held_job(r)
    crash = scripts.load("recover_crashed_job")
    args = [crashed.job_id, crashed.token, "rq:", 3, 60, "2026-12-02T00:00:00Z", "horse killed by signal 9"]
    assert crash(r, Q.returning(crashed.job_id) + [Q.failed, Q.outbox], args)[0] == 1
    late = held_job(r)
    finish = scripts.load("finish_job")
    keys = [job_key(late.job_id), Q.lock(late.job_id), Q.leases, Q.stalled, Q.stats]
    assert finish(r, keys, [late.job_id, "not-its-token:w9", "finished", 0]) == [0, []]
    html = page(client)
    listed = events(html)
    for kind, job_id in [
        ("marked", recovered),
        ("recovered", recovered),
        ("marked", poisoned),
        ("failed", poisoned),
        ("crashed", crashed.job_id),
        ("refused", late.job_id),
    ]:
        assert (kind, job_id) in listed, (kind, job_id, listed)
    assert "stalled on attempt 1 of 1" in html and "horse killed by signal 9 (attempt 1 of 3)" in html
    assert "dead-worker" in html and "w9" in html  # the holder whose lease it was
    # two stalls and one recovery (the poison pill was failed, not recovered), drawn in this
    # minute's point, or split with the one before when the test straddled a minute's start
    for series, count in (("stalled", 2), ("recovered", 1)):
        total, minutes = chart_counts(html, series)
        assert total == count and minutes and minutes <= {58, 59}, (series, total, minutes)
    assert "ago by rq-emq-sweeper" in html  # the last round, and who ran it


def test_user_data_is_shown_escaped(r: redis.Redis, client: FlaskClient) -> None:
    job = Queue("q", connection=r).enqueue("jobs.noop", description='<script>alert("x")</script><b>')
    Taker(r, "<img src=x onerror=alert(1)>", SETTINGS).pop(["q"])
    html = page(client)
    assert "<script>alert" not in html and "<img src=x" not in html and "<b>" not in html
    assert "&lt;script&gt;alert(&#34;x&#34;)&lt;/script&gt;&lt;b&gt;" in html
    assert cell(html, job.id, "worker") == "<img src=x onerror=alert(1)>"  # shown as text


def test_the_panel_sits_in_rq_dashboard_with_a_link_in_its_navigation(client: FlaskClient) -> None:
    for path in ("/", "/0/view/workers", "/leases"):
        assert 'id="rq-emq-leases-link"' in page(client, path)
        assert "RQ-dashboard" in page(client, path)  # rq-dashboard's own frame
    assert 'href="/0/view/job/' not in page(client)  # no jobs yet; links checked below


def test_embedded_beside_rq_dashboard_in_one_line_it_links_jobs_to_rq_dashboards_pages(
    r: redis.Redis, redis_url: str
) -> None:
    import rq_dashboard
    from rq_dashboard.web import setup_rq_connection

    app = Flask("my-app")
    app.config.from_object(rq_dashboard.default_settings)
    app.config["RQ_DASHBOARD_REDIS_URL"] = redis_url
    setup_rq_connection(app)
    app.register_blueprint(rq_dashboard.blueprint, url_prefix="/rq")
    app.register_blueprint(lease_panel, url_prefix="/rq")  # the one line
    lease = held_job(r)
    html = page(app.test_client(), "/rq/leases")
    assert f'href="/rq/0/view/job/{lease.job_id}"' in html
    assert page(app.test_client(), f"/rq/0/view/job/{lease.job_id}")  # rq-dashboard's page


def test_job_links_are_the_ones_url_for_builds(redis_url: str) -> None:
    """The page builds its job links from one ``url_for`` per page; each is still the one
    ``url_for`` would build for that job id, under a prefix and for another instance too."""
    from flask import url_for

    from rq_emq.operate.dashboard import _job_urls

    app = create_app(redis_url, url_prefix="/rq")
    with app.test_request_context("/rq/leases"):
        for instance in (0, 3):
            links = _job_urls(instance)
            for job_id in ("a1b2-c3", "rq-emq-job-id", "x y/z?#%", "é<&>\"'", ""):
                expected = url_for("rq_dashboard.job_view", instance_number=instance, job_id=job_id)
                assert links(job_id) == expected, job_id


def test_behind_rq_dashboards_basic_auth_the_panel_refuses_a_stranger(r: redis.Redis, redis_url: str) -> None:
    app = create_app(redis_url, username="ops", password="s3cret")
    stranger = app.test_client()
    for path in ("/leases", "/0/view/leases/panels"):
        assert stranger.get(path).status_code == 401
        assert stranger.get(path, auth=("ops", "wrong")).status_code == 401
        assert stranger.get(path, auth=("ops", "s3cret")).status_code == 200


def test_a_guard_added_to_rq_dashboards_blueprint_guards_the_panel_too(redis_url: str) -> None:
    """What ``add_basic_auth(rq_dashboard.blueprint, ...)`` (or any before-request check on
    rq-dashboard's blueprint) registers runs before the panel's pages as well."""
    from flask import Response, request

    def only_with_the_header() -> Response | None:
        return None if "X-Ok" in request.headers else Response("no", 403)

    app = create_app(redis_url)
    app.before_request_funcs.setdefault("rq_dashboard", []).insert(0, only_with_the_header)
    assert app.test_client().get("/leases").status_code == 403
    assert app.test_client().get("/leases", headers={"X-Ok": "1"}).status_code == 200


def test_the_panel_only_reads(own_server: RedisServer) -> None:
    # A server of its own: Redis counts commands server-wide, and a process an earlier test
    # left behind may still reach the shared one (and add an EXPIRE to the count)
    r = redis.Redis.from_url(own_server.url)
    client = create_app(own_server.url).test_client()
    held_job(r, encode_report(1, {}))
    rules = [rule for rule in client.application.url_map.iter_rules() if rule.endpoint.startswith("rq_emq")]
    assert rules and all(set(rule.methods or ()) <= {"GET", "HEAD", "OPTIONS"} for rule in rules)
    before = {key: r.type(key) for key in r.keys("*")}
    r.config_resetstat()
    html = page(client)
    assert "<form" not in html and "method=" not in html.lower().replace('method="get"', "")
    assert {key: r.type(key) for key in r.keys("*")} == before
    written = [name for name in r.info("commandstats") if name.split("_", 1)[1] in WRITES]
    assert written == [], written


WRITES = {"set", "hset", "del", "zadd", "zrem", "lpush", "rpush", "xadd", "hincrby", "expire", "hdel"}


def test_without_rq_dashboard_the_panel_says_what_it_needs(redis_url: str) -> None:
    app = Flask("bare")
    app.register_blueprint(lease_panel)
    answer = app.test_client().get("/leases")
    assert answer.status_code == 500 and b"rq-dashboard's blueprint" in answer.data


def test_a_reports_tooltip_is_the_whole_report_and_adds_no_attribute(
    r: redis.Redis, client: FlaskClient
) -> None:
    """A report's note is end-user data (a filename): in the tooltip it is text, whatever
    quotes it holds, and it opens no attribute of its own (the reported XSS)."""
    note = "x\" autofocus tabindex=0 onfocus=\"document.body.innerText='pwned'\" '<b>&amp;"
    lease = held_job(r, encode_report(0.5, {"note": note}))
    spans = ElementsOf("span").of(page(client))
    (tooltip,) = [attrs for attrs in spans if attrs.get("class") == "report-full"]
    assert tooltip == {"class": "report-full", "title": json.dumps({"progress": 0.5, "note": note})}
    assert cell(page(client), lease.job_id, "report").startswith("50% note=")


def test_the_page_lets_run_only_its_own_inline_scripts_and_the_fragment_none(
    r: redis.Redis, client: FlaskClient
) -> None:
    """The policy allows each inline script of the page by its hash (rq-dashboard's, with
    its settings, and ours), no inline handler, and no script at all in the fragment."""
    held_job(r, encode_report(1, {"name": "<script>alert(1)</script>"}))
    answer = client.get("/leases")
    policy = dict(part.strip().split(" ", 1) for part in answer.headers["Content-Security-Policy"].split(";"))
    html = answer.get_data(as_text=True)
    inline = re.findall(r"<script(?![^>]*\bsrc=)[^>]*>(.*?)</script>", html, re.S)
    assert len(inline) == 2  # rq-dashboard's settings and refresh, our navigation link
    digests = (base64.b64encode(hashlib.sha256(script.encode()).digest()).decode() for script in inline)
    expected = {f"'sha256-{digest}'" for digest in digests}
    assert set(policy["script-src"].split()) == {"'self'", *expected}
    assert policy["frame-ancestors"] == "'none'" and policy["object-src"] == "'none'"
    fragment = client.get("/0/view/leases/panels")
    assert "script-src 'none'" in fragment.headers["Content-Security-Policy"]
    assert "<script" not in fragment.get_data(as_text=True)


class ElementsOf(HTMLParser):
    """The attributes of every ``tag`` element of a page, as a browser's parser reads them."""

    def __init__(self, tag: str) -> None:
        super().__init__()
        self.tag, self.found = tag, []  # type: tuple[str, list[dict[str, str | None]]]

    def of(self, html: str) -> list[dict[str, str | None]]:
        self.feed(html)
        return self.found

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == self.tag:
            self.found.append(dict(attrs))


def test_the_dashboard_listens_on_loopback_unless_told_otherwise(redis_url: str, procs: Processes) -> None:
    """``rq-emq dashboard`` serves rq-dashboard's write actions (no CSRF token): by default
    only this host reaches it."""
    import psutil

    port = free_port()
    server = procs.start([RQ_EMQ, "dashboard", "--url", redis_url, "--port", str(port)], name="dashboard")

    def listening() -> list[str]:
        return [c.laddr.ip for c in psutil.Process(server.pid).net_connections("tcp") if c.status == "LISTEN"]

    assert wait_for(listening, timeout=30, what="the dashboard to listen") == ["127.0.0.1"]
    assert "warning" not in procs.log(server)


@pytest.mark.parametrize(
    "args, env, warnings",
    [
        ([], {}, []),
        (["--bind", "0.0.0.0"], {}, ["listening on 0.0.0.0 without a password"]),
        (["--bind", "::1"], {}, []),
        (["--bind", "0.0.0.0", "--username", "ops"], {"RQ_DASHBOARD_PASSWORD": "s3cret"}, []),
        (
            ["--bind", "0.0.0.0", "--username", "ops", "--password", "s3cret"],
            {},
            ["--password shows in the process list (ps); set RQ_DASHBOARD_PASSWORD instead"],
        ),
    ],
)
def test_the_dashboard_warns_once_about_an_open_port_or_a_password_in_ps(
    redis_url: str, monkeypatch: pytest.MonkeyPatch, args: list[str], env: dict[str, str], warnings: list[str]
) -> None:
    from click.testing import CliRunner

    from rq_emq.operate.cli import main

    served: list[str] = []
    monkeypatch.setattr(Flask, "run", lambda app, host, port, threaded: served.append(host))
    result = CliRunner().invoke(main, ["dashboard", "--url", redis_url, *args], env=env)
    assert result.exit_code == 0, result.output
    lines = [line for line in result.stderr.splitlines() if line.startswith("warning:")]
    assert len(lines) == len(warnings) and all(w in line for w, line in zip(warnings, lines, strict=True))
    assert served == [args[args.index("--bind") + 1] if "--bind" in args else "127.0.0.1"]


def test_a_username_without_a_password_is_refused_in_one_line(redis_url: str) -> None:
    from click.testing import CliRunner

    from rq_emq.operate.cli import main

    result = CliRunner().invoke(main, ["dashboard", "--url", redis_url, "--username", "ops"], env={})
    assert result.exit_code == 2 and "set RQ_DASHBOARD_PASSWORD" in result.output
    assert "Traceback" not in result.output


def test_redis_down_or_a_bad_setting_gives_a_page_that_says_so_not_a_500(
    redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The panel inside rq-dashboard's frame, its refresh fragment too, with one line that
    names what is wrong (the Redis's host and port, never its password), no traceback."""
    port = free_port()  # nothing listens there
    client = create_app(f"redis://:s3cret@127.0.0.1:{port}/0").test_client()
    for path in ("/leases", "/0/view/leases/panels"):
        answer = client.get(path)
        html = answer.get_data(as_text=True)
        assert answer.status_code == 200 and 'class="alert alert-danger rq-emq-error"' in html
        assert f"cannot read Redis (127.0.0.1:{port}): ConnectionError" in html
        assert "s3cret" not in html and "Traceback" not in html
    assert "RQ-dashboard" in client.get("/leases").get_data(as_text=True)  # rq-dashboard's frame
    monkeypatch.setenv("RQ_EMQ_LEASE_MS", "abc")
    html = page(create_app(redis_url).test_client())
    assert "invalid setting in the dashboard&#39;s environment" in html and "RQ_EMQ_LEASE_MS" in html


def test_the_chart_draws_crashes_and_failures_too_with_each_points_time_of_day(
    r: redis.Redis, client: FlaskClient
) -> None:
    crashed = held_job(r)
    crash = scripts.load("recover_crashed_job")
    args = [crashed.job_id, crashed.token, "rq:", 1, 60, "2026-12-02T00:00:00Z", "horse killed by signal 9"]
    assert crash(r, Q.returning(crashed.job_id) + [Q.failed, Q.outbox], args)[0] == 2  # failed at 1 of 1
    html = page(client)
    for series in ("crashed", "failed"):
        total, minutes = chart_counts(html, series)
        assert total == 1 and minutes and minutes <= {58, 59}, (series, total, minutes)
    assert re.search(
        r'<circle class="point point-crashed"[^>]*><title>1 crashed at \d\d:\d\d UTC</title>', html
    )


@pytest.mark.parametrize(
    "progress, shown",
    [(0.4, "40%"), (1.0, "100%"), (0, "0"), (1, "1"), (7, "7"), ("half", '"half"')],
)
def test_a_progress_shows_as_a_percentage_only_when_it_is_a_fraction(progress: object, shown: str) -> None:
    """``report(step / steps)`` is a fraction, and 1.0 means done; ``report(1)`` (an int) is
    a count, not done: shown as written."""
    from rq_emq.operate.reports import short_report

    assert short_report({"progress": progress}) == shown
