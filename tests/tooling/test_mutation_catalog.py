"""The mutation catalog stays applicable as the code moves: each mutation's anchor is in its
file exactly once, and each names tests that exist. (CI runs the fast subset; a mutation
whose anchor is gone would otherwise be found only there, as an error, not a survivor.)"""

from __future__ import annotations

from pathlib import Path

from mutations.catalog import CATALOG, by_name

ROOT = Path(__file__).resolve().parents[2]


def test_each_mutation_applies_to_exactly_one_place_and_names_tests_that_exist() -> None:
    wrong = []
    for mutation in CATALOG:
        text = (ROOT / mutation.file).read_text()
        if text.count(mutation.original) != 1:
            wrong.append(
                f"{mutation.name}: its anchor is in {mutation.file} {text.count(mutation.original)} times"
            )
        for test in mutation.tests:
            path, _, name = test.partition("::")
            found = (ROOT / path).exists() and (
                not name or f"def {name.split('[')[0]}(" in (ROOT / path).read_text()
            )
            if not found:
                wrong.append(f"{mutation.name}: no test {test}")
    assert wrong == []


def test_mutation_names_are_unique() -> None:
    assert len(by_name()) == len(CATALOG)
