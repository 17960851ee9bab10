"""One run of RQ's suite: private redis-servers (one per xdist worker, since RQ's tests
pick "the first empty database" and flush it, which two processes sharing a server would
race on), and pytest in the sdist's directory with ``hook/`` first on ``PYTHONPATH``."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from rq_emq.testing import RedisServer

HOOK = Path(__file__).with_name("hook")
#: RQ's tests look for an empty database from 4 to 16
DATABASES = ("--databases", "17")


def run_suite(
    sdist: Path,
    workers: str,
    processes: int,
    log: Path,
    timeout: float,
    select: Sequence[str] = (),
    extra: Sequence[str] = (),
) -> dict[str, dict[str, str]]:
    """Runs RQ's tests (all of them, the node ids in ``select``, or what the pytest
    arguments ``extra`` select) with ``workers`` (``stock`` or ``ours``), pytest's output
    in ``log``, for at most ``timeout`` seconds; returns each test's outcome."""
    names = [f"gw{i}" for i in range(processes)] if processes > 1 else []
    servers = {name: RedisServer(extra_args=DATABASES).start() for name in ["-", *names]}
    report = Path(tempfile.mkstemp(prefix=f"rqsuite-{workers}-", suffix=".json")[1])
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(HOOK), *filter(None, [os.environ.get("PYTHONPATH")])]),
        # RQ's tests run `rq worker` and `rqworker` as commands
        "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]),
        "RQSUITE_REDIS_PORTS": ",".join(f"{name}={server.port}" for name, server in servers.items()),
        "RQSUITE_WORKERS": workers,
        "RQSUITE_REPORT": str(report),
    }
    env.pop("REDIS_URL", None)
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "rqsuite_report"]
    command += ["--rootdir", str(sdist), "-c", str(pytest_config(sdist))]
    if processes > 1:
        command += ["-p", "xdist", "-n", str(processes)]
    command += [*select] if select else [*extra] if extra else ["tests"]
    started = time.monotonic()
    try:
        with log.open("w") as output:
            # its own session: a pass that outlives its timeout is killed with all it started
            process = subprocess.Popen(
                command, cwd=sdist, env=env, stdout=output, stderr=subprocess.STDOUT, start_new_session=True
            )
            try:
                process.wait(timeout)
            except subprocess.TimeoutExpired:
                print(f"  {workers}: stopped after {timeout:.0f} s; tests that had not ended count as failed")
            finally:
                if process.poll() is None:  # timed out, or this runner was told to stop
                    os.killpg(process.pid, signal.SIGKILL)
                    process.wait()
        outcomes = fold(report.read_text().splitlines())
    finally:
        report.unlink(missing_ok=True)
        for server in servers.values():
            server.stop()
    print(
        f"  {workers}: {len(outcomes)} tests in {time.monotonic() - started:.0f} s (log: {log})", flush=True
    )
    return outcomes


def fold(lines: list[str]) -> dict[str, dict[str, str]]:
    """Each test's outcome from its phases' report lines (hook/rqsuite_report.py):
    ``failed`` if its call failed, ``error`` if its setup or teardown did, else ``skipped``
    or ``passed``."""
    outcomes: dict[str, dict[str, str]] = {}
    for raw in lines:
        line = json.loads(raw)
        entry = outcomes.setdefault(line["node"], {"outcome": "passed", "why": ""})
        if entry["outcome"] in ("failed", "error"):
            continue
        if line["outcome"] == "failed":
            entry.update(outcome="failed" if line["when"] == "call" else "error", why=line["why"])
        elif line["outcome"] == "skipped":
            entry["outcome"] = "skipped"
    return outcomes


def pytest_config(sdist: Path) -> Path:
    """RQ's own pytest configuration, so that none found above the sdist (rq-emq's, when
    the cache is inside the checkout) applies: its pyproject.toml where that has the
    section, else its tox.ini (every release has one)."""
    pyproject = sdist / "pyproject.toml"
    if pyproject.is_file() and "[tool.pytest.ini_options]" in pyproject.read_text():
        return pyproject
    return sdist / "tox.ini"
