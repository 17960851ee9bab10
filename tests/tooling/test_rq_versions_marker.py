"""The ``rq_versions`` marker: CI runs the whole suite under the newest RQ 3.x and, under the
newest RQ 2.x and RQ 2.0.0, only the tests it marks (``pytest -m rq_versions``,
docs/testing.md). Those must be the tests that go through what differs between RQ
releases: every name ``rq_emq/compat.py`` offers, and every test module that branches on the
installed RQ. A new difference absorbed in compat, or a new test that reads the RQ version,
fails here until the tests that reach it carry the marker."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
COMPAT = ROOT / "rq_emq" / "compat.py"
MARK = "rq_versions"

#: Each name rq_emq/compat.py offers, and the marked tests that go through it: a module
#: (every test of it marked) or one test (``path::name``, that test marked).
REACHED_BY: dict[str, list[str]] = {
    "resp2_callbacks": ["tests/fence/test_fenced_writes.py", "tests/fence/test_watched_commit.py"],
    "run_failure_callback": [
        "tests/lifecycle/test_rq_features_processes.py",  # a job failed by the sweep
        "tests/lifecycle/test_lifecycle.py",
        "tests/recover/test_sweep.py",
    ],
    "resolve_driver_info_once": ["tests/run/test_worker_costs.py"],
    "resolve_server_version_once": ["tests/run/test_worker_costs.py"],
    "execution_ids": [
        "tests/fence/test_fenced_writes.py",
        "tests/lifecycle/test_lifecycle_processes.py::test_a_refused_start_leaves_no_stale_execution_behind",
    ],
    "forget_executions": [
        "tests/fence/test_fenced_writes.py",
        "tests/lifecycle/test_lifecycle_processes.py::test_a_refused_start_leaves_no_stale_execution_behind",
    ],
    "execution_state": ["tests/run/test_fork_ahead.py"],
    "restore_execution_state": ["tests/run/test_fork_ahead.py"],
    "started_entry_ids": ["tests/recover/test_registries.py", "tests/recover/test_sweep.py"],
    "is_repeated_stop_signal": [
        "tests/run/test_worker_processes.py::test_a_cold_stop_hands_the_job_back_to_the_front_of_its_queue",
        "tests/run/test_worker_processes.py::test_worker_pool_runs_lease_workers",
    ],
    "spawn_worker_class": ["tests/run/test_worker_options.py", "tests/run/test_eviction_policy.py"],
    "drop_failure_callback": [
        "tests/run/test_job_lease.py::test_a_run_that_raised_lease_lost_runs_no_failure_callback",
        "tests/run/test_worker_direct.py",
    ],
    "record_result": ["tests/fence/test_fenced_writes.py", "tests/lifecycle/test_lifecycle.py"],
    "failure_ttl": ["tests/fence/test_fenced_writes.py", "tests/lifecycle/test_lifecycle.py"],
    "WORKER_NAMED_IN_LOGS": ["tests/run/test_worker_direct.py", "tests/run/test_worker_logs.py"],
    "RQ_SUCCESS_LINES": ["tests/run/test_worker_logs.py"],
    "RQ_HORSE_DIED_LINE": ["tests/recover/test_horse_crash.py"],
    "RQ_JOB_RAISED_LINE": ["tests/run/test_worker_logs.py"],
    "bootstrap_log_options": ["tests/run/test_worker_logs.py"],
    "RQ_MAJOR": ["tests/run/test_worker_options.py", "tests/run/test_worker_logs.py"],
    "SUCCESS_LOOP_RETRIES_WHOLE": ["tests/fence/test_watched_commit.py", "tests/run/test_worker_costs.py"],
    "schedule_in_the_callers_transaction": ["tests/lifecycle/test_rq_features_processes.py"],
    "ask_pubsub_thread_to_stop": [
        "tests/run/test_worker_processes.py::test_the_stop_job_command_stops_a_leased_job"
    ],
    "StopRequested": ["tests/run/test_worker_direct.py"],
    "WorkerStatus": ["tests/run/test_worker_processes.py::test_rq_semantics_hold_under_the_lease_worker"],
}


def offered_names(source: str) -> set[str]:
    """What compat offers: its public functions, its upper-case constants, its ``__all__``."""
    names: set[str] = set()
    for node in ast.parse(source).body:
        if isinstance(node, ast.FunctionDef) and not node.name.startswith("_"):
            names.add(node.name)
        targets = (
            node.targets
            if isinstance(node, ast.Assign)
            else [node.target]
            if isinstance(node, ast.AnnAssign)
            else []
        )
        for target in targets:
            if isinstance(target, ast.Name) and target.id == "__all__" and node.value is not None:
                names |= {elt.value for elt in ast.walk(node.value) if isinstance(elt, ast.Constant)}
            elif isinstance(target, ast.Name) and target.id.isupper() and not target.id.startswith("_"):
                names.add(target.id)
    return names


def _is_mark(node: ast.AST) -> bool:
    return any(isinstance(n, ast.Attribute) and n.attr == MARK for n in ast.walk(node))


def marks_of(source: str) -> tuple[bool, set[str]]:
    """(whether the module's ``pytestmark`` carries the marker, the tests decorated with it)."""
    module_marked, tests = False, set()
    for node in ast.parse(source).body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "pytestmark" for t in node.targets
        ):
            module_marked = module_marked or _is_mark(node.value)
        elif isinstance(node, ast.FunctionDef | ast.ClassDef) and any(
            _is_mark(d) for d in node.decorator_list
        ):
            tests.add(node.name)
    return module_marked, tests


def reads_the_rq_version(source: str) -> bool:
    """Whether a test module branches on the RQ installed: it uses rq_emq.compat or reads
    ``rq.__version__``."""
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and (
            node.module == "rq_emq.compat" or any(alias.name == "compat" for alias in node.names)
        ):
            return True
        if isinstance(node, ast.Import) and any(alias.name == "rq_emq.compat" for alias in node.names):
            return True
        if isinstance(node, ast.Attribute) and node.attr == "__version__":
            if isinstance(node.value, ast.Name) and node.value.id == "rq":
                return True
    return False


def test_every_name_compat_offers_is_gone_through_by_marked_tests() -> None:
    offered = offered_names(COMPAT.read_text())
    assert not offered - REACHED_BY.keys(), (
        f"rq_emq/compat.py offers {sorted(offered - REACHED_BY.keys())}: name the tests that go "
        "through each in REACHED_BY, and mark them rq_versions"
    )
    assert not REACHED_BY.keys() - offered, (
        f"REACHED_BY names what compat no longer has: {sorted(REACHED_BY.keys() - offered)}"
    )
    unmarked = []
    for name, targets in REACHED_BY.items():
        for target in targets:
            path, _, test = target.partition("::")
            module_marked, tests = marks_of((ROOT / path).read_text())
            if not (module_marked or (test and test in tests)):
                unmarked.append(f"{target} ({name})")
    assert not unmarked, f"not marked {MARK}: {unmarked}"


def test_every_test_module_that_reads_the_rq_version_has_marked_tests() -> None:
    unmarked = []
    for path in sorted((ROOT / "tests").rglob("test_*.py")):
        source = path.read_text()
        module_marked, tests = marks_of(source)
        if reads_the_rq_version(source) and not (module_marked or tests):
            unmarked.append(str(path.relative_to(ROOT)))
    assert not unmarked, (
        f"these test modules branch on the RQ version, and none of their tests is marked {MARK}: {unmarked}"
    )


def test_the_checks_above_see_a_missing_mark() -> None:
    """The readers that the checks above rest on tell marked from unmarked."""
    assert marks_of("pytestmark = pytest.mark.slow\ndef test_a(): pass\n") == (False, set())
    assert marks_of("pytestmark = [pytest.mark.slow, pytest.mark.rq_versions]\n") == (True, set())
    decorated = "@pytest.mark.parametrize('x', [1])\n@pytest.mark.rq_versions\ndef test_b(x): pass\n"
    assert marks_of(decorated) == (False, {"test_b"})
    assert reads_the_rq_version("import rq\nRQ_3 = int(rq.__version__[0]) >= 3\n")
    assert reads_the_rq_version("from rq_emq import compat\n")
    assert not reads_the_rq_version("import rq\nfrom rq_emq import scripts\n")
    assert "RQ_MAJOR" in offered_names("RQ_MAJOR: int = 3\ndef _private(): pass\ndef spawn(): pass\n")
    assert "_private" not in offered_names("def _private(): pass\n")


def test_the_marker_is_registered_and_ci_runs_it_under_each_rq_2_line() -> None:
    pytest_section = (
        (ROOT / "pyproject.toml").read_text().split("[tool.pytest.ini_options]")[1].split("\n[")[0]
    )
    assert re.search(rf'^\s*"{MARK}: ', pytest_section, re.M), (
        "the marker is not registered in pyproject.toml"
    )
    ci = (ROOT / ".ci" / "run").read_text()
    rq2_stages = re.findall(r"^\s*stage (tests-rq2\S*) suite .*$", ci, re.M)
    assert len(rq2_stages) == 2, rq2_stages
    for line in re.findall(r"^\s*stage tests-rq2\S* suite .*$", ci, re.M):
        assert f"-m {MARK}" in line, line


@pytest.mark.parametrize("target", sorted({t for targets in REACHED_BY.values() for t in targets}))
def test_each_test_reach_by_names_exists(target: str) -> None:
    path, _, test = target.partition("::")
    assert (ROOT / path).is_file(), path
    if test:
        assert re.search(rf"^def {re.escape(test)}\(", (ROOT / path).read_text(), re.M), target
