"""A pytest plugin (``-p rqsuite_report``) for RQ-suite runs.

It appends each test phase's outcome, as a JSON line, to the file named by
``RQSUITE_REPORT`` as it happens (so a run cut short by the runner's timeout still says
what ran): node id, phase, ``passed``/``failed``/``skipped`` and the first line of a
failure. Under xdist only the controller writes; it sees every worker's reports.

At the end of a session it also kills the processes RQ's tests forked and left running (a
worker-pool test that fails before its ``stop_workers()`` leaves workers that would keep
pytest waiting at exit forever, stock or ours alike).
"""

from __future__ import annotations

import json
import multiprocessing
import os
from typing import Any

_config: Any = None


def pytest_configure(config: Any) -> None:
    global _config
    _config = config


def pytest_runtest_logreport(report: Any) -> None:
    path = os.environ.get("RQSUITE_REPORT")
    if not path or hasattr(_config, "workerinput"):
        return
    why = ""
    if report.failed:
        crash = getattr(report.longrepr, "reprcrash", None)
        text = (crash.message if crash else str(report.longrepr)).strip()
        why = (text.splitlines() or [""])[0][:300]
    line = {"node": report.nodeid, "when": report.when, "outcome": report.outcome, "why": why}
    with open(path, "a") as file:
        file.write(json.dumps(line) + "\n")


def pytest_sessionfinish(session: Any) -> None:
    for child in multiprocessing.active_children():
        child.kill()
        child.join(5)
