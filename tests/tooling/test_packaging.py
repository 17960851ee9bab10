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


def test_the_wheel_and_the_sdist_carry_the_license_and_the_sdist_the_docs_readme_links(
    tmp_path: Path,
) -> None:
    """LICENSE (BSD-2-Clause, as pyproject declares) in both archives; every file README
    links to (docs/, examples/) in the sdist, whose README would otherwise point nowhere."""
    import re
    import tarfile
    import zipfile

    dist = tmp_path / "dist"
    run(sys.executable, "-m", "build", "-q", "--sdist", "--wheel", "-o", str(dist), str(ROOT))
    (wheel,) = dist.glob("rq_emq-*.whl")
    (sdist,) = dist.glob("rq_emq-*.tar.gz")
    license_text = (ROOT / "LICENSE").read_text()
    assert "BSD 2-Clause License" in license_text and "rq-emq contributors" in license_text

    with zipfile.ZipFile(wheel) as archive:
        licenses = [name for name in archive.namelist() if name.endswith(".dist-info/licenses/LICENSE")]
        assert len(licenses) == 1, archive.namelist()
        assert archive.read(licenses[0]).decode() == license_text

    with tarfile.open(sdist) as archive:
        top = archive.getnames()[0].split("/", 1)[0]
        names = {name.split("/", 1)[1] for name in archive.getnames() if "/" in name}
        member = archive.extractfile(f"{top}/LICENSE")
        assert member is not None and member.read().decode() == license_text
    linked = {
        target.split("#", 1)[0]
        for target in re.findall(r"\]\(([^)#:]+(?:#[^)]*)?)\)", (ROOT / "README.md").read_text())
        if not target.startswith("#")
    }
    assert any(target.startswith("docs/") for target in linked), linked
    assert linked <= names, sorted(linked - names)
    assert {f"docs/{path.name}" for path in (ROOT / "docs").glob("*.md")} <= names
