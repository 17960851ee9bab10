"""How a script is put together from ``lua/``: its includes pasted once each, and of each
library only the definitions the script's text reaches (rq_emq/scripts.py)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import redis

from rq_emq import scripts

LIBRARY = """-- lib/tools.lua: a test library
-- @include lib/base.lua

local function inner(x)
  return x * LIMIT
end

-- used by the script, and uses `inner`
local function outer(x)
  return inner(x) + 1
end

-- nothing names this one
local function unused()
  return 'never'
end

local KINDS = {
  'a',
  'b',
}
"""
BASE = """-- lib/base.lua
local LIMIT = 10
local SPARE = {'x', 'y'}
"""
SCRIPT = """--[[ a script: KEYS none ]]
-- @include lib/tools.lua

local n = outer(tonumber(ARGV[1]))
return {n, #KINDS}
"""


def _defined(source: str) -> list[str]:
    return re.findall(r"^local (?:function )?(\w+)", source, re.MULTILINE)


def _write(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)


def test_a_script_keeps_the_library_definitions_its_text_reaches_and_no_other(tmp_path: Path) -> None:
    _write(tmp_path, {"lib/tools.lua": LIBRARY, "lib/base.lua": BASE, "do_it-0.lua": SCRIPT})
    source = scripts._prune(scripts._resolve(tmp_path / "do_it-0.lua", tmp_path))
    # outer is named by the script, inner and LIMIT through it (from a nested include), KINDS too
    assert _defined(source) == ["LIMIT", "inner", "outer", "KINDS", "n"]
    assert "never" not in source and "SPARE" not in source
    assert "@library" not in source  # the markers are gone
    assert source.index("local LIMIT") < source.index("local function inner")  # order kept


def test_a_name_defined_in_two_included_libraries_is_refused(tmp_path: Path) -> None:
    _write(
        tmp_path,
        {
            "lib/tools.lua": LIBRARY,
            "lib/base.lua": BASE + "local function unused() end\n",
            "do_it-0.lua": SCRIPT,
        },
    )
    with pytest.raises(ValueError, match="unused is defined twice"):
        scripts._prune(scripts._resolve(tmp_path / "do_it-0.lua", tmp_path))


def test_a_one_line_function_is_a_definition_of_its_own(tmp_path: Path) -> None:
    """``local function f() end`` closes on its own line: the definitions after it stay
    apart (read as one, they would be kept or dropped with it)."""
    library = "local function nothing() end\n" + LIBRARY.replace("-- @include lib/base.lua\n", "")
    _write(tmp_path, {"lib/tools.lua": library, "lib/base.lua": BASE, "do_it-0.lua": SCRIPT})
    source = scripts._prune(scripts._resolve(tmp_path / "do_it-0.lua", tmp_path))
    assert "local function nothing" not in source
    assert "local function inner" in source and "local function outer" in source


def test_a_definition_pruning_cannot_read_is_refused(tmp_path: Path) -> None:
    for library, why in [
        ("local A, B = 1, 2\n", "one name per statement"),
        ("local function open()\n  return 1\n", "never closed"),
    ]:
        _write(tmp_path, {"lib/tools.lua": library, "do_it-0.lua": "-- @include lib/tools.lua\nreturn A\n"})
        with pytest.raises(ValueError, match=why):
            scripts._prune(scripts._resolve(tmp_path / "do_it-0.lua", tmp_path))


def test_a_pruned_script_runs_as_the_whole_one_does(r: redis.Redis, tmp_path: Path) -> None:
    _write(tmp_path, {"lib/tools.lua": LIBRARY, "lib/base.lua": BASE, "do_it-0.lua": SCRIPT})
    whole = scripts._resolve(tmp_path / "do_it-0.lua", tmp_path)
    pruned = scripts._prune(whole)
    assert len(pruned) < len(whole)
    assert r.eval(pruned, 0, 4) == r.eval(whole, 0, 4) == [41, 2]


@pytest.mark.parametrize("path", sorted(scripts.lua_dir().glob("*-*.lua")), ids=lambda p: p.stem)
def test_every_script_compiles_as_sent_and_defines_only_what_it_reaches(r: redis.Redis, path: Path) -> None:
    script = scripts.load(path.stem.rsplit("-", 1)[0])
    assert r.script_load(script.source) == script.sha
    whole = scripts._resolve(path, scripts.lua_dir())
    # every definition left is one the whole script had; none of lib/ is pasted twice
    kept = _defined(script.source)
    assert set(kept) <= set(_defined(whole)) and len(kept) == len(set(kept))
