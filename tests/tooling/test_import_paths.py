"""The modules' paths from before the rooms are gone: no release had them (0.1.0 was never
published), so nothing keeps them answering (docs/migrating.md lists the new ones)."""

from __future__ import annotations

import importlib
import subprocess
import sys
from pathlib import Path

import pytest

import rq_emq

OLD_PATHS = ("rq_emq.sweep", "rq_emq.take", "rq_emq.cli", "rq_emq.failover", "rq_emq.testing_sentinel")


@pytest.mark.parametrize("old", OLD_PATHS)
def test_an_old_path_fails_like_any_missing_module(old: str) -> None:
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module(old)
    with pytest.raises(AttributeError):
        getattr(rq_emq, old.split(".", 1)[1])


def test_the_cli_runs_from_its_room_and_not_from_the_old_path() -> None:
    assert not (Path(rq_emq.__file__).parent / "_moved.py").exists()
    new = subprocess.run(
        [sys.executable, "-m", "rq_emq.operate.cli", "--version"], capture_output=True, text=True, timeout=60
    )
    assert new.returncode == 0 and rq_emq.__version__ in new.stdout, new.stderr
    old = subprocess.run([sys.executable, "-m", "rq_emq.cli"], capture_output=True, text=True, timeout=60)
    assert old.returncode != 0 and "No module named rq_emq.cli" in old.stderr, old.stderr
