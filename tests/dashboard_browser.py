"""What the browser tests of ``rq-emq dashboard`` share: Debian's headless Chromium, driven
by Selenium through Debian's chromedriver (nothing is downloaded), and the dashboard itself
as a real ``rq-emq dashboard`` process. Names under ``.test`` resolve to 127.0.0.1 in that
browser, so a test can serve another site's page, or point a foreign name at the
dashboard, without leaving this host."""

from __future__ import annotations

import os
import shutil
import sys
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from integration_scenarios import require
from procs import Processes, wait_for
from redis_server import in_ci

from rq_emq.testing import free_port

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMEDRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"


@contextmanager
def chromium() -> Iterator[Any]:
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
        "--host-resolver-rules=MAP *.test 127.0.0.1",
    ):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=options)
    driver.set_page_load_timeout(30)
    try:
        yield driver
    finally:
        driver.quit()


def start_dashboard(
    procs: Processes, redis_url: str, *args: str, env: dict[str, str] | None = None, auth: str | None = None
) -> str:
    """A real ``rq-emq dashboard`` on a free loopback port (more options in ``args``); its
    base URL once it serves (``auth``: ``user:password`` for its basic auth)."""
    port = free_port()
    cmd = [sys.executable, "-m", "rq_emq.operate.cli", "dashboard", "--url", redis_url, "--bind", "127.0.0.1"]
    procs.start(
        [*cmd, "--port", str(port), "--poll-interval", "1000", *args],
        env={**procs.env(), **(env or {})},
        name="dashboard",
    )
    base = f"http://127.0.0.1:{port}"

    def up() -> bool:
        request = urllib.request.Request(f"{base}/leases")
        if auth:
            import base64

            request.add_header("Authorization", "Basic " + base64.b64encode(auth.encode()).decode())
        try:
            with urllib.request.urlopen(request, timeout=2) as answer:
                return bool(answer.status == 200)
        except OSError:
            return False

    wait_for(up, timeout=30, what="the dashboard to serve")
    return base
