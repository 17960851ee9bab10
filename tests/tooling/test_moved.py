"""The old import paths of the modules that moved into rooms (issue 23) still give the
same module objects, for one release: docs/migrating.md."""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest

import rq_emq
from rq_emq._moved import MOVED


@pytest.mark.parametrize("old", sorted(MOVED))
def test_an_old_path_is_the_moved_module_itself(old: str) -> None:
    new = importlib.import_module(f"rq_emq.{MOVED[old]}")
    with pytest.warns(DeprecationWarning, match=f"rq_emq.{old} moved to rq_emq.{MOVED[old]}"):
        sys.modules.pop(f"rq_emq.{old}", None)
        assert importlib.import_module(f"rq_emq.{old}") is new
    assert getattr(rq_emq, old) is new


def test_a_patch_through_an_old_path_reaches_the_code(monkeypatch: pytest.MonkeyPatch) -> None:
    from rq_emq.intake import take

    monkeypatch.setattr("rq_emq.take.AT_ONCE_S", 0.125)
    assert take.AT_ONCE_S == 0.125


def test_python_m_of_an_old_path_runs_the_moved_module() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "rq_emq.cli", "--version"], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"rq-emq, version {rq_emq.__version__}"


def test_an_unknown_attribute_is_still_an_error() -> None:
    with pytest.raises(AttributeError):
        rq_emq.no_such_module  # noqa: B018
