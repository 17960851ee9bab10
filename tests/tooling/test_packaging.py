"""The built wheel works on its own: it carries the Lua scripts and runs a job."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import redis
from procs import TESTS_DIR
from rq import Queue

pytestmark = pytest.mark.slow
ROOT = TESTS_DIR.parent


def run(*args: str, **kwargs: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, check=True, capture_output=True, text=True, timeout=600, **kwargs)  # type: ignore[call-overload]


def test_the_wheel_installed_in_a_fresh_venv_finds_its_lua_and_runs_a_job(
    r: redis.Redis, redis_url: str, tmp_path: Path
) -> None:
    dist = tmp_path / "dist"
    run(sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(dist), str(ROOT))
    (wheel,) = dist.glob("rq_emq-*.whl")
    venv = tmp_path / "venv"
    run(sys.executable, "-m", "venv", str(venv))
    run(str(venv / "bin" / "pip"), "install", "-q", str(wheel))

    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    where = run(
        str(venv / "bin" / "python"),
        "-c",
        "import rq_emq, rq_emq.scripts as s; print(rq_emq.__file__); print(s.lua_dir())",
        cwd=str(tmp_path),
        env=env,
    ).stdout.split()
    assert all(path.startswith(str(venv)) for path in where), where
    assert "rq-emq" in run(str(venv / "bin" / "rq-emq"), "--version", env=env).stdout

    job = Queue(connection=r).enqueue("jobs.add", 2, 3)
    run(
        str(venv / "bin" / "rq"),
        "worker",
        "-w",
        "rq_emq.LeaseWorker",
        "--burst",
        "--url",
        redis_url,
        cwd=str(tmp_path),
        env={**env, "PYTHONPATH": str(TESTS_DIR)},
    )
    assert job.latest_result().return_value == 5  # type: ignore[union-attr]
    assert r.hget("emq:{default}:stats", "taken") == b"1"
