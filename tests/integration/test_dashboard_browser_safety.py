"""``rq-emq dashboard`` is safe to open, as an attacker would try it in the operator's own
browser (a real headless Chromium on a real ``rq-emq dashboard`` process): another site's
page that auto-submits a form, loads an image and sends a fetch at rq-dashboard's actions
changes nothing, with or without the password; a name of the attacker's that resolves to
this host (DNS rebinding) gets no page; hostile values in every field rq-dashboard shows (a
queue name, a worker name, a job's description, arguments, function name and exception
text) run no script on any of its pages. The dashboard's own buttons still work."""

from __future__ import annotations

import base64
import http.server
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from dashboard_browser import start_dashboard
from procs import Processes, wait_for
from rq import Queue, SimpleWorker
from rq.job import Job
from rq.registry import FailedJobRegistry

pytestmark = pytest.mark.slow
LOGIN = "ops:s3cret"


class _UnsubscribedWorker(SimpleWorker):
    """RQ's own worker without its pubsub thread, which nothing here needs: redis-py's stop
    of that thread, as the burst ends, could wait out its 60 s poll."""

    def subscribe(self) -> None:
        pass

    def unsubscribe(self) -> None:
        pass


def failed_jobs(r: redis.Redis, queue: str, *calls: tuple[str, tuple[Any, ...], dict[str, Any]]) -> list[Job]:
    """Jobs (function name, arguments, options) that failed in ``queue``, run by RQ's own
    worker: each with its result and exception text, as rq-dashboard shows them."""
    jobs = [Queue(queue, connection=r).enqueue(func, *args, **options) for func, args, options in calls]
    _UnsubscribedWorker([queue], connection=r).work(burst=True)
    assert all(job.get_status(refresh=True) == "failed" for job in jobs)
    return jobs


def failing(message: str = "boom", **options: Any) -> tuple[str, tuple[Any, ...], dict[str, Any]]:
    return ("jobs.fail", (message,), options)


@pytest.fixture
def other_site() -> Iterator[tuple[str, dict[str, str]]]:
    """Another site (``http://attacker.test:<port>``, this host in the test's browser): the
    pages it serves, by path, and its address."""
    pages: dict[str, str] = {}

    class Pages(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = pages.get(self.path, "").encode()
            self.send_response(200 if body else 404)
            self.send_header("Content-Type", "text/html; charset=utf-8")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Pages)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://attacker.test:{server.server_address[1]}", pages
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize("password", [False, True], ids=["no password", "logged in"])
def test_another_sites_page_changes_nothing_with_or_without_the_password(
    r: redis.Redis,
    redis_url: str,
    procs: Processes,
    browser: Any,
    other_site: tuple[str, dict[str, str]],
    password: bool,
) -> None:
    ((deleted,), (requeued,), (emptied,)) = (failed_jobs(r, q, failing()) for q in ("q1", "q2", "q3"))
    login = ["--username", LOGIN.split(":")[0]] if password else []
    secret = {"RQ_DASHBOARD_PASSWORD": LOGIN.split(":")[1]} if password else {}
    base = start_dashboard(procs, redis_url, *login, env=secret, auth=LOGIN if password else None)
    if password:
        # the operator logged in: the browser sends the credentials with every request to
        # the dashboard, whichever page made it (as a browser does with basic auth)
        browser.execute_cdp_cmd("Network.enable", {})
        credentials = "Basic " + base64.b64encode(LOGIN.encode()).decode()
        browser.execute_cdp_cmd("Network.setExtraHTTPHeaders", {"headers": {"Authorization": credentials}})
        browser.get(f"{base}/0/view/workers")
        assert "RQ dashboard" in browser.title  # logged in
    site, pages = other_site
    pages["/"] = f"""<!doctype html><title>cute cats</title>
<form id="f" method="POST" action="{base}/job/{deleted.id}/delete"></form>
<img src="{base}/requeue/q2">
<script>
fetch("{base}/queue/q3/failed/empty", {{method: "POST", mode: "no-cors", credentials: "include"}})
  .catch(function () {{}})
  .finally(function () {{ setTimeout(function () {{ document.getElementById("f").submit(); }}, 300); }});
</script>"""
    browser.get(f"{site}/")
    wait_for(lambda: browser.current_url.startswith(base), timeout=15, what="the form to be submitted")
    assert "must come from this dashboard's own pages" in browser.find_element("tag name", "body").text
    assert r.exists(deleted.key)
    assert requeued.id in FailedJobRegistry("q2", connection=r).get_job_ids()
    assert emptied.id in FailedJobRegistry("q3", connection=r).get_job_ids()
    assert Queue("q2", connection=r).count == 0

    # the dashboard's own Requeue button, under its page's policy, still works
    browser.get(f"{base}/0/view/jobs/q2/failed/8/asc/1")
    button = f'tr[data-job-id="{requeued.id}"] [data-role="requeue-job-btn"]'
    wait_for(lambda: browser.find_elements("css selector", button), timeout=15, what="the failed job's row")
    browser.find_element("css selector", button).click()
    wait_for(lambda: requeued.id in Queue("q2", connection=r).job_ids, timeout=15, what="the requeue")


def test_a_name_that_resolves_here_gets_no_page(redis_url: str, procs: Processes, browser: Any) -> None:
    """DNS rebinding: the attacker's name, pointed at this host, is not one it answers to."""
    port = start_dashboard(procs, redis_url).rsplit(":", 1)[1]
    for path in ("/0/view/workers", "/0/data/queues.json", "/leases"):
        browser.get(f"http://rebind.test:{port}{path}")
        text = browser.find_element("tag name", "body").text
        assert "does not answer to the host name 'rebind.test'" in text, (path, text[:300])


def hostile(where: str) -> str:
    """Markup an attacker put in a field: run, any of it sets ``window.rq_emq_pwned``."""
    run = f"window.rq_emq_pwned='{where}'"
    return f'x" onmouseover="{run}" <img src=x onerror="{run}"><svg onload="{run}"></svg> {where}'


def test_hostile_values_run_no_script_on_any_of_rq_dashboards_pages(
    r: redis.Redis, redis_url: str, procs: Processes, browser: Any, tmp_path: Path
) -> None:
    queue_name = hostile("queue").replace("/", "")  # a name rq-dashboard can route to
    log = str(tmp_path / "run.log")
    worker = procs.worker(redis_url, queue_name, name=hostile("worker").replace("/", ""))
    running = Queue(queue_name, connection=r).enqueue(
        "jobs.sleep_and_record", log, 120.0, hostile("argument"), description=hostile("description")
    )
    wait_for(lambda: Path(log).exists(), timeout=30, what="the job to start")
    failed, misnamed = failed_jobs(
        r,
        "plain",
        failing(hostile("exception"), description=hostile("failed description")),
        (f"jobs.{hostile('function').replace('/', '')}", (), {}),
    )
    base = start_dashboard(procs, redis_url)

    def nothing_ran(page: str) -> None:
        pwned = browser.execute_script("return window.rq_emq_pwned;")
        assert pwned is None, (page, pwned)

    for page, shown in (
        ("/", "queue"),
        ("/0/view/workers", "worker"),
        ("/0/view/jobs/plain/failed/8/asc/1", "failed description"),
        (f"/0/view/job/{failed.id}", "exception"),
        (f"/0/view/job/{misnamed.id}", "function"),
        (f"/0/view/job/{running.id}", "description"),
    ):
        browser.get(base + page)
        # the row is drawn (its value shows), so every template that inserts it has run
        wait_for(lambda s=shown: s in browser.find_element("tag name", "body").text, timeout=15, what=page)
        for element in browser.find_elements("css selector", "[onmouseover]"):
            browser.execute_script(
                "arguments[0].dispatchEvent(new MouseEvent('mouseover', {bubbles: true}));", element
            )
        nothing_ran(page)
    assert worker.poll() is None
