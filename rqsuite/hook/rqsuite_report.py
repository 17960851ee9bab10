"""A pytest plugin (``-p rqsuite_report``) that writes each test's outcome, by node id, to
the JSON file named by ``RQSUITE_REPORT`` when the session ends: ``passed``, ``failed``
(the test's call failed), ``error`` (its setup or teardown failed) or ``skipped``, with
the first line of the failure. Under xdist the controller sees every worker's reports, so
one file holds the whole run."""

from __future__ import annotations

import json
import os
from typing import Any

_outcomes: dict[str, dict[str, str]] = {}


def pytest_runtest_logreport(report: Any) -> None:
    entry = _outcomes.setdefault(report.nodeid, {"outcome": "passed", "why": ""})
    if report.failed:
        if entry["outcome"] not in ("failed", "error"):
            entry["outcome"] = "failed" if report.when == "call" else "error"
            crash = getattr(report.longrepr, "reprcrash", None)
            entry["why"] = (crash.message if crash else str(report.longrepr)).strip().splitlines()[0][:300]
    elif report.skipped and entry["outcome"] == "passed":
        entry["outcome"] = "skipped"


def pytest_sessionfinish(session: Any) -> None:
    path = os.environ.get("RQSUITE_REPORT")
    if path and not hasattr(session.config, "workerinput"):  # the controller (or a serial run)
        with open(path, "w") as file:
            json.dump(_outcomes, file, indent=1, sort_keys=True)
