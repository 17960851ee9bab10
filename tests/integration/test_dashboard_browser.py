"""The lease panel as an operator sees it: a real headless Chromium (Debian's, driven by
Selenium through Debian's chromedriver: nothing is downloaded) on ``rq-emq dashboard``,
while real LeaseWorkers run jobs on a private redis-server and the test SIGKILLs two
workers and one horse. The rendered page must show the leased jobs with their attempts
and reports, the crash, the recovery and the poison pill, a chart with points, and keep
itself current without a reload."""

from __future__ import annotations

import os
import shutil
import signal
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from helpers import wait_status
from integration_scenarios import require
from jobs import runs
from procs import Processes, wait_for
from redis_server import in_ci
from rq import Queue

import rq_emq
from rq_emq.testing import free_port

pytestmark = pytest.mark.slow
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMEDRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"
#: a lease that lapses soon, so the kills turn into marks and recoveries within seconds
LEASE = {"RQ_EMQ_LEASE_MS": "2000", "RQ_EMQ_RENEW_INTERVAL_MS": "250", "RQ_EMQ_SWEEP_INTERVAL_MS": "500"}
#: where to save screenshots of the panel (docs/: `RQ_EMQ_SCREENSHOTS=docs pytest ...`)
SCREENSHOTS = os.environ.get("RQ_EMQ_SCREENSHOTS")


@pytest.fixture
def browser() -> Iterator[Any]:
    require("selenium")
    if not (os.path.exists(CHROMIUM) and os.path.exists(CHROMEDRIVER)):
        message = "Debian's chromium and chromium-driver are not installed (apt-get install them)"
        if in_ci():
            pytest.fail(f"{message}; CI (CI=true) must run this test")
        pytest.skip(message)
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--window-size=1400,1800",
    ):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=options)
    driver.set_page_load_timeout(30)
    try:
        yield driver
    finally:
        driver.quit()


def start_dashboard(procs: Processes, redis_url: str) -> str:
    port = free_port()
    cmd = [sys.executable, "-m", "rq_emq.cli", "dashboard", "--url", redis_url, "--bind", "127.0.0.1"]
    procs.start([*cmd, "--port", str(port), "--poll-interval", "1000"], env=procs.env(), name="dashboard")
    base = f"http://127.0.0.1:{port}"

    def up() -> bool:
        import urllib.request

        try:
            with urllib.request.urlopen(f"{base}/leases", timeout=2) as answer:
                return bool(answer.status == 200)
        except OSError:
            return False

    wait_for(up, timeout=30, what="the dashboard to serve")
    return base


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
        os.kill(worker.pid, signal.SIGKILL)
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
    assert cell(long.id, "attempt") == "1 of 3" and cell(long.id, "fencing-token") == "1"
    assert cell(stalled.id, "attempt") == "3 of 3" and cell(stalled.id, "fencing-token") == "3"
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
