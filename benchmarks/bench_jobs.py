"""Jobs the benchmarks enqueue (benchmarks/ is on the workers' PYTHONPATH)."""

from __future__ import annotations


def noop() -> None:
    return None
