"""``rq-emq dashboard`` is safe to open in an operator's browser: through Flask's test client
against a real Redis, every action of rq-dashboard's (delete, requeue, empty, compact)
refuses a request that another site's page could send (cross-site, an unknown origin, no
origin at all, a GET), with and without the password; a host name it was not given is
refused (DNS rebinding); every HTML page it serves carries a policy that runs no injected
script. The same requests from its own pages still work. (The browser's view of these:
tests/integration/test_dashboard_browser.py.)"""

from __future__ import annotations

import base64
from collections.abc import Callable
from typing import Any

import pytest
import redis
from integration_scenarios import require
from rq import Queue
from rq.registry import FailedJobRegistry

require("rq_dashboard")
from flask.testing import FlaskClient  # noqa: E402

from rq_emq.operate.dashboard import create_app  # noqa: E402
from rq_emq.operate.dashboard.guard import same_origin  # noqa: E402

HOST = "127.0.0.1:9181"
SAME_ORIGIN = {"Sec-Fetch-Site": "same-origin", "Origin": f"http://{HOST}"}
#: what another site's page makes a browser send, and what a client with no browser sends
FOREIGN = {
    "cross-site fetch metadata": {"Sec-Fetch-Site": "cross-site", "Origin": "https://evil.example"},
    "same-site, another port": {"Sec-Fetch-Site": "same-site", "Origin": "http://127.0.0.1:8000"},
    "another origin, no metadata": {"Origin": "http://127.0.0.1:8000"},
    "an opaque origin": {"Origin": "null"},
    "another site's referer": {"Referer": "https://evil.example/page"},
    "no origin at all": {},
}


def failed_job(r: redis.Redis, queue: str = "q") -> str:
    """A job in ``queue``'s failed registry, as RQ leaves one."""
    job = Queue(queue, connection=r).enqueue("jobs.fail")
    registry = FailedJobRegistry(queue, connection=r)
    with r.pipeline() as pipe:
        registry.add(job, ttl=600, exc_string="Traceback: boom", pipeline=pipe)
        pipe.execute()
    Queue(queue, connection=r).remove(job.id)
    return job.id


def actions(r: redis.Redis) -> dict[str, tuple[str, Callable[[], bool]]]:
    """Each of rq-dashboard's actions: its path, and whether it took effect."""
    deleted, requeued, emptied, cleared = (failed_job(r, q) for q in ("q1", "q2", "q3", "q4"))
    Queue("q5", connection=r).enqueue("jobs.noop")
    return {
        "delete": (f"/job/{deleted}/delete", lambda: not r.exists(f"rq:job:{deleted}")),
        "requeue": (f"/job/{requeued}/requeue", lambda: requeued in Queue("q2", connection=r).job_ids),
        "requeue all": ("/requeue/q3", lambda: emptied in Queue("q3", connection=r).job_ids),
        "empty": ("/queue/q4/failed/empty", lambda: not r.exists(f"rq:job:{cleared}")),
        "empty queued": ("/queue/q5/queued/empty", lambda: Queue("q5", connection=r).count == 0),
    }


@pytest.fixture
def client(r: redis.Redis, redis_url: str) -> FlaskClient:
    return create_app(redis_url).test_client()


def post(client: FlaskClient, path: str, headers: dict[str, str], **kwargs: Any) -> int:
    return client.post(path, headers=headers, base_url=f"http://{HOST}", **kwargs).status_code


@pytest.mark.parametrize("sent", FOREIGN.values(), ids=FOREIGN.keys())
def test_no_action_takes_effect_from_another_sites_page(
    r: redis.Redis, client: FlaskClient, sent: dict[str, str]
) -> None:
    for name, (path, took_effect) in actions(r).items():
        assert post(client, path, sent) == 403, name
        assert not took_effect(), name


def test_every_action_still_works_from_the_dashboards_own_pages(r: redis.Redis, client: FlaskClient) -> None:
    for name, (path, took_effect) in actions(r).items():
        assert post(client, path, SAME_ORIGIN) == 200, name
        assert took_effect(), name
    # a browser that sends no fetch metadata: its Origin, else its Referer, names this host
    for headers in ({"Origin": f"http://{HOST}"}, {"Referer": f"http://{HOST}/0/view/jobs"}):
        job_id = failed_job(r)
        assert post(client, f"/job/{job_id}/delete", headers) == 200
        assert not r.exists(f"rq:job:{job_id}")


def test_an_action_answers_a_get_with_405_even_where_rq_dashboard_takes_one(
    r: redis.Redis, client: FlaskClient
) -> None:
    """rq-dashboard's requeue-all answers GET: an ``<img src>`` on any page would send it."""
    job_id = failed_job(r, "q")
    answer = client.get("/requeue/q", headers=SAME_ORIGIN, base_url=f"http://{HOST}")
    assert answer.status_code == 405
    assert job_id in FailedJobRegistry("q", connection=r).get_job_ids()


def test_the_password_does_not_let_another_sites_form_through(r: redis.Redis, redis_url: str) -> None:
    """A browser sends the operator's basic-auth credentials with any site's form."""
    client = create_app(redis_url, username="ops", password="s3cret").test_client()
    login = {"Authorization": "Basic " + base64.b64encode(b"ops:s3cret").decode()}
    job_id = failed_job(r)
    assert post(client, f"/job/{job_id}/delete", {**login, **FOREIGN["cross-site fetch metadata"]}) == 403
    assert r.exists(f"rq:job:{job_id}")
    assert post(client, f"/job/{job_id}/delete", SAME_ORIGIN) == 401  # the password still counts
    assert post(client, f"/job/{job_id}/delete", {**login, **SAME_ORIGIN}) == 200
    assert not r.exists(f"rq:job:{job_id}")


@pytest.mark.parametrize(
    "host, allowed, answered",
    [
        ("127.0.0.1:9181", (), True),
        ("localhost:9181", (), True),
        ("dash.localhost:9181", (), True),
        ("[::1]:9181", (), True),
        ("10.1.2.3:9181", (), True),  # an address: the browser was pointed at it
        ("rebind.evil.example:9181", (), False),  # a name that resolves here: DNS rebinding
        ("rebind.evil.example", (), False),
        ("dash.internal:9181", (), False),
        ("dash.internal:9181", ("dash.internal",), True),
        ("DASH.internal.:80", ("dash.internal",), True),
        ("other.internal:9181", ("dash.internal",), False),
        ("anything.example", ("*",), True),
    ],
)
def test_a_host_name_it_was_not_given_is_refused(
    redis_url: str, host: str, allowed: tuple[str, ...], answered: bool
) -> None:
    client = create_app(redis_url, allowed_hosts=allowed).test_client()
    for path in ("/", "/0/view/workers", "/0/data/queues.json", "/leases"):
        answer = client.get(path, headers={"Host": host})
        assert answer.status_code == (200 if answered else 400), (path, answer.data[:200])
    if not answered:
        assert b"--allowed-host" in answer.data


def test_every_page_runs_only_its_own_scripts_and_is_never_framed(
    r: redis.Redis, client: FlaskClient
) -> None:
    job_id = failed_job(r, "q")
    for path in (
        "/",
        "/0/view/workers",
        "/0/view/jobs/q/failed/8/asc/1",
        f"/0/view/job/{job_id}",
        "/leases",
        "/0/view/leases/panels",
        "/0/data/queues.json",
        "/no/such/page",
    ):
        answer = client.get(path)
        assert answer.status_code in (200, 404), path
        assert answer.headers["X-Content-Type-Options"] == "nosniff", path
        assert answer.headers["X-Frame-Options"] == "DENY", path
        if answer.mimetype != "text/html":
            continue
        policy = dict(
            (part.strip() + " ").split(" ", 1)
            for part in answer.headers["Content-Security-Policy"].split(";")
        )
        scripts = policy["script-src"].split()
        assert "'unsafe-inline'" not in scripts and "'unsafe-hashes'" not in scripts, path
        assert policy["frame-ancestors"].strip() == "'none'", path
        assert policy["object-src"].strip() == "'none'" and policy["base-uri"].strip() == "'none'", path


def test_same_origin_reads_evidence_and_never_absence() -> None:
    from werkzeug.test import EnvironBuilder
    from werkzeug.wrappers import Request

    def request(headers: dict[str, str]) -> Request:
        return Request(EnvironBuilder(base_url=f"http://{HOST}", headers=headers).get_environ())

    assert same_origin(request({"Sec-Fetch-Site": "same-origin"}))
    # fetch metadata wins over an Origin that would pass: it is the browser's own word
    assert not same_origin(request({"Sec-Fetch-Site": "none", "Origin": f"http://{HOST}"}))
    assert same_origin(request({"Origin": f"https://{HOST}"}))  # TLS ended by a proxy in front
    assert not same_origin(request({"Origin": f"http://{HOST}.evil.example"}))
    assert not same_origin(request({"Origin": "javascript://127.0.0.1:9181"}))
    assert not same_origin(request({}))


@pytest.mark.parametrize(
    "args, env",
    [
        (["--allowed-host", "dash.internal", "--allowed-host", "ops.internal"], {}),
        ([], {"RQ_EMQ_DASHBOARD_ALLOWED_HOSTS": "dash.internal, ops.internal"}),
        (["--bind", "dash.internal", "--allowed-host", "ops.internal"], {}),  # the name it listens on
    ],
)
def test_the_command_answers_to_the_names_it_is_given(
    redis_url: str, monkeypatch: pytest.MonkeyPatch, args: list[str], env: dict[str, str]
) -> None:
    from click.testing import CliRunner
    from flask import Flask

    from rq_emq.operate.cli import main

    served: list[Flask] = []
    monkeypatch.setattr(Flask, "run", lambda app, host, port, threaded: served.append(app))
    result = CliRunner().invoke(main, ["dashboard", "--url", redis_url, *args], env=env)
    assert result.exit_code == 0, result.output
    (app,) = served
    for host, status in (("dash.internal", 200), ("ops.internal:9181", 200), ("evil.example", 400)):
        assert app.test_client().get("/leases", headers={"Host": host}).status_code == status, host
