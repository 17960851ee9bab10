"""The lease panel as an operator sees it: a real headless Chromium (Debian's, driven by
Selenium through Debian's chromedriver: nothing is downloaded) on ``rq-emq dashboard``,
while real LeaseWorkers run jobs on a private redis-server and the test SIGKILLs two
workers and one horse. The rendered page must show the leased jobs with their attempts
and reports, the crash, the recovery and the poison pill, a chart with points, and keep
itself current without a reload."""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

import pytest
import redis
from dashboard_browser import start_dashboard
from helpers import wait_status
from jobs import runs
from procs import Processes, unseen, wait_for
from rq import Queue

import rq_emq

pytestmark = pytest.mark.slow
#: a lease that lapses soon, so the kills turn into marks and recoveries within seconds
LEASE = {"RQ_EMQ_LEASE_MS": "2000", "RQ_EMQ_RENEW_INTERVAL_MS": "250", "RQ_EMQ_SWEEP_INTERVAL_MS": "500"}
#: where to save screenshots of the panel (docs/: `RQ_EMQ_SCREENSHOTS=docs pytest ...`)
SCREENSHOTS = os.environ.get("RQ_EMQ_SCREENSHOTS")


def horse_of(log: str) -> int:
    (line,) = [line for line in runs(log) if line.startswith("start")][-1:]
    return int(line.split()[1])


def test_the_panel_shows_a_crash_a_recovery_and_a_poison_pill_as_they_happen(
    r: redis.Redis, redis_url: str, procs: Processes, tmp_path: Path, browser: Any
) -> None:
    from selenium.webdriver.common.by import By

    queue = Queue(connection=r)
    stalled_log, poison_log, long_log = (str(tmp_path / f"{n}.log") for n in ("stalled", "poison", "long"))
    # two workers each take a job, then both are SIGKILLed: one job is recovered, the
    # other (one attempt allowed) is failed at max attempts: a poison pill
    first, second = procs.worker(redis_url, **LEASE), procs.worker(redis_url, **LEASE)
    stalled = queue.enqueue("jobs.sleep_and_record", stalled_log, 60.0, job_timeout=300)
    poison = queue.enqueue(
        "jobs.sleep_and_record", poison_log, 60.0, job_timeout=300, meta=rq_emq.max_attempts(1)
    )
    wait_for(lambda: runs(stalled_log) and runs(poison_log), timeout=20, what="both jobs to start")
    for worker in (first, second):
        os.kill(unseen(worker.pid), signal.SIGKILL)
        worker.wait()
    # a third worker recovers the stalled job and runs it; its horse is SIGKILLed mid-run (a
    # crash: back at once, attempt counted) and the job runs a third time
    survivor = procs.worker(redis_url, **LEASE)
    wait_status(r, poison.id, "failed", timeout=30)
    wait_for(
        lambda: len([x for x in runs(stalled_log) if x.startswith("start")]) == 2,
        timeout=30,
        what="the rerun",
    )
    os.kill(horse_of(stalled_log), signal.SIGKILL)
    wait_for(
        lambda: len([x for x in runs(stalled_log) if x.startswith("start")]) == 3,
        timeout=30,
        what="the 3rd run",
    )
    # a long job that reports its progress, on a worker of its own
    procs.worker(redis_url, **LEASE)
    long = queue.enqueue("lease_jobs.report_progress", long_log, 600, 0.1, job_timeout=300)
    wait_status(r, long.id, "started", timeout=30)
    assert survivor.poll() is None

    base = start_dashboard(procs, redis_url)
    browser.get(f"{base}/0/view/queues")
    link = browser.find_element(By.ID, "rq-emq-leases-link")
    assert link.is_displayed() and link.text == "Leases"  # in rq-dashboard's own navigation
    link.click()
    wait_for(lambda: "Leases" in browser.title or browser.find_elements(By.CSS_SELECTOR, ".rq-emq-queue"))

    # each read is one script in the page, so the panels' auto-refresh (which replaces them
    # whole) cannot swap an element between finding it and reading it
    def text_of(selector: str) -> str:
        script = "var e = document.querySelector(arguments[0]); return e ? e.innerText : '';"
        return str(browser.execute_script(script, selector)).strip()

    def cell(job_id: str, column: str) -> str:
        return text_of(f'tr.rq-emq-lease[data-job-id="{job_id}"] td.{column}')

    def event(kind: str, job_id: str) -> str:
        return text_of(f'tr.rq-emq-event[data-kind="{kind}"][data-job-id="{job_id}"]')

    wait_for(lambda: cell(long.id, "report"), timeout=15, what="the long job's report")

    def token(job_id: str) -> str:
        return str((r.hget(f"rq:job:{job_id}", "emq_fence") or b"").decode())

    assert cell(long.id, "attempt") == "1 of 3" and cell(long.id, "fencing-token") == token(long.id)
    assert cell(stalled.id, "attempt") == "3 of 3" and cell(stalled.id, "fencing-token") == token(stalled.id)
    assert cell(stalled.id, "lock") == "held" and cell(stalled.id, "worker")
    assert "work horse killed by signal 9" in event("crashed", stalled.id)
    assert "(attempt 2 of 3)" in event("crashed", stalled.id)
    assert "stalled on attempt 1 of 3" in event("recovered", stalled.id)
    assert "stalled on attempt 1 of 1" in event("failed", poison.id)  # the poison pill
    assert event("marked", poison.id) and event("marked", stalled.id)
    stalls = browser.execute_script(
        "return Array.from(document.querySelectorAll('svg.rq-emq-chart circle.point-stalled'))"
        ".map(function (p) { return Number(p.dataset.count); });"
    )
    assert stalls and sum(stalls) >= 2, stalls
    # the page keeps itself current (rq-dashboard's Autorefresh), no reload
    shown = cell(long.id, "report")
    marker = browser.execute_script("window.rq_emq_no_reload = 1; return window.rq_emq_no_reload;")
    wait_for(lambda: cell(long.id, "report") != shown, timeout=15, what="the report to move on the page")
    assert browser.execute_script("return window.rq_emq_no_reload;") == marker
    if SCREENSHOTS:
        browser.set_window_size(1400, browser.execute_script("return document.body.scrollHeight") + 100)
        browser.save_screenshot(str(Path(SCREENSHOTS) / "dashboard-leases.png"))


def hostile(where: str) -> str:
    """User data an attacker wrote: it breaks out of a double-quoted attribute into live
    ones (a focus handler that fires with no click, as reported), then tries an element,
    a script and an entity. Run, any of it sets ``window.rq_emq_pwned`` to ``where``."""
    run = f"window.rq_emq_pwned='{where}'"
    return (
        f'x" autofocus tabindex=0 onfocus="{run}" data-x="<img src=x onerror={run}>'
        f"<script>{run}</script><svg onload={run}></svg> &amp; {where}"
    )


def test_hostile_user_data_runs_no_script_and_shows_as_written(
    r: redis.Redis, redis_url: str, procs: Processes, tmp_path: Path, browser: Any
) -> None:
    """A queue name, a worker name, a job's description, meta and report note, and a stray
    lease entry and event of the queue's record (job id, worker, kind, reason), each holding
    markup: the panel's page and its refresh fragment, in a real browser, run none of it
    and show each as the text it is, tooltips included. The page's policy forbids inline
    handlers, so a script an escape missed would not run either."""
    import json
    import urllib.request

    from rq_emq.keys import QueueKeys

    queue_name, worker_name, note = hostile("queue"), hostile("worker"), hostile("note")
    queue = Queue(queue_name, connection=r)
    log = str(tmp_path / "note.log")
    procs.worker(
        redis_url, queue_name, name=worker_name, RQ_EMQ_LEASE_MS="5000", RQ_EMQ_RENEW_INTERVAL_MS="250"
    )
    job = queue.enqueue(
        "lease_jobs.report_note",
        log,
        note,
        120.0,
        description=hostile("description"),
        meta={"about": hostile("meta")},
        job_timeout=300,
    )
    keys = QueueKeys(queue_name)
    wait_for(lambda: r.hget(f"rq:job:{job.id}", "emq_report"), timeout=30, what="the job's report to land")
    stray_id = hostile("stray id")
    r.zadd(keys.leases, {stray_id: 32_503_680_000_000})  # a stray lease entry, no job hash
    event = {name: hostile(name) for name in ("kind", "job", "worker", "reason")}
    r.xadd(keys.events, event)  # type: ignore[arg-type]

    base = start_dashboard(procs, redis_url)
    with urllib.request.urlopen(f"{base}/leases", timeout=10) as answer:
        csp = answer.headers["Content-Security-Policy"]
    scripts = next(part for part in csp.split(";") if part.strip().startswith("script-src")).split()
    assert "'unsafe-inline'" not in scripts and "'unsafe-hashes'" not in scripts, csp

    def text_of(selector: str, attribute: str | None = None) -> str | None:
        script = (
            "var e = document.querySelector(arguments[0]); if (!e) { return null; }"
            " return arguments[1] ? e.getAttribute(arguments[1]) : e.innerText;"
        )
        value = browser.execute_script(script, selector, attribute)
        return None if value is None else str(value)

    def nothing_ran_and_nothing_live(root: str) -> None:
        assert browser.execute_script("return typeof window.rq_emq_pwned;") == "undefined", (
            browser.execute_script("return window.rq_emq_pwned;")
        )
        live = browser.execute_script(
            "var found = [];"
            "document.querySelectorAll(arguments[0] + ' *').forEach(function (e) {"
            "  var tag = e.tagName.toLowerCase();"
            "  if (['script', 'img', 'iframe', 'object', 'embed'].indexOf(tag) >= 0) { found.push(tag); }"
            "  if (tag === 'svg' && !e.classList.contains('rq-emq-chart')) { found.push('svg'); }"
            "  Array.from(e.attributes).forEach(function (a) {"
            "    if (/^on|^autofocus$/.test(a.name) || /^\\s*javascript:/i.test(a.value)) {"
            "      found.push(tag + '@' + a.name); }"
            "  });"
            "});"
            "return found;",
            root,
        )
        assert live == [], live

    def shown_as_written() -> None:
        panel = f'.rq-emq-queue[data-queue="{css(queue_name)}"]'
        assert text_of(f"{panel} h2") == queue_name
        row = f'{panel} tr.rq-emq-lease[data-job-id="{job.id}"]'
        assert text_of(f"{row} td.worker") == worker_name
        description = str(text_of(f"{row} small.description"))
        assert description.endswith("...") and hostile("description").startswith(description[:-3])
        title = text_of(f"{row} td.report span.report-full", "title")
        assert json.loads(str(title)) == {"progress": 0.5, "note": note}  # the whole report, as written
        stray = f'{panel} tr.rq-emq-lease[data-job-id="{css(stray_id)}"]'
        assert text_of(f"{stray} td.job a") == stray_id
        listed = f'{panel} tr.rq-emq-event[data-job-id="{css(event["job"])}"]'
        assert text_of(listed, "data-kind") == event["kind"]
        for column, value in event.items():
            assert text_of(f"{listed} td.{column}") == value, column

    browser.get(f"{base}/leases")
    wait_for(lambda: text_of(".rq-emq-queue h2"), timeout=15, what="the panels")
    nothing_ran_and_nothing_live("#rq-emq-panels")
    shown_as_written()
    # the refresh fragment, as the page's own refresh inserts it (innerHTML: a handler in it
    # would run), then alone at its own address
    browser.execute_script("document.querySelector('#rq-emq-panels > .rq-emq-queue').rq_emq_old = 1;")
    wait_for(
        lambda: browser.execute_script(
            "var e = document.querySelector('#rq-emq-panels > .rq-emq-queue'); return e && !e.rq_emq_old;"
        ),
        timeout=15,
        what="the panels to refresh",
    )
    browser.execute_script(
        "document.querySelectorAll('#rq-emq-panels [tabindex]').forEach(function (e) { e.focus(); });"
    )
    nothing_ran_and_nothing_live("#rq-emq-panels")
    shown_as_written()
    browser.get(f"{base}/0/view/leases/panels")
    wait_for(lambda: text_of(".rq-emq-queue h2"), timeout=15, what="the fragment")
    nothing_ran_and_nothing_live("body")
    # the policy is in force: a handler that reached the page anyway does not run
    browser.get(f"{base}/leases")
    wait_for(lambda: text_of(".rq-emq-queue h2"), timeout=15, what="the panels")
    browser.execute_script(
        "window.rq_emq_blocked = 0;"
        "document.addEventListener('securitypolicyviolation', function () { window.rq_emq_blocked += 1; });"
        "document.body.insertAdjacentHTML('beforeend',"
        ' \'<img src="data:,x" onerror="window.rq_emq_pwned=1">'
        '<img src="/nowhere.png" onerror="window.rq_emq_pwned=2">\');'
    )
    wait_for(lambda: browser.execute_script("return window.rq_emq_blocked;"), timeout=10, what="a CSP report")
    assert browser.execute_script("return typeof window.rq_emq_pwned;") == "undefined"
    assert text_of("#rq-emq-leases-link") == "Leases"  # the trusted scripts ran: the link moved


def css(value: str) -> str:
    """``value`` inside a CSS attribute selector's double quotes."""
    return value.replace("\\", "\\\\").replace('"', '\\"')
