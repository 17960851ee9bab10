"""The soak's verdict: the counts, violations and latency that every check writes into, and
whether a violation fails the run (``--worker lease``) or is only reported (``--worker
stock``, the baseline)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class Verdict:
    counts: dict[str, Any] = field(default_factory=dict)
    violations: list[str] = field(default_factory=list)
    latency: dict[str, Any] = field(default_factory=dict)
    #: False for the stock baseline: its violations are reported, not failed on
    enforced: bool = True

    @property
    def passed(self) -> bool:
        return not (self.enforced and self.violations)
