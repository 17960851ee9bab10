"""What a worker checks before it starts: its settings and its Redis.

The settings come from the worker's keywords, the environment, the ``RQ_EMQ_*`` names of
the settings module RQ's CLI was given (``rq worker -c mysettings``, or ``RQ_CONFIG``:
the worker is built inside RQ's ``worker`` command, whose parsed options click keeps)
and the class attributes (:meth:`rq_emq.settings.LeaseSettings.resolve`). A name that
looks like a misspelled setting, or a setting that no longer changes anything, is warned
about once per process; under ``rq worker-pool`` once for the pool, by its own process
(:func:`under_rq_worker_pool`), its members quiet. In JSON mode the worker's process
writes JSON from its first line (:func:`rq_emq.run.logs.write_json`).

A worker that cannot start says why in one line and exits non-zero. RQ's ``rq worker``
logs any ``Exception`` from the worker with its traceback (RQ 3) or lets it escape
(RQ 2), so the refusal is a :class:`StartupError`, a ``SystemExit`` whose message is that
line: Python prints it, alone, and exits with status 1.

Of its Redis, a worker checks that it answers and is recent enough, and warns (one line,
and starts anyway) when the server may evict keys: an evicted lease lock or job reads as a
lost lease. All of it from one ``INFO``, the round trip the start makes anyway.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from typing import Any

import click
from redis import Redis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from ..connection import lent_state
from ..settings import (
    ENV_PREFIX,
    UNUSED_SETTINGS,
    LeaseSettings,
    SettingsError,
    misspelled,
    module_settings,
)
from . import logs

logger = logging.getLogger("rq_emq.startup")

#: The oldest Redis the scripts run on: BLMOVE and LPOS came with 6.2.
OLDEST_REDIS = (6, 2)


class StartupError(SystemExit):
    """The worker refuses to start; the message names what is wrong."""

    def __init__(self, message: str) -> None:
        super().__init__(f"rq-emq: {message}")


#: The settings module's name, handed to a SpawnWorker's horse (a new interpreter, outside
#: RQ's CLI) so that it reads the same settings as its worker.
ENV_CONFIG = "RQ_EMQ_HORSE_CONFIG"

#: Set by ``rq worker-pool``'s own process for its members: the environment and the
#: settings module were checked there, and what they warrant was said once, for the pool.
ENV_POOL_CHECKED = "RQ_EMQ_POOL_CHECKED"

#: Misspelled names already warned about in this process (a pool's worker, a rebuilt one).
_warned: set[str] = set()


def worker_settings(
    overrides: Mapping[str, Any],
    defaults: Mapping[str, Any],
    environ: Mapping[str, str] | None = None,
    module: Mapping[str, Any] | None = None,
) -> LeaseSettings:
    """The worker's settings; ``module``: the ``-c`` settings module's names (None: the
    module RQ's CLI was given, if any). A bad value, wherever it came from, is a
    :class:`StartupError` naming it."""
    environ = os.environ if environ is None else environ
    module = cli_settings() if module is None else module_settings(module)
    # a SpawnWorker's horse (told its worker's module) builds the worker again: the
    # worker has warned already, and a line per job would drown the log
    warn = ENV_CONFIG not in os.environ
    # a pool's member: its pool warned of what the environment and the module hold
    by_pool = ENV_POOL_CHECKED in os.environ
    try:
        settings = LeaseSettings.resolve(overrides, defaults, environ, module)
    except SettingsError as error:
        if warn and not by_pool:
            _warn_misspelled(environ, module)  # a misspelled name may be why a value is wrong
        raise StartupError(f"invalid setting: {error}") from error
    logs.write_json(settings.log_format == "json")  # before this worker's first line
    if warn and not by_pool:
        _warn_misspelled(environ, module)
    if warn:
        _warn_unused(overrides, defaults, {} if by_pool else environ, {} if by_pool else module)
    return settings


def under_rq_worker_pool() -> None:
    """In ``rq worker-pool``'s own process (RQ's CLI imports rq_emq for its ``-w`` option,
    inside that command): say once, for the pool, what its members would each say of the
    environment and the settings module (misspelled names, settings no longer used), tell
    the members so (:data:`ENV_POOL_CHECKED`), and in JSON mode write the pool's own lines
    as JSON (a member turns it on again as it is built). Anywhere else it does nothing: a
    process that only imports rq_emq is left alone. Settings the members will refuse are
    theirs to name, each in its own line."""
    context = click.get_current_context(silent=True)
    if context is None or context.command.name != "worker-pool" or not _is_rq_cli(context.find_root()):
        return
    try:
        module = cli_settings()
        settings: LeaseSettings | None = LeaseSettings.resolve({}, {}, os.environ, module)
    except StartupError:
        return
    except SettingsError:
        settings = None
    if settings is not None:
        logs.write_json(settings.log_format == "json")
    _warn_misspelled(os.environ, module)
    _warn_unused({}, {}, os.environ, module)
    os.environ[ENV_POOL_CHECKED] = "1"


def settings_module_name() -> str | None:
    """The settings module ``rq worker -c`` (``rq worker-pool -c``, or ``RQ_CONFIG``) names.

    RQ's CLI imports that module for its own settings (REDIS_URL, QUEUES...) and builds
    the worker inside its command, so click's context of that command holds the option as
    RQ parsed it (a pool's workers are forked from it). A worker built outside RQ's CLI
    has none, unless it is a SpawnWorker's horse, told by its worker (:data:`ENV_CONFIG`)."""
    context = click.get_current_context(silent=True)
    if context is not None and _is_rq_cli(context.find_root()):
        while context is not None:
            if context.params.get("config"):
                return str(context.params["config"])
            context = context.parent
        return None
    return os.environ.get(ENV_CONFIG) or None


def _is_rq_cli(root: click.Context) -> bool:
    # only RQ's own ``config`` option names a settings module: another program's may not
    callback = getattr(root.command, "callback", None)
    return str(getattr(callback, "__module__", "")).startswith("rq.cli")


def cli_settings() -> dict[str, Any]:
    """The ``RQ_EMQ_*`` names of the settings module RQ's CLI was given ({} for none)."""
    name = settings_module_name()
    if not name:
        return {}
    from rq.cli.helpers import read_config_file

    try:
        return module_settings(read_config_file(name))  # imported already by RQ's CLI
    except Exception as error:  # an import runs arbitrary code: any failure is the module's
        raise StartupError(f"cannot import settings module {name!r} (-c/--config): {error}") from error


def _warn_unused(
    overrides: Mapping[str, Any],
    defaults: Mapping[str, Any],
    environ: Mapping[str, str],
    module: Mapping[str, Any],
) -> None:
    for name in UNUSED_SETTINGS:
        variable = ENV_PREFIX + name.upper()
        if (
            any(given.get(name) is not None for given in (overrides, defaults))
            or environ.get(variable, "").strip()
            or module.get(variable) is not None
        ):
            # still accepted so that a configuration setting it keeps starting, but whoever
            # tunes it should know it changes nothing
            logger.warning("%s (%s) is no longer used and changes nothing; it can be removed", name, variable)


def _warn_misspelled(environ: Mapping[str, str], module: Mapping[str, Any]) -> None:
    for source, names in (("environment variable", environ), ("settings module name", module)):
        for name, closest in misspelled(n for n in names if n != ENV_POOL_CHECKED):
            if name not in _warned:
                _warned.add(name)
                logger.warning(
                    "%s %s is not an rq-emq setting (ignored); did you mean %s?", source, name, closest
                )


def check_redis(connection: Redis) -> None:
    """Refuse a Redis this worker cannot reach, or one older than :data:`OLDEST_REDIS`, and
    warn about one that may evict keys (:func:`warn_if_evicting`).

    One ``INFO`` of the default sections (server and memory among them) answers both: the
    eviction check costs no round trip of its own, and ``+info`` is in the least-privilege
    ACL (docs/operating.md) where ``CONFIG GET`` is not. A server that will not say its
    version (INFO denied) is given the benefit of the doubt."""
    where = _address(connection)
    try:
        info = connection.info()
    except (RedisConnectionError, RedisTimeoutError) as error:
        raise StartupError(f"cannot reach Redis at {where}: {error}") from error
    except ResponseError as error:
        logger.warning("Redis at %s does not tell its version (%s); assuming 6.2 or later", where, error)
        return
    _check_version(info, where)
    warn_if_evicting(info, where)


#: The one ``maxmemory-policy`` under which Redis never deletes a key to make room.
NO_EVICTION = "noeviction"


def warn_if_evicting(info: Mapping[str, Any], where: str) -> None:
    """One warning line if ``info`` (a parsed ``INFO`` with its memory section) names a
    ``maxmemory-policy`` other than ``noeviction``. Under ``allkeys-*`` a full Redis may
    evict any key, under ``volatile-*`` any key with a TTL, which every lease lock has: an
    evicted job hash or lock reads as a lost lease, and an evicted job is gone. Nothing is
    said of a server that does not show the field (an old one, or a managed one hiding it)."""
    policy = info.get("maxmemory_policy")
    if isinstance(policy, bytes):
        policy = policy.decode(errors="replace")
    if not isinstance(policy, str) or not policy or policy == NO_EVICTION:
        return
    logger.warning(
        "Redis at %s may evict keys when full (maxmemory-policy %s): an evicted job or lease lock "
        "reads as a lost lease, its run cut short, and an evicted job is left nowhere; set "
        "maxmemory-policy %s (docs/operating.md)",
        where,
        policy,
        NO_EVICTION,
    )


def _check_version(info: Mapping[str, Any], where: str) -> None:
    version = str(info.get("redis_version", ""))
    # before 7.0 CLIENT INFO shows no protocol: the lent connection's proof asks HELLO
    lent_state.server_shows_protocol = parse_version(version) >= (7,) or not parse_version(version)
    if not parse_version(version):
        logger.warning("Redis at %s gives no readable version (%r); assuming 6.2 or later", where, version)
    elif parse_version(version) < OLDEST_REDIS:
        raise StartupError(
            f"Redis {version} at {where} is older than "
            f"{'.'.join(map(str, OLDEST_REDIS))}, the oldest rq-emq supports (it needs BLMOVE and LPOS)"
        )


def parse_version(text: str) -> tuple[int, ...]:
    """``"7.2.4"`` -> ``(7, 2, 4)``; anything unreadable -> ``()``."""
    parts: list[int] = []
    for piece in text.split("."):
        digits = "".join(c for c in piece if c.isdigit())
        if not digits:
            break
        parts.append(int(digits))
    return tuple(parts)


def _address(connection: Redis) -> str:
    kwargs = connection.connection_pool.connection_kwargs
    if "path" in kwargs:
        return str(kwargs["path"])
    return f"{kwargs.get('host', 'localhost')}:{kwargs.get('port', 6379)}"
