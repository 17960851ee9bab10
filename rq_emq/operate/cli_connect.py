"""How the ``rq-emq`` commands reach Redis and read their input: RQ's connection
conventions (``--url``, ``-c settings``, ``REDIS_URL``), the lease settings, the queues
named (and which of them nobody knows), the jobs' serializer. Bad input raises
:class:`BadInput` (exit 2) naming it, a Redis that wants a password not given (or refuses
the one given) included; an unreachable Redis exits 1 naming the URL, password redacted,
unless the command waits for it (``connect(wait=...)``: the reaper at its start).
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import click
from redis import Redis
from redis.exceptions import AuthenticationError, RedisError
from rq.cli.helpers import get_redis_from_config, read_config_file

from ..settings import LeaseSettings, SettingsError, module_settings
from . import cli_output, inspection

DEFAULT_URL = "redis://localhost:6379/0"
#: What a Redis that wants a password says to a client that sent none, and to its HELLO
NEEDS_PASSWORD = (
    "Authentication required",
    "NOAUTH",
    "HELLO must be called with the client already authenticated",
)
#: The reaper's waits for a Redis not up yet: from the first, doubling to the last
WAIT_FIRST_S = 0.1
WAIT_MAX_S = 5.0
CONNECTION_SETTINGS = ("REDIS_URL", "SENTINEL", "REDIS_HOST", "REDIS_PORT", "REDIS_DB", "REDIS_PASSWORD")


class BadInput(click.ClickException):
    """Input the operator must fix: exits 2, like a usage error."""

    exit_code = 2


def redact(url: str) -> str:
    """``url`` with its password replaced by ``***``."""
    try:
        parts = urlsplit(url)
        if parts.password is None:
            return url
        netloc = parts.netloc.rsplit("@", 1)[1]
        user = f"{parts.username}:" if parts.username else ":"
        return urlunsplit(parts._replace(netloc=f"{user}***@{netloc}"))
    except ValueError:
        return "<unparsable Redis URL>"


@dataclass
class Target:
    """A reachable Redis and the settings to read it with."""

    client: Redis
    describe: str  # the URL (password redacted) or host:port, for messages
    settings: LeaseSettings


def connect(
    url: str | None,
    config: str | None,
    overrides: dict[str, Any] | None = None,
    wait: Callable[[float], bool] | None = None,
) -> Target:
    """Connect as ``rq`` does: ``--url`` (or RQ_REDIS_URL), else the ``-c`` module's
    REDIS_URL / SENTINEL / REDIS_HOST..., else ``REDIS_URL``, else localhost. Lease settings:
    options, then RQ_EMQ_* environment variables, then RQ_EMQ_* in the ``-c`` module.

    With ``wait`` (sleeps up to N seconds, returns whether the command was told to stop),
    an unreachable Redis is tried again with backoff until it answers, one line on stderr
    per change of state; bad settings and a password problem still fail at once."""
    module: dict[str, Any] = {}
    if config:
        _import_from_the_current_directory()
        try:
            module = read_config_file(config)
        except Exception as error:  # an import runs arbitrary code: any failure is bad input
            raise BadInput(f"cannot import settings module {config!r} (-c/--config): {error}") from None
    try:
        settings = LeaseSettings.resolve(overrides, environ=os.environ, module=module_settings(module))
    except SettingsError as error:
        raise BadInput(f"invalid setting: {error}") from None
    if url:
        module["REDIS_URL"] = url
    elif not any(module.get(name) is not None for name in CONNECTION_SETTINGS):
        module["REDIS_URL"] = os.environ.get("REDIS_URL") or DEFAULT_URL
    describe = redact(module["REDIS_URL"]) if module.get("REDIS_URL") else "the Redis named in " + str(config)
    try:
        client: Redis = get_redis_from_config(module)
    except ValueError as error:
        raise BadInput(f"invalid Redis setting in {config or 'the URL'} ({describe}): {error}") from None
    ping(client, describe, wait)
    return Target(client, describe, settings)


def password_problem(client: Redis, describe: str, error: AuthenticationError) -> BadInput:
    """What to do about an authentication error: set the password, or fix the one set."""
    if not client.connection_pool.connection_kwargs.get("password") and any(
        text in str(error) for text in NEEDS_PASSWORD
    ):
        return BadInput(
            f"Redis at {describe} requires a password: "
            "set it in the URL (redis://:PASSWORD@host) or REDIS_URL"
        )
    return BadInput(f"Redis at {describe} refused the user or password given: {error}")


def ping(client: Redis, describe: str, wait: Callable[[float], bool] | None = None) -> None:
    """PING; see :func:`connect` for ``wait``."""
    delay, last = WAIT_FIRST_S, ""
    while True:
        try:
            client.ping()
        except AuthenticationError as error:
            raise password_problem(client, describe, error) from None
        except RedisError as error:
            if wait is None:
                raise click.ClickException(f"cannot reach Redis at {describe}: {error}") from None
            if str(error) != last:
                last = str(error)
                click.echo(
                    f"waiting for Redis at {describe}: {error} (retrying, every {WAIT_MAX_S:g} s at most)",
                    err=True,
                )
            if wait(delay):
                raise click.exceptions.Exit(0) from None  # stopped (SIGTERM, Ctrl-C) before Redis came
            delay = min(delay * 2, WAIT_MAX_S)
            continue
        if last:
            click.echo(f"Redis at {describe} answers", err=True)
        return


def select_queues(
    target: Target,
    options: tuple[str, ...],
    args: tuple[str, ...],
    must_exist: bool = True,
    queue_class: Any = None,
) -> list[str]:
    """Queues named (``--queues`` values are lists, split on commas and spaces; a positional
    argument is one name, whatever it holds), else every queue RQ knows. A name neither RQ
    nor our keys know exits 2, or only warns (``must_exist=False``)."""
    listed = (part for item in options for part in item.replace(",", " ").split())
    names = list(dict.fromkeys([*listed, *args]))
    if not names:
        return inspection.known_queues(target.client, queue_class)
    unknown = inspection.unknown_queues(target.client, names, queue_class)
    if unknown:
        message = (
            f"unknown queue(s): {', '.join(map(cli_output.printable, unknown))} "
            f"(not in rq:queues and no rq-emq keys) at {target.describe}"
        )
        if must_exist:
            raise BadInput(message)
        click.echo(f"warning: {message}; sweeping them anyway", err=True)
    return names


def _import_from_the_current_directory() -> None:
    """Modules found in the current directory, as rq's default ``--path`` finds them: the
    directory's finder made anew, so that it reads the directory the process is in now
    (Python 3.10 kept the one it made first, for a directory left since) and a module
    written a moment ago (tests, scripts)."""
    if "." not in sys.path:
        sys.path.append(".")
    sys.path_importer_cache.pop(".", None)
    importlib.invalidate_caches()


def load_class(path: str | None, option: str, base: type) -> Any:
    """The class named by ``--job-class`` / ``--queue-class`` (None: ``base``, RQ's)."""
    if not path:
        return base
    _import_from_the_current_directory()
    from rq.utils import import_attribute

    try:
        found = import_attribute(path)
    except Exception as error:  # an import runs arbitrary code: any failure is bad input
        raise BadInput(f"invalid {option} {path!r}: {error}") from None
    if not (isinstance(found, type) and issubclass(found, base)):
        raise BadInput(f"invalid {option} {path!r}: not a subclass of {base.__module__}.{base.__name__}")
    return found


def load_serializer(path: str | None) -> Any:
    """The serializer named by ``--serializer`` (None: RQ's default), resolved by RQ."""
    if not path:
        return None
    _import_from_the_current_directory()
    from rq.serializers import resolve_serializer

    try:
        return resolve_serializer(path)
    except Exception as error:  # an import runs arbitrary code: any failure is bad input
        raise BadInput(f"invalid --serializer {path!r}: {error}") from None
