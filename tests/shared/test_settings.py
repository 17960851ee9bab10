"""Lease settings: where they come from, and the errors bad ones give."""

from __future__ import annotations

import logging
import os

import pytest
import redis
from hypothesis import given, settings
from hypothesis import strategies as st

from rq_emq import LeaseSettings, LeaseWorker, SettingsError, SimpleLeaseWorker, StartupError, max_attempts
from rq_emq.run.startup import worker_settings


def test_defaults() -> None:
    s = LeaseSettings.resolve(environ={})
    assert (s.lease_ms, s.renew_interval_ms, s.sweep_interval_ms, s.max_attempts) == (10_000, 1_000, 1_667, 3)
    assert s.stop_on_lease_lost is True


def test_keyword_beats_environment_beats_class_attribute() -> None:
    env = {"RQ_EMQ_LEASE_MS": "20000", "RQ_EMQ_MAX_ATTEMPTS": "5"}
    s = LeaseSettings.resolve(
        {"lease_ms": 12_000}, {"lease_ms": 9_000, "max_attempts": 2, "sweep_batch": 7}, env
    )
    assert (s.lease_ms, s.max_attempts, s.sweep_batch) == (12_000, 5, 7)


def test_environment_booleans_and_numbers_are_parsed() -> None:
    s = LeaseSettings.resolve(environ={"RQ_EMQ_STOP_ON_LEASE_LOST": "off", "RQ_EMQ_LEASE_MS": "45_000"})
    assert s.stop_on_lease_lost is False and s.lease_ms == 45_000


@pytest.mark.parametrize(
    ("overrides", "environ", "named"),
    [
        ({"renew_interval_ms": 30_000, "lease_ms": 30_000}, {}, "renew_interval_ms"),
        ({}, {"RQ_EMQ_RENEW_INTERVAL_MS": "40000", "RQ_EMQ_LEASE_MS": "30000"}, "RENEW_INTERVAL_MS"),
        ({}, {"RQ_EMQ_LEASE_MS": "100000000000000000"}, "RQ_EMQ_LEASE_MS"),
        ({"renew_interval_ms": -5}, {}, "renew_interval_ms"),
        ({}, {"RQ_EMQ_LEASE_MS": "soon"}, "RQ_EMQ_LEASE_MS"),
        ({"max_attempts": 0}, {}, "max_attempts"),
        ({"sweep_batch": 10**6}, {}, "sweep_batch"),
        ({}, {"RQ_EMQ_STOP_ON_LEASE_LOST": "maybe"}, "stop_on_lease_lost"),
        ({"lease_msec": 1}, {}, "lease_msec"),
        ({"shutdown_timeout_ms": 500}, {}, "shutdown_timeout_ms"),  # RQ ignores a 2nd signal within 1 s
        ({}, {"RQ_EMQ_SHUTDOWN_TIMEOUT_MS": "-1"}, "RQ_EMQ_SHUTDOWN_TIMEOUT_MS"),
        ({}, {"RQ_EMQ_SPARE_MAX_AGE_MS": "0"}, "RQ_EMQ_SPARE_MAX_AGE_MS"),
        ({}, {"RQ_EMQ_SPARE_MAX_AGE_MS": "soon"}, "RQ_EMQ_SPARE_MAX_AGE_MS"),
    ],
)
def test_bad_settings_name_the_setting(overrides: dict, environ: dict, named: str) -> None:
    with pytest.raises(SettingsError, match=named):
        LeaseSettings.resolve(overrides, environ=environ)


def test_workers_take_settings_as_keywords_and_class_attributes(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("LEASE_MS", "RENEW_INTERVAL_MS", "MAX_ATTEMPTS"):
        monkeypatch.delenv(f"RQ_EMQ_{name}", raising=False)
    connection = redis.Redis()  # never contacted

    class PatientWorker(SimpleLeaseWorker):
        lease_ms = 120_000
        max_attempts = 9

    w = PatientWorker(["q"], connection=connection, renew_interval_ms=20_000, prepare_for_work=False)
    assert (w.lease_settings.lease_ms, w.lease_settings.renew_interval_ms, w.lease_settings.max_attempts) == (
        120_000,
        20_000,
        9,
    )
    with pytest.raises(StartupError, match="renew_interval_ms") as refused:
        LeaseWorker(
            ["q"], connection=connection, lease_ms=1_000, renew_interval_ms=1_000, prepare_for_work=False
        )
    assert isinstance(refused.value, SystemExit) and isinstance(refused.value.__cause__, SettingsError)


@pytest.mark.parametrize(
    ("overrides", "environ", "warned"),
    [
        ({"idle_poll_ms": 500}, {}, True),
        ({}, {"RQ_EMQ_IDLE_POLL_MS": "500"}, True),
        ({}, {"RQ_EMQ_IDLE_POLL_MS": " "}, False),
        ({"lease_ms": 60_000}, {}, False),
    ],
)
def test_a_worker_given_a_setting_that_no_longer_does_anything_starts_and_says_so(
    overrides: dict, environ: dict, warned: bool, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="rq_emq.startup"):
        settings = worker_settings(overrides, {}, environ)
    assert settings.lease_ms > 0  # it starts
    said = [r.getMessage() for r in caplog.records if "no longer used" in r.getMessage()]
    assert said == (
        ["idle_poll_ms (RQ_EMQ_IDLE_POLL_MS) is no longer used and changes nothing; it can be removed"]
        if warned
        else []
    )


def test_the_max_attempts_helper_builds_meta_and_rejects_nonsense() -> None:
    assert max_attempts(4, {"tenant": "a"}) == {"tenant": "a", "emq_max_attempts": 4}
    with pytest.raises(SettingsError, match="max_attempts"):
        max_attempts(0)


# -- defaults that compose: any one setting set alone gives a working worker ---------------

#: (setting, minimum, typical, maximum) of every setting a user can set.
RANGES = [
    ("lease_ms", 100, 2_000, 86_400_000),
    ("renew_interval_ms", 10, 1_000, 8_640_000),
    ("sweep_interval_ms", 16, 2_000, 86_400_000),
    ("sweep_batch", 1, 100, 10_000),
    ("max_attempts", 1, 5, 1000),
    ("idle_poll_ms", 10, 500, 60_000),
]


@pytest.mark.parametrize("value", [0, 1_000, 30_000, 86_400_000])
def test_a_shutdown_timeout_is_0_or_from_a_second_to_a_day(value: int) -> None:
    assert LeaseSettings.resolve({"shutdown_timeout_ms": value}, environ={}).shutdown_timeout_ms == value
    environ = {"RQ_EMQ_SHUTDOWN_TIMEOUT_MS": str(value)}
    assert LeaseSettings.resolve(environ=environ).shutdown_timeout_ms == value
    with pytest.raises(SettingsError, match="shutdown_timeout_ms"):
        LeaseSettings.resolve({"shutdown_timeout_ms": 86_400_001}, environ={})


def assert_recovery_bound_holds(s: LeaseSettings) -> None:
    assert 10 <= s.renew_interval_ms < s.lease_ms
    assert s.renew_interval_ms <= 0.64 * s.sweep_interval_ms


@pytest.mark.parametrize(("name", "value"), [(n, v) for n, *values in RANGES for v in values])
def test_every_setting_alone_at_its_bounds_gives_valid_settings(name: str, value: int) -> None:
    s = LeaseSettings.resolve({name: value}, environ={})
    assert getattr(s, name) == value
    assert_recovery_bound_holds(s)
    from_env = LeaseSettings.resolve(environ={f"RQ_EMQ_{name.upper()}": str(value)})
    assert from_env == s


@pytest.mark.parametrize(("name", "low", "high"), [(n, lo, hi) for n, lo, _, hi in RANGES])
def test_every_setting_has_a_minimum_and_a_maximum(name: str, low: int, high: int) -> None:
    for value in (low - 1, high + 1):
        with pytest.raises(SettingsError, match=name):
            LeaseSettings.resolve({name: value}, environ={})


@given(st.sampled_from(RANGES).flatmap(lambda r: st.tuples(st.just(r[0]), st.integers(r[1], r[3]))))
@settings(max_examples=300, deadline=None)
def test_any_single_setting_gives_valid_settings(setting: tuple[str, int]) -> None:
    name, value = setting
    s = LeaseSettings.resolve({name: value}, environ={})
    assert getattr(s, name) == value
    assert_recovery_bound_holds(s)


def test_a_renew_interval_past_0_64_sweep_intervals_is_refused_naming_both() -> None:
    """The sweep's grace is the longer of 0.8 sweep interval and 1.25 renew intervals: past
    0.64 sweep intervals the renew interval sets it, and a dead worker's job comes back
    later than lease + 2 sweep intervals, the bound the docs promise."""
    with pytest.raises(SettingsError) as refused:
        LeaseSettings(lease_ms=2_000, renew_interval_ms=1_000, sweep_interval_ms=100)
    assert str(refused.value) == (
        "renew_interval_ms (RQ_EMQ_RENEW_INTERVAL_MS) = 1000 must be at most 0.64 x sweep_interval_ms "
        "(RQ_EMQ_SWEEP_INTERVAL_MS) = 100 (64): a dead worker's job would come back later than "
        "lease_ms + 2 x sweep_interval_ms"
    )
    environ = {"RQ_EMQ_RENEW_INTERVAL_MS": "65", "RQ_EMQ_SWEEP_INTERVAL_MS": "100"}
    with pytest.raises(SettingsError, match="RQ_EMQ_RENEW_INTERVAL_MS.*RQ_EMQ_SWEEP_INTERVAL_MS"):
        LeaseSettings.resolve(environ=environ)
    environ["RQ_EMQ_RENEW_INTERVAL_MS"] = "64"  # exactly 0.64 sweep intervals: the grace is 0.8 sweep
    assert LeaseSettings.resolve(environ=environ).renew_interval_ms == 64


#: An interval setting as a user gives it: unset (it follows the others), or any value in
#: its bounds, its bounds and the relations' edges likelier than the rest.
def interval(low: int, high: int) -> st.SearchStrategy[int | None]:
    return st.none() | st.sampled_from([low, high]) | st.integers(low, high) | st.integers(low, 5_000)


@given(interval(100, 86_400_000), interval(10, 8_640_000), interval(16, 86_400_000))
@settings(max_examples=1000, deadline=None)
def test_the_intervals_set_are_refused_only_for_their_own_relations(
    lease: int | None, renew: int | None, sweep: int | None
) -> None:
    """Whichever intervals are set (none, one, two or all three), the ones left unset
    follow them into settings that keep every relation: the settings are refused only
    when the values set, between themselves, break one."""
    given_values = {"lease_ms": lease, "renew_interval_ms": renew, "sweep_interval_ms": sweep}
    broken = (lease is not None and renew is not None and renew >= lease) or (
        renew is not None and sweep is not None and renew * 25 > sweep * 16
    )
    if broken:
        with pytest.raises(SettingsError, match="renew_interval_ms"):
            LeaseSettings.resolve(given_values, environ={})
        return
    s = LeaseSettings.resolve(given_values, environ={})
    assert all(getattr(s, name) == value for name, value in given_values.items() if value is not None)
    assert_recovery_bound_holds(s)


def test_intervals_follow_the_lease() -> None:
    s = LeaseSettings.resolve(environ={"RQ_EMQ_LEASE_MS": "2000"})
    assert (s.lease_ms, s.renew_interval_ms, s.sweep_interval_ms) == (2_000, 200, 334)
    s = LeaseSettings.resolve({"renew_interval_ms": 20_000}, environ={})
    assert (s.lease_ms, s.renew_interval_ms, s.sweep_interval_ms) == (200_000, 20_000, 33_334)
    s = LeaseSettings.resolve({"sweep_interval_ms": 1_000}, environ={})
    assert (s.lease_ms, s.renew_interval_ms, s.sweep_interval_ms) == (10_000, 600, 1_000)
    s = LeaseSettings.resolve({"lease_ms": 60_000, "renew_interval_ms": 1_000}, environ={})
    assert s.sweep_interval_ms == 10_000


@pytest.mark.parametrize(
    ("lease_ms", "renew_ms", "sweep_ms"),
    [(30_000, 3_000, 5_000), (1_000, 200, 313), (400, 100, 157), (2_000, 1_000, 5_000), (100, 10, 16)],
)
def test_the_local_lease_clock_stops_a_job_before_any_sweep_may_recover_it(
    lease_ms: int, renew_ms: int, sweep_ms: int
) -> None:
    from redis import Redis

    from rq_emq.recover.sweep import Sweeper

    s = LeaseSettings(lease_ms=lease_ms, renew_interval_ms=renew_ms, sweep_interval_ms=sweep_ms)
    grace = Sweeper(Redis(), ["q"], s)  # never connects: only its grace is read
    trusted = s.lease_ms - s.lease_margin_ms
    # a healthy renewal (sent a renew interval after the last, answered within the socket
    # timeout) lands before the local deadline ...
    assert s.renew_interval_ms + 1000 * s.redis_timeout_s <= trusted or s.redis_timeout_s == 0.05
    # ... and the local stop (checked every check interval) comes before lease + grace
    assert trusted + 1000 * s.lease_check_interval_s < s.lease_ms + grace.grace_ms
    assert 1000 * s.redis_timeout_s <= max(s.renew_interval_ms, 50)


# -- one source of settings: RQ's -c module, and typos caught --------------------------------


def test_the_environment_beats_the_settings_module_which_beats_class_attributes() -> None:
    s = LeaseSettings.resolve(
        {"max_attempts": 9},
        {"lease_ms": 9_000, "sweep_batch": 7, "max_attempts": 2},
        {"RQ_EMQ_LEASE_MS": "20000"},
        {"RQ_EMQ_LEASE_MS": 7_000, "RQ_EMQ_SWEEP_BATCH": "50", "RQ_EMQ_MAX_ATTEMPTS": 4},
    )
    assert (s.lease_ms, s.sweep_batch, s.max_attempts) == (20_000, 50, 9)
    assert (
        LeaseSettings.resolve(module={"RQ_EMQ_STOP_ON_LEASE_LOST": False}, environ={}).stop_on_lease_lost
        is False
    )


@pytest.mark.parametrize("value", ["abc", -5, 10**12])
def test_a_bad_value_in_the_settings_module_names_the_setting(value: object) -> None:
    with pytest.raises(StartupError, match=r"rq-emq: invalid setting: lease_ms \(RQ_EMQ_LEASE_MS\)"):
        worker_settings({}, {}, {}, module={"RQ_EMQ_LEASE_MS": value, "REDIS_URL": "redis://"})


def test_a_misspelled_name_is_warned_about_once_naming_the_closest_setting(
    caplog: pytest.LogCaptureFixture,
) -> None:
    from rq_emq.run import startup

    startup._warned.clear()
    environ = {"RQ_EMQ_LEASEMS": "5000", "RQ_EMQ_HORSE_LEASE": "x", "RQ_EMQ_TEST_PROCESSES": "y"}
    with caplog.at_level(logging.WARNING, logger="rq_emq.startup"):
        worker_settings({}, {}, environ, module={"RQ_EMQ_MAX_ATTEMPT": 4})
        worker_settings({}, {}, environ, module={"RQ_EMQ_MAX_ATTEMPT": 4})
    said = [r.getMessage() for r in caplog.records if "not an rq-emq setting" in r.getMessage()]
    assert said == [
        "environment variable RQ_EMQ_LEASEMS is not an rq-emq setting (ignored); "
        "did you mean RQ_EMQ_LEASE_MS?",
        "settings module name RQ_EMQ_MAX_ATTEMPT is not an rq-emq setting (ignored); "
        "did you mean RQ_EMQ_MAX_ATTEMPTS?",
    ]


def test_a_pool_member_leaves_to_its_pool_the_warnings_of_the_environment_and_the_module(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    from rq_emq.run import startup

    startup._warned.clear()
    monkeypatch.setenv(startup.ENV_POOL_CHECKED, "1")
    environ = {"RQ_EMQ_LEASEMS": "5000", "RQ_EMQ_IDLE_POLL_MS": "100"}
    with caplog.at_level(logging.WARNING, logger="rq_emq.startup"):
        worker_settings({}, {}, environ, module={"RQ_EMQ_MAX_ATTEMPT": 4, "RQ_EMQ_IDLE_POLL_MS": 100})
        assert caplog.records == []
        worker_settings({"idle_poll_ms": 100}, {}, environ, module={})  # the pool cannot know this one
    (said,) = [r.getMessage() for r in caplog.records]
    assert said.startswith("idle_poll_ms (RQ_EMQ_IDLE_POLL_MS) is no longer used")


def test_outside_rq_worker_pool_the_pools_check_does_nothing(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    from rq_emq.run import startup

    startup._warned.clear()
    monkeypatch.setenv("RQ_EMQ_LEASEMS", "5000")
    monkeypatch.delenv(startup.ENV_POOL_CHECKED, raising=False)
    with caplog.at_level(logging.WARNING, logger="rq_emq.startup"):
        startup.under_rq_worker_pool()
    assert caplog.records == [] and startup.ENV_POOL_CHECKED not in os.environ


def two_arguments(event: object, other: object) -> None:
    """Not a hook: it cannot be called with one event."""


def keyword_only(*, event: object) -> None:
    """Not a hook either: the event is passed by position."""


@pytest.mark.parametrize("name", ["two_arguments", "keyword_only"])
def test_an_event_hook_that_cannot_take_an_event_is_refused_at_startup(name: str) -> None:
    path = f"{__name__}:{name}"
    with pytest.raises(StartupError, match=f"event_hooks .*{name}.* cannot take an event"):
        worker_settings({}, {}, {"RQ_EMQ_EVENT_HOOKS": path}, module={})
    assert worker_settings(
        {}, {}, {"RQ_EMQ_EVENT_HOOKS": "json:dumps"}, module={}
    )  # any one-argument callable


@pytest.mark.parametrize(("asked", "held"), [(50, 2_000), (1_999, 2_000), (2_000, 2_000), (60_000, 60_000)])
def test_a_progress_timeout_shorter_than_two_renew_intervals_is_held_to_them(asked: int, held: int) -> None:
    s = LeaseSettings.resolve({"lease_ms": 10_000}, environ={})
    assert s.min_progress_timeout_ms == 2 * s.renew_interval_ms == 2_000
    worker = SimpleLeaseWorker(["q"], connection=redis.Redis(), lease_ms=10_000, prepare_for_work=False)
    job = type("J", (), {"id": "j1"})()
    queue = type("Q", (), {"name": "q"})()
    assert worker._progress_timeout_held(job, queue, asked) == held  # type: ignore[arg-type]


@pytest.mark.parametrize("value", ["text", "json", "JSON"])
def test_the_log_format_is_text_or_json(value: str) -> None:
    assert LeaseSettings.resolve(environ={"RQ_EMQ_LOG_FORMAT": value}).log_format == value.lower()
    with pytest.raises(SettingsError, match="log_format"):
        LeaseSettings.resolve({"log_format": "yaml"}, environ={})
