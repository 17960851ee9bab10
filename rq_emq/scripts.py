"""Loads the Lua scripts in ``lua/`` and runs them by EVALSHA.

Each script is one atomic operation. ``-- @include lib/<name>.lua`` lines are replaced by
that file's text, so shared Lua lives in one place; a file included twice in one script
(a script and a library it includes both need it) is pasted at its first include only.
Of a library, a script keeps only the definitions its own text reaches (by name, through
the definitions it keeps): Redis runs a script's whole chunk on every call, and defining
all of ``lib/`` each time cost some 40,000 Redis instructions a call, a tenth of a job's
script work. A script's SHA1 is computed here, so a call costs one EVALSHA; a server that
lost its script cache (restart, SCRIPT FLUSH) answers NOSCRIPT, and the script is loaded
and the call retried once.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Sequence
from functools import cache
from pathlib import Path
from typing import Any

from redis import Redis
from redis.client import Pipeline
from redis.exceptions import NoScriptError, ResponseError

_INCLUDE = re.compile(r"^-- @include (\S+)\s*$", re.MULTILINE)
#: Where a pasted library begins and ends in a resolved script (markers gone once pruned).
_LIBRARY = re.compile(r"^-- @library-begin\n(.*?)^-- @library-end\n", re.MULTILINE | re.DOTALL)
#: A library's top-level definition: ``local function <name>(`` or ``local <name> =``.
_DEFINITION = re.compile(r"^local (?:function )?([A-Za-z_]\w*)")
#: ``local a, b = ...``: two names in one statement, which pruning could not keep apart.
_SEVERAL_NAMES = re.compile(r"^local [A-Za-z_]\w*\s*,")
#: A function whose ``end`` closes it on its own first line (``local function f() end``).
_ONE_LINE_FUNCTION = re.compile(r"\bend\s*$")
_IDENTIFIER = re.compile(r"[A-Za-z_]\w*")


def lua_dir() -> Path:
    """The scripts' folder: inside the installed package, or ``lua/`` in a source checkout."""
    here = Path(__file__).resolve().parent
    for candidate in (here / "lua", here.parent / "lua"):
        if (candidate / "lib").is_dir():
            return candidate
    raise FileNotFoundError(f"rq_emq Lua scripts not found next to {here}")


class LuaScript:
    """One script: its source with includes resolved, and its SHA1."""

    def __init__(self, name: str, source: str) -> None:
        self.name = name
        self.source = source
        self.sha = hashlib.sha1(source.encode()).hexdigest()

    def __call__(self, client: Redis, keys: Sequence[str], args: Sequence[Any]) -> Any:
        try:
            return client.evalsha(self.sha, len(keys), *keys, *args)
        except NoScriptError:
            client.script_load(self.source)
            return client.evalsha(self.sha, len(keys), *keys, *args)

    def queue(self, pipe: Pipeline, keys: Sequence[str], args: Sequence[Any]) -> None:
        """Add this script to a pipeline; pair with :func:`is_noscript` on its reply."""
        pipe.execute_command("EVALSHA", self.sha, len(keys), *keys, *args)

    def load(self, client: Redis) -> None:
        client.script_load(self.source)


def is_noscript(reply: object) -> bool:
    return isinstance(reply, NoScriptError) or (
        isinstance(reply, ResponseError) and str(reply).startswith("NOSCRIPT")
    )


def _resolve(path: Path, root: Path, seen: tuple[Path, ...] = (), done: set[Path] | None = None) -> str:
    if path in seen:
        raise ValueError(f"include cycle through {path}")
    done = set() if done is None else done
    done.add(path)
    text = path.read_text()

    def include(match: re.Match[str]) -> str:
        included = root / match.group(1)
        if included in done:  # already pasted above: its locals are in scope
            return f"-- (included above: {match.group(1)})"
        pasted = _resolve(included, root, (*seen, path), done)
        # a library's own includes paste inside its markers: one span per library the script names
        return f"-- @library-begin\n{pasted}\n-- @library-end" if not seen else pasted

    return _INCLUDE.sub(include, text)


def _blocks(library: str) -> list[tuple[str | None, str]]:
    """A pasted library as its top-level pieces, in order: (name, text) for a definition
    (a function to its closing ``end``, a table to its closing ``}``), (None, text) for
    the comments, markers and blank lines between them."""
    pieces: list[tuple[str | None, str]] = []
    lines = library.splitlines(keepends=True)
    i = 0
    while i < len(lines):
        found = _DEFINITION.match(lines[i])
        if not found:
            pieces.append((None, lines[i]))
            i += 1
            continue
        if _SEVERAL_NAMES.match(lines[i]):
            raise ValueError(f"a library defines one name per statement: {lines[i].strip()!r}")
        if lines[i].startswith("local function ") and not _ONE_LINE_FUNCTION.search(lines[i]):
            end = _closing(lines, i, lambda line: line.rstrip("\n") == "end")
        elif lines[i].count("{") > lines[i].count("}"):
            end = _closing(lines, i, lambda line: line.startswith("}"))
        else:
            end = i
        pieces.append((found.group(1), "".join(lines[i : end + 1])))
        i = end + 1
    return pieces


def _closing(lines: list[str], start: int, closes: Callable[[str], bool]) -> int:
    """The line that closes the definition opening at ``start`` (its ``end`` or ``}`` at the
    start of a line, as every library writes them)."""
    for at in range(start + 1, len(lines)):
        if closes(lines[at]):
            return at
    raise ValueError(f"a library definition is never closed at the start of a line: {lines[start].strip()!r}")


def _prune(source: str) -> str:
    """``source`` with each library definition that nothing kept names left out: the
    script's own text names what it uses, and a kept definition what it uses in turn (a
    name met in a comment keeps a definition too: never one too few)."""
    libraries = [_blocks(match.group(1)) for match in _LIBRARY.finditer(source)]
    defined: dict[str, str] = {}
    for pieces in libraries:
        for name, text in pieces:
            if name is not None:
                if name in defined:
                    raise ValueError(f"{name} is defined twice in the libraries a script includes")
                defined[name] = text
    kept: set[str] = set()
    pending = set(_IDENTIFIER.findall(_LIBRARY.sub("", source))) & defined.keys()
    while pending:
        name = pending.pop()
        kept.add(name)
        pending |= (set(_IDENTIFIER.findall(defined[name])) & defined.keys()) - kept
    rebuilt = iter(
        "".join(text for name, text in pieces if name is None or name in kept) for pieces in libraries
    )
    return _LIBRARY.sub(lambda _: next(rebuilt), source)


@cache
def load(name: str) -> LuaScript:
    """The script ``lua/<name>-<keys>.lua`` (e.g. ``load("claim_job")``)."""
    root = lua_dir()
    matches = sorted(root.glob(f"{name}-*.lua"))
    if len(matches) != 1:
        raise FileNotFoundError(f"expected exactly one lua/{name}-<keys>.lua, found {matches}")
    return LuaScript(name, _prune(_resolve(matches[0], root)))


def load_all(client: Redis) -> None:
    """Load every script Redis does not have yet (workers do this at startup). One ``SCRIPT
    EXISTS`` asks for all of them first: a worker starting beside others (a deploy, a pool)
    would otherwise send every source again (some 600 KB) for Redis to hash once more."""
    every = [load(path.stem.rsplit("-", 1)[0]) for path in sorted(lua_dir().glob("*-*.lua"))]
    present = client.script_exists(*(script.sha for script in every))
    missing = [script for script, there in zip(every, present, strict=True) if not there]
    if missing:
        with client.pipeline(transaction=False) as pipe:
            for script in missing:
                pipe.script_load(script.source)
            pipe.execute()
