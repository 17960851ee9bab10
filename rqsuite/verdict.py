"""The allowlist and the comparison of a run with the stock baseline.

``allowlist.txt`` holds sections (``[name]``), one test node id a line followed by
`` -- why``. Section ``white-box`` lists tests that assert RQ internals rq-emq replaces by
design; any other section lists tests expected to fail until the named issue item lands.
A test failing ours that passed stock, and is in no section, fails the run."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

ALLOWLIST = Path(__file__).with_name("allowlist.txt")
WHITE_BOX = "white-box"


def read_allowlist(path: Path = ALLOWLIST) -> dict[str, tuple[str, str]]:
    """node id -> (section, why)."""
    entries: dict[str, tuple[str, str]] = {}
    section = ""
    for number, raw in enumerate(path.read_text().splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("[") and line.endswith("]"):
            section = line[1:-1]
            continue
        node, sep, why = line.partition(" -- ")
        if not sep or not why.strip() or not section:
            raise ValueError(f"{path}:{number}: want '<node id> -- <why>' inside a [section]")
        entries[node.strip()] = (section, why.strip())
    return entries


@dataclass
class Verdict:
    stock_passed: set[str]
    ours_passed: set[str]
    allowed: dict[str, str] = field(default_factory=dict)  # node -> section
    failed: dict[str, str] = field(default_factory=dict)  # node -> symptom
    stale: list[str] = field(default_factory=list)  # listed, yet passes ours

    def summary(self) -> str:
        white = sum(1 for section in self.allowed.values() if section == WHITE_BOX)
        pending = len(self.allowed) - white
        return (
            f"stock passed {len(self.stock_passed)}, ours passed {len(self.ours_passed)}, "
            f"white-box allowed {white}, expected until their issue item lands {pending}, "
            f"failed {len(self.failed)}"
        )


def judge(
    stock: dict[str, dict[str, str]], ours: dict[str, dict[str, str]], allowlist: dict[str, tuple[str, str]]
) -> Verdict:
    stock_passed = {node for node, entry in stock.items() if entry["outcome"] == "passed"}
    ours_passed = {node for node, entry in ours.items() if entry["outcome"] == "passed"}
    verdict = Verdict(stock_passed, ours_passed & stock_passed)
    for node in sorted(stock_passed - ours_passed):
        if node in allowlist:
            verdict.allowed[node] = allowlist[node][0]
        else:
            entry = ours.get(node, {"outcome": "missing", "why": "not run"})
            verdict.failed[node] = f"{entry['outcome']}: {entry['why']}"
    verdict.stale = sorted(node for node in allowlist if node in ours_passed)
    return verdict
