"""README's demo command works as documented."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from procs import TESTS_DIR

pytestmark = pytest.mark.slow


def test_the_crash_demo_recovers_the_killed_workers_job(redis_url: str) -> None:
    done = subprocess.run(
        [
            sys.executable,
            str(TESTS_DIR.parent / "examples" / "crash_demo.py"),
            "--jobs",
            "3",
            "--seconds",
            "2",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "REDIS_URL": redis_url},
    )
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    for step in ("SIGKILLed worker-a", "lock gone", "marked stalled", "back at the front of its queue"):
        assert step in out, out
    stalled_rows = [line for line in out.splitlines() if " yes " in line]
    assert len(stalled_rows) == 1 and " 2 " in stalled_rows[0] and "finished" in stalled_rows[0], out
