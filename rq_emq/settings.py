"""Lease settings: names, defaults, sources and validation, all in one place.

A setting comes from (highest first) a constructor keyword, an ``RQ_EMQ_<NAME>``
environment variable, an ``RQ_EMQ_<NAME>`` in RQ's ``-c`` settings module, a class
attribute on the worker, or the default below: the deployment (its environment, then its
settings module) overrides what the code sets as its default (a class attribute). Values
are validated when the worker is built, so a bad value stops ``rq worker`` at startup
with a message that names the setting, wherever it came from.
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, fields
from typing import Any

from . import events

ENV_PREFIX = "RQ_EMQ_"

#: Upper bound of every interval setting: a day. Longer leases are not leases; and every
#: value must fit the arithmetic of Redis (ms timestamps) and of the scripts.
MAX_INTERVAL_MS = 86_400_000
#: Upper bound of max attempts, worker-wide or per job.
MAX_ATTEMPTS_LIMIT = 1000
#: Upper bound of the renew interval: a tenth of the longest lease, so that a renew
#: interval set alone still leaves room for the lease that follows it.
MAX_RENEW_INTERVAL_MS = MAX_INTERVAL_MS // 10

#: Lower bound of the sweep interval: the shortest that keeps the shortest renew interval
#: (10 ms) within 0.64 sweep intervals (see :class:`LeaseSettings`).
MIN_SWEEP_INTERVAL_MS = 16

#: The value of an interval setting left unset: it follows the others (see
#: :meth:`LeaseSettings.__post_init__`).
FOLLOW = 0
DEFAULT_LEASE_MS = 10_000
#: The shortest shutdown timeout: the cold stop it turns into is RQ's second stop signal,
#: which RQ ignores within a second of the first (a worker pool sends two).
MIN_SHUTDOWN_TIMEOUT_MS = 1_000
#: How a worker writes its log lines (``log_format``): RQ's ``--log-format`` with the level
#: and the worker's name, or one JSON object per line for log pipelines.
LOG_FORMATS = ("text", "json")
#: ``RQ_EMQ_*`` names that are no settings: what a worker hands its spawned horse.
INTERNAL_PREFIXES = (ENV_PREFIX + "HORSE_",)


class SettingsError(ValueError):
    """A lease setting is missing, malformed or inconsistent with another one."""


@dataclass(frozen=True)
class LeaseSettings:
    """Validated lease settings for one worker process."""

    # The three intervals compose: one left unset (0) follows the ones set, so that any
    # one of them set alone gives a working worker, and the defaults are 10000/1000/1666.

    #: How long a lease lives without renewal (milliseconds). Unset: 10000, or 10 x an
    #: explicit renew interval if that is longer.
    lease_ms: int = FOLLOW
    #: How often the lock manager renews every lease the process holds (milliseconds).
    #: Shorter than the lease, and at most 0.64 x sweep_interval_ms (both checked), which
    #: keeps the recovery bound at lease + 2 sweep intervals (the grace is the longer of
    #: 0.8 sweep interval and 1.25 renew intervals). Unset: lease / 10, at most 0.6 x an
    #: explicit sweep interval, and at least 10.
    renew_interval_ms: int = FOLLOW
    #: At most one sweep per queue per this interval, fleet-wide (milliseconds), at least
    #: 16. Unset: lease / 6, and at least 5/3 x the renew interval (so renew <= 0.6 x sweep).
    sweep_interval_ms: int = FOLLOW
    #: Leased jobs a single sweep call looks at before it yields (bounds script run time).
    sweep_batch: int = 100
    #: Worker-wide default for how many times a job may be taken before a stall fails it.
    max_attempts: int = 3
    #: When renewal finds the lease lost while the job runs: True stops the job, False lets
    #: it finish (its outcome is still fenced and discarded).
    stop_on_lease_lost: bool = True
    #: A forking ``LeaseWorker`` forks each next horse while the current job runs, and hands
    #: it its job once taken (:mod:`rq_emq.run.fork_ahead`): the fork off the job's path.
    #: False: the horse is forked once the job is taken, as stock RQ does.
    fork_ahead: bool = True
    #: How old a horse forked ahead may be when it takes a job (milliseconds): a job sees
    #: the worker's memory as of that fork, stock RQ's as of its take. An older one is
    #: ended (killed and reaped) and the job forked as RQ does; while the worker is idle
    #: or its job runs on, a spare is ended as it reaches this age, so that no old copy of
    #: the worker's memory is kept alive.
    spare_max_age_ms: int = 1000
    #: Unused since idle workers block on every queue at once (:mod:`rq_emq.intake.wake`); still
    #: accepted (and checked) so that configurations setting it keep starting, with a
    #: warning at startup (:data:`UNUSED_SETTINGS`).
    idle_poll_ms: int = 200
    #: Lease event hooks to load at startup, ``package.module:function`` separated by commas
    #: (see :mod:`rq_emq.events`).
    event_hooks: str = ""
    #: How long a warm stop (SIGTERM) waits for a running job before it stops the run and
    #: hands the job back to the front of its queue, attempt refunded (milliseconds). 0:
    #: RQ's warm stop, which waits for the job however long it takes.
    shutdown_timeout_ms: int = 0
    #: How a worker's own log lines are written under ``rq worker``: ``text`` (RQ's
    #: ``--log-format`` and ``--date-format``, with the level and the worker's name) or
    #: ``json`` (one object per line: time, level, logger, worker, message, job_id, queue).
    log_format: str = "text"

    def __post_init__(self) -> None:
        # what was set is checked before the unset intervals follow it, so an error names
        # the setting the user gave
        for name, low, high in _BOUNDS:
            if not _unset(getattr(self, name)):
                _require_int(self, name, minimum=low, maximum=high)
        self._follow()
        for name, low, high in _BOUNDS:
            _require_int(self, name, minimum=low, maximum=high)
        if not isinstance(self.stop_on_lease_lost, bool):
            raise SettingsError(_msg("stop_on_lease_lost", "must be true or false", self.stop_on_lease_lost))
        if not isinstance(self.fork_ahead, bool):
            raise SettingsError(_msg("fork_ahead", "must be true or false", self.fork_ahead))
        if self.renew_interval_ms >= self.lease_ms:
            raise SettingsError(
                f"renew_interval_ms ({ENV_PREFIX}RENEW_INTERVAL_MS) = {self.renew_interval_ms} must be "
                f"shorter than lease_ms ({ENV_PREFIX}LEASE_MS) = {self.lease_ms}: a lease would lapse "
                "between renewals"
            )
        if self.renew_interval_ms * 25 > self.sweep_interval_ms * 16:  # renew > 0.64 x sweep, in integers
            # the sweep's grace is the longer of 0.8 sweep interval and 1.25 renew intervals:
            # past 0.64, the renew interval sets it and recovery outlasts lease + 2 sweeps
            raise SettingsError(
                f"renew_interval_ms ({ENV_PREFIX}RENEW_INTERVAL_MS) = {self.renew_interval_ms} must be at "
                f"most 0.64 x sweep_interval_ms ({ENV_PREFIX}SWEEP_INTERVAL_MS) = {self.sweep_interval_ms} "
                f"({self.sweep_interval_ms * 16 // 25}): a dead worker's job would come back later than "
                "lease_ms + 2 x sweep_interval_ms"
            )
        _require_hooks(self.event_hooks)
        if self.log_format not in LOG_FORMATS:
            raise SettingsError(
                _msg("log_format", f"must be one of {', '.join(LOG_FORMATS)}", self.log_format)
            )
        if 0 < self.shutdown_timeout_ms < MIN_SHUTDOWN_TIMEOUT_MS:
            # RQ takes a second stop signal within a second of the first for the same one
            raise SettingsError(
                _msg(
                    "shutdown_timeout_ms",
                    f"must be 0 (wait for the job) or at least {MIN_SHUTDOWN_TIMEOUT_MS}",
                    self.shutdown_timeout_ms,
                )
            )

    def _follow(self) -> None:
        """Fill the unset intervals from the set ones (already checked)."""

        def given(name: str) -> int | None:
            value = getattr(self, name)
            return None if _unset(value) else int(value)

        lease, renew, sweep = given("lease_ms"), given("renew_interval_ms"), given("sweep_interval_ms")
        if lease is None:
            lease = max(DEFAULT_LEASE_MS, 10 * renew) if renew is not None else DEFAULT_LEASE_MS
            object.__setattr__(self, "lease_ms", lease)
        if renew is None:
            renew = lease // 10 if sweep is None else min(lease // 10, sweep * 3 // 5)
            renew = max(renew, 10)
            object.__setattr__(self, "renew_interval_ms", renew)
        if sweep is None:
            object.__setattr__(
                self, "sweep_interval_ms", max(lease // 6, -(-renew * 5 // 3), MIN_SWEEP_INTERVAL_MS)
            )

    @property
    def registry_grace_ms(self) -> int:
        """How long past a lease's deadline RQ's started registry entry stays valid.

        Stock cleanup (``rq info``, django-rq, a stock worker) fails entries that fall due;
        keeping them valid for two sweep intervals and a minute past the lease lets our
        sweep recover a dead worker's job first, while a fleet rolled back to stock RQ
        still cleans up eventually.
        """
        return 2 * self.sweep_interval_ms + 60_000

    @property
    def lease_margin_ms(self) -> int:
        """How much sooner than Redis a holder counts its own lease as lapsed.

        A holder trusts a lease until ``sent + lease_ms - lease_margin_ms`` on its own
        monotonic clock, ``sent`` being when its last successful renewal (or the take) was
        sent; after that it stops the job whether or not Redis answers. The margin covers
        clock-rate drift and the time a stop takes: the longer of one renew interval and a
        tenth of the lease, but never more than half of what the lease leaves past one
        renew interval, so that a healthy renewal always lands before the local deadline.
        The sweep recovers no sooner than ``lease_ms + grace`` past the same renewal on
        Redis's clock, so the local stop always comes first (see docs/guarantees.md, "No two
        runs of one job overlap").
        """
        wanted = max(self.renew_interval_ms, self.lease_ms // 10)
        return max(min(wanted, (self.lease_ms - self.renew_interval_ms) // 2), 0)

    @property
    def redis_timeout_s(self) -> float:
        """Socket and connect timeout of the lock manager's and the sweeper's client
        (seconds): shorter than a renew interval (and than a quarter lease), so that no
        renewal hangs past a tick and a slow Redis shows up as failed renewals. Floored
        at 50 ms so a very short interval does not turn every round trip into a timeout."""
        return max(min(self.renew_interval_ms, self.lease_ms / 4) / 1000.0, 0.05)

    @property
    def min_progress_timeout_ms(self) -> int:
        """The shortest progress timeout this worker can hold a job to: two renew
        intervals. A report lands with the renewal after it (up to one interval late) and
        the timeout is checked at renewals (one more), so a shorter one would stop a job
        that reports as often as it asked, by the tick it happened to fall on. A job asking
        for less (``rq_emq.progress_timeout(ms)``, set by a producer that does not know the
        worker's renew interval) is held to this instead, with a warning at its take."""
        return 2 * self.renew_interval_ms

    @property
    def lease_check_interval_s(self) -> float:
        """How often a holder compares its leases with their local deadlines (seconds)."""
        return (
            max(min(self.renew_interval_ms, self.lease_margin_ms or self.renew_interval_ms) / 4, 5) / 1000.0
        )

    @classmethod
    def names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in fields(cls))

    @classmethod
    def resolve(
        cls,
        overrides: Mapping[str, Any] | None = None,
        defaults: Mapping[str, Any] | None = None,
        environ: Mapping[str, str] | None = None,
        module: Mapping[str, Any] | None = None,
    ) -> LeaseSettings:
        """Build settings from keyword overrides, the environment, the ``RQ_EMQ_*`` names of
        RQ's ``-c`` settings module (``module``) and class-level defaults, in that order."""
        environ = os.environ if environ is None else environ
        values: dict[str, Any] = {}
        for name in cls.names():
            variable = ENV_PREFIX + name.upper()
            if defaults and defaults.get(name) is not None:
                values[name] = defaults[name]
            module_value = (module or {}).get(variable)
            if module_value is not None:
                # a module may hold the value itself (7000, False) or its text ("7000")
                values[name] = (
                    _parse_env(name, module_value) if isinstance(module_value, str) else module_value
                )
            env_value = environ.get(variable)
            if env_value is not None and env_value.strip() != "":
                values[name] = _parse_env(name, env_value)
            if overrides and overrides.get(name) is not None:
                values[name] = overrides[name]
        unknown = set(overrides or ()) - set(cls.names())
        if unknown:
            raise SettingsError(f"unknown lease setting(s): {', '.join(sorted(unknown))}")
        return cls(**values)


def module_settings(module: Mapping[str, Any]) -> dict[str, Any]:
    """The ``RQ_EMQ_*`` names of a settings module (RQ's ``read_config_file`` of ``-c``)."""
    return {key: value for key, value in module.items() if key.startswith(ENV_PREFIX)}


def misspelled(names: Iterable[str]) -> list[tuple[str, str]]:
    """``(name, closest setting's variable)`` for each ``RQ_EMQ_*`` name in ``names`` that
    is no setting but looks like one (``RQ_EMQ_LEASEMS``: ``RQ_EMQ_LEASE_MS``). A name
    close to none is another tool's and is left alone, as are the internal ones."""
    valid = [name.upper() for name in LeaseSettings.names()]
    found = []
    for name in sorted(set(names)):
        if not name.startswith(ENV_PREFIX) or name.startswith(INTERNAL_PREFIXES):
            continue
        wanted = name[len(ENV_PREFIX) :]
        if wanted in valid:
            continue
        closest = difflib.get_close_matches(wanted, valid, n=1, cutoff=0.6)
        if closest:
            found.append((name, ENV_PREFIX + closest[0]))
    return found


#: Settings that no longer change anything: accepted (and checked), with a warning at startup.
UNUSED_SETTINGS = ("idle_poll_ms",)

#: (setting, minimum, maximum) of every whole-number setting.
_BOUNDS = (
    ("lease_ms", 100, MAX_INTERVAL_MS),
    ("renew_interval_ms", 10, MAX_RENEW_INTERVAL_MS),
    ("sweep_interval_ms", MIN_SWEEP_INTERVAL_MS, MAX_INTERVAL_MS),
    ("sweep_batch", 1, 10_000),
    ("max_attempts", 1, MAX_ATTEMPTS_LIMIT),
    ("idle_poll_ms", 10, 60_000),
    ("shutdown_timeout_ms", 0, MAX_INTERVAL_MS),
    ("spare_max_age_ms", 1, MAX_INTERVAL_MS),
)


def _unset(value: object) -> bool:
    return value == FOLLOW and not isinstance(value, bool)


def job_max_attempts(value: object) -> int | None:
    """A per-job max attempts (``job.meta["emq_max_attempts"]``) if it is valid: a whole
    number from 1 to :data:`MAX_ATTEMPTS_LIMIT` (not a bool, string or float); else None."""
    if isinstance(value, bool) or not isinstance(value, int):
        return None
    return value if 1 <= value <= MAX_ATTEMPTS_LIMIT else None


#: The longest progress timeout a job may ask for (a week, in ms).
PROGRESS_TIMEOUT_LIMIT_MS = 7 * 86_400_000


def job_progress_timeout(value: object) -> int | None:
    """A per-job progress timeout (``job.meta["emq_progress_timeout_ms"]``) if it is valid:
    a whole number of ms from 1 to :data:`PROGRESS_TIMEOUT_LIMIT_MS`; else None."""
    if isinstance(value, bool) or not isinstance(value, int):
        return None
    return value if 1 <= value <= PROGRESS_TIMEOUT_LIMIT_MS else None


def _msg(name: str, rule: str, value: object) -> str:
    return f"{name} ({ENV_PREFIX}{name.upper()}) {rule}, got {value!r}"


def _require_int(obj: LeaseSettings, name: str, minimum: int, maximum: int | None = None) -> None:
    value = getattr(obj, name)
    if isinstance(value, bool) or not isinstance(value, int):
        raise SettingsError(_msg(name, "must be a whole number", value))
    if value < minimum or (maximum is not None and value > maximum):
        bound = f"at least {minimum}" if maximum is None else f"between {minimum} and {maximum}"
        raise SettingsError(_msg(name, f"must be {bound}", value))


def _require_hooks(value: object) -> None:
    if not isinstance(value, str):
        raise SettingsError(_msg("event_hooks", "must be a string of package.module:function names", value))
    for path in events.hook_paths(value):
        try:
            events.resolve(path)
        except ValueError as error:
            raise SettingsError(f"event_hooks ({ENV_PREFIX}EVENT_HOOKS): {error}") from None


def _parse_env(name: str, raw: str) -> Any:
    field_type = {f.name: f.type for f in fields(LeaseSettings)}[name]
    text = raw.strip()
    if name == "log_format":
        return text.lower()
    if field_type in (str, "str"):
        return text
    if field_type in (bool, "bool"):
        lowered = text.lower()
        if lowered in ("1", "true", "yes", "on"):
            return True
        if lowered in ("0", "false", "no", "off"):
            return False
        raise SettingsError(_msg(name, "must be true or false", raw))
    try:
        return int(text.replace("_", ""))
    except ValueError:
        raise SettingsError(_msg(name, "must be a whole number", raw)) from None
