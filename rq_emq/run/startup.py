"""What a worker checks before it starts: its settings and its Redis.

A worker that cannot start says why in one line and exits non-zero. RQ's ``rq worker``
logs any ``Exception`` from the worker with its traceback (RQ 3) or lets it escape
(RQ 2), so the refusal is a :class:`StartupError`, a ``SystemExit`` whose message is that
line: Python prints it, alone, and exits with status 1.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from typing import Any

from redis import Redis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from ..settings import ENV_PREFIX, UNUSED_SETTINGS, LeaseSettings, SettingsError

logger = logging.getLogger("rq_emq.startup")

#: The oldest Redis the scripts run on: BLMOVE and LPOS came with 6.2.
OLDEST_REDIS = (6, 2)


class StartupError(SystemExit):
    """The worker refuses to start; the message names what is wrong."""

    def __init__(self, message: str) -> None:
        super().__init__(f"rq-emq: {message}")


def worker_settings(
    overrides: Mapping[str, Any], defaults: Mapping[str, Any], environ: Mapping[str, str] | None = None
) -> LeaseSettings:
    environ = os.environ if environ is None else environ
    try:
        settings = LeaseSettings.resolve(overrides, defaults, environ)
    except SettingsError as error:
        raise StartupError(f"invalid setting: {error}") from error
    for name in UNUSED_SETTINGS:
        variable = ENV_PREFIX + name.upper()
        if (
            any(given.get(name) is not None for given in (overrides, defaults))
            or environ.get(variable, "").strip()
        ):
            # still accepted so that a configuration setting it keeps starting, but whoever
            # tunes it should know it changes nothing
            logger.warning("%s (%s) is no longer used and changes nothing; it can be removed", name, variable)
    return settings


def check_redis(connection: Redis) -> None:
    """Refuse a Redis this worker cannot reach, or one older than :data:`OLDEST_REDIS`.
    A server that will not say its version (INFO denied) is given the benefit of the doubt."""
    where = _address(connection)
    try:
        info = connection.info("server")
    except (RedisConnectionError, RedisTimeoutError) as error:
        raise StartupError(f"cannot reach Redis at {where}: {error}") from error
    except ResponseError as error:
        logger.warning("Redis at %s does not tell its version (%s); assuming 6.2 or later", where, error)
        return
    version = str(info.get("redis_version", ""))
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
