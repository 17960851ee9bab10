"""README's demo commands work as documented."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest
import redis
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


def narration(out: str) -> list[tuple[float, str]]:
    """The demo's timestamped lines: ``[  3.90s] text``."""
    lines = []
    for line in out.splitlines():
        if line.startswith("[") and "s] " in line:
            stamp, text = line[1:].split("s] ", 1)
            lines.append((float(stamp), text))
    return lines


def test_each_line_of_the_crash_demos_narration_is_true_and_its_waits_explained(redis_url: str) -> None:
    """The line where worker-b takes the job shows it started (not `queued`), and a job
    recovered into its queue is followed by what the survivor is doing (still running
    another job, or none), so no wait before the take reads as a hang, however long a
    loaded host makes it. A killed worker-a of an earlier run (its registration outlives
    it) does not stop the demo."""
    client = redis.Redis.from_url(redis_url)
    client.hset("rq:worker:worker-a", mapping={"state": "busy", "queues": "demo"})
    client.expire("rq:worker:worker-a", 420)
    client.sadd("rq:workers", "rq:worker:worker-a")
    client.sadd("rq:workers:demo", "rq:worker:worker-a")
    done = subprocess.run(
        [
            sys.executable,
            str(TESTS_DIR.parent / "examples" / "crash_demo.py"),
            "--jobs",
            "4",
            "--seconds",
            "3",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "REDIS_URL": redis_url},
    )
    assert done.returncode == 0, done.stdout + done.stderr
    lines = narration(done.stdout)
    texts = [text for _, text in lines]
    assert not any("status=queued, in flight=True" in text for text in texts), done.stdout
    taken = next(i for i, text in enumerate(texts) if text.startswith("worker-b started it"))
    assert "status=started, in flight=True" in texts[taken + 1] and "attempts=2" in texts[taken + 1]
    recovered = next(i for i, text in enumerate(texts) if text.startswith("recovered by the next sweep"))
    if "in queue=True" in texts[recovered + 1]:  # waiting for worker-b: the demo says why
        assert any("worker-b" in text and "takes it next" in text for text in texts[recovered:taken]), (
            done.stdout
        )


def test_double_recovery_naive_checkers_recover_every_job_twice_the_sweep_once(redis_url: str) -> None:
    done = subprocess.run(
        [
            sys.executable,
            str(TESTS_DIR.parent / "examples" / "double_recovery.py"),
            "--trials",
            "2",
            "--jobs",
            "20",
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=180,
        env={**os.environ, "REDIS_URL": redis_url},
    )
    assert done.returncode == 0, done.stdout + done.stderr
    result = json.loads(done.stdout)
    assert len(result["naive"]) == len(result["atomic"]) == 2
    # two checkers that both checked before either wrote: every job twice in the queue, counted twice
    for row in result["naive"]:
        assert row["stalled"] == row["duplicates"] == row["wrong_attempts"] == 20, row
        assert row["recoveries"] == row["queue_after"] == 40, row
    # two sweepers in lockstep: each job back once, its attempt count untouched by the recovery
    for row in result["atomic"]:
        assert row["stalled"] == row["recoveries"] == row["queue_after"] == 20, row
        assert row["duplicates"] == row["wrong_attempts"] == 0, row
        assert row["by_first"] + row["by_second"] == 20, row
    assert result["atomic_ok"] and result["naive_showed"]
    leftovers = redis.Redis.from_url(redis_url).keys("*double-recovery-*")
    assert leftovers == [], leftovers


def test_the_fenced_effects_example_refuses_both_writes_of_the_stale_run(redis_url: str) -> None:
    """examples/fenced_effects.py: the run that a freeze made stale writes nothing, in SQL
    (its token is older than the one stored) nor in Redis (its fenced pipeline is refused);
    the newer run's writes stand."""
    done = subprocess.run(
        [sys.executable, str(TESTS_DIR.parent / "examples" / "fenced_effects.py")],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "REDIS_URL": redis_url},
    )
    assert done.returncode == 0, done.stdout + done.stderr
    tokens = sorted({int(t) for t in re.findall(r"\(fencing token (\d+)\)", done.stdout)})
    assert len(tokens) == 2, done.stdout  # the stale run's, then the newer run's (higher)
    stale, newer = tokens
    assert f"(fencing token {stale}): SQL update: 0 row(s)" in done.stdout
    assert f"(fencing token {stale}): Redis fenced pipeline: refused" in done.stdout
    assert f"(fencing token {newer}): Redis fenced pipeline: written" in done.stdout
    assert f"fence_token={newer}" in done.stdout and "charges=1" in done.stdout
