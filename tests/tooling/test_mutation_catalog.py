"""The mutation catalog stays applicable as the code moves: each mutation's anchor is in its
file exactly once, and each names tests that exist. (CI runs the fast subset; a mutation
whose anchor is gone would otherwise be found only there, as an error, not a survivor.)"""

from __future__ import annotations

from pathlib import Path

import pytest

from mutations.catalog import CATALOG, by_name

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("mutation", CATALOG, ids=lambda m: m.name)
def test_each_mutation_applies_to_exactly_one_place(mutation: object) -> None:
    text = (ROOT / mutation.file).read_text()  # type: ignore[attr-defined]
    assert text.count(mutation.original) == 1, (mutation.file, mutation.original)  # type: ignore[attr-defined]
    for test in mutation.tests:  # type: ignore[attr-defined]
        path, _, name = test.partition("::")
        assert (ROOT / path).exists(), test
        assert not name or f"def {name.split('[')[0]}(" in (ROOT / path).read_text(), test


def test_mutation_names_are_unique() -> None:
    assert len(by_name()) == len(CATALOG)
