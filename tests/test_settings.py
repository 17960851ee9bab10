"""Lease settings: where they come from, and the errors bad ones give."""

from __future__ import annotations

import pytest
import redis

from rq_emq import LeaseSettings, LeaseWorker, SettingsError, SimpleLeaseWorker, max_attempts


def test_defaults() -> None:
    s = LeaseSettings.resolve(environ={})
    assert (s.lease_ms, s.renew_interval_ms, s.sweep_interval_ms, s.max_attempts) == (30_000, 3_000, 5_000, 3)
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
        ({"renew_interval_ms": 30_000}, {}, "renew_interval_ms"),
        ({}, {"RQ_EMQ_LEASE_MS": "soon"}, "RQ_EMQ_LEASE_MS"),
        ({"max_attempts": 0}, {}, "max_attempts"),
        ({"sweep_batch": 10**6}, {}, "sweep_batch"),
        ({}, {"RQ_EMQ_STOP_ON_LEASE_LOST": "maybe"}, "stop_on_lease_lost"),
        ({"lease_msec": 1}, {}, "lease_msec"),
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
    with pytest.raises(SettingsError, match="renew_interval_ms"):
        LeaseWorker(
            ["q"], connection=connection, lease_ms=1_000, renew_interval_ms=1_000, prepare_for_work=False
        )


def test_the_max_attempts_helper_builds_meta_and_rejects_nonsense() -> None:
    assert max_attempts(4, {"tenant": "a"}) == {"tenant": "a", "emq_max_attempts": 4}
    with pytest.raises(SettingsError, match="max_attempts"):
        max_attempts(0)


@pytest.mark.parametrize(
    ("lease_ms", "renew_ms", "sweep_ms"),
    [(30_000, 3_000, 5_000), (1_000, 200, 250), (400, 100, 100), (2_000, 1_000, 5_000), (100, 10, 10)],
)
def test_the_local_lease_clock_stops_a_job_before_any_sweep_may_recover_it(
    lease_ms: int, renew_ms: int, sweep_ms: int
) -> None:
    from redis import Redis

    from rq_emq.sweep import Sweeper

    s = LeaseSettings(lease_ms=lease_ms, renew_interval_ms=renew_ms, sweep_interval_ms=sweep_ms)
    grace = Sweeper(Redis(), ["q"], s)  # never connects: only its grace is read
    trusted = s.lease_ms - s.lease_margin_ms
    # a healthy renewal (sent a renew interval after the last, answered within the socket
    # timeout) lands before the local deadline ...
    assert s.renew_interval_ms + 1000 * s.redis_timeout_s <= trusted or s.redis_timeout_s == 0.05
    # ... and the local stop (checked every check interval) comes before lease + grace
    assert trusted + 1000 * s.lease_check_interval_s < s.lease_ms + grace.grace_ms
    assert 1000 * s.redis_timeout_s <= max(s.renew_interval_ms, 50)
