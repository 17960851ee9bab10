"""Loads the Lua scripts in ``lua/`` and runs them by EVALSHA.

Each script is one atomic operation. ``-- @include lib/<name>.lua`` lines are replaced by
that file's text, so shared Lua lives in one place; a file included twice in one script
(a script and a library it includes both need it) is pasted at its first include only. A
script's SHA1 is computed here, so a call costs one EVALSHA; a server that lost its script
cache (restart, SCRIPT FLUSH) answers NOSCRIPT, and the script is loaded and the call
retried once.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence
from functools import cache
from pathlib import Path
from typing import Any

from redis import Redis
from redis.client import Pipeline
from redis.exceptions import NoScriptError, ResponseError

_INCLUDE = re.compile(r"^-- @include (\S+)\s*$", re.MULTILINE)


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
        return _resolve(included, root, (*seen, path), done)

    return _INCLUDE.sub(include, text)


@cache
def load(name: str) -> LuaScript:
    """The script ``lua/<name>-<keys>.lua`` (e.g. ``load("claim_job")``)."""
    root = lua_dir()
    matches = sorted(root.glob(f"{name}-*.lua"))
    if len(matches) != 1:
        raise FileNotFoundError(f"expected exactly one lua/{name}-<keys>.lua, found {matches}")
    return LuaScript(name, _resolve(matches[0], root))


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
