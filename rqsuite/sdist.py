"""The installed rq's sdist, downloaded with pip into the cache and extracted once."""

from __future__ import annotations

import subprocess
import sys
import tarfile
from pathlib import Path


def installed_rq_version() -> str:
    import rq

    return str(rq.__version__)


def extracted_sdist(version: str, cache: Path) -> Path:
    """The directory holding rq ``version``'s extracted sdist (its ``tests/`` inside)."""
    target = cache / f"rq-{version}"
    if (target / "tests" / "__init__.py").is_file():
        return target
    cache.mkdir(parents=True, exist_ok=True)
    archive = cache / f"rq-{version}.tar.gz"
    if not archive.is_file():
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-binary", ":all:"]
            + ["-d", str(cache), f"rq=={version}"],
            check=True,
        )
    with tarfile.open(archive) as tar:
        tar.extractall(cache, filter="data")
    if not (target / "tests" / "__init__.py").is_file():
        raise RuntimeError(f"{archive} has no tests/ (expected {target / 'tests'})")
    return target
