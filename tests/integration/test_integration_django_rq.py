"""django-rq (its admin views and statistics) shows leased, recovered and failed jobs
where its users expect them; its views run RQ's stock registry cleanup on every visit,
which must never fail a job whose lease, or whose recovery, is ours."""

from __future__ import annotations

from pathlib import Path

import pytest
import redis
from django_rq_viewer import DjangoRQViewer
from integration_scenarios import check_viewer_through_a_crash
from procs import Processes

pytestmark = [pytest.mark.slow, pytest.mark.rq_versions]


def test_django_rq_lists_leased_recovered_finished_and_failed_jobs(
    r: redis.Redis, redis_url: str, procs: Processes, tmp_path: Path
) -> None:
    viewer = DjangoRQViewer(redis_url)
    _, failed_id = check_viewer_through_a_crash(r, redis_url, procs, tmp_path, viewer)
    assert "stalled on attempt 1 of 1" in viewer.failure_text(failed_id)
    stats = viewer.statistics()
    assert stats["jobs"] == 0 and stats["started_jobs"] == 0
    assert stats["finished_jobs"] == 1 and stats["failed_jobs"] == 1
