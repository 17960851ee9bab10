"""rq-dashboard (its Flask app and JSON endpoints) shows leased, recovered and failed
jobs where its users expect them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import redis
from integration_scenarios import QUEUE, check_viewer_through_a_crash, require
from procs import Processes

pytestmark = [pytest.mark.slow, pytest.mark.rq_versions]


class DashboardViewer:
    """rq-dashboard's JSON API, through Flask's test client."""

    def __init__(self, url: str) -> None:
        require("rq_dashboard")
        from flask import Flask
        from rq_dashboard import blueprint, default_settings
        from rq_dashboard.web import setup_rq_connection

        app = Flask("rq-dashboard-under-test")
        app.config.from_object(default_settings)
        app.config["RQ_DASHBOARD_REDIS_URL"] = url
        app.register_blueprint(blueprint, url_prefix="/rq")
        setup_rq_connection(app)
        self.client = app.test_client()

    def get(self, path: str) -> Any:
        response = self.client.get("/rq" + path)
        assert response.status_code == 200, response.data[:2000]
        return response.get_json()

    def listed(self, registry: str) -> set[str]:
        data = self.get(f"/0/data/jobs/{QUEUE}/{registry}/100/asc/1.json")
        return {job["id"] for job in data["jobs"]}

    def job_status(self, job_id: str) -> str:
        return str(self.get(f"/0/data/job/{job_id}.json")["status"])

    def counts(self) -> dict[str, int]:
        (queue,) = [q for q in self.get("/0/data/queues.json")["queues"] if q["name"] == QUEUE]
        return {key: value for key, value in queue.items() if key.endswith("count")}


def test_rq_dashboard_lists_leased_recovered_finished_and_failed_jobs(
    r: redis.Redis, redis_url: str, procs: Processes, tmp_path: Path
) -> None:
    viewer = DashboardViewer(redis_url)
    _, failed_id = check_viewer_through_a_crash(r, redis_url, procs, tmp_path, viewer)
    assert "stalled on attempt 1 of 1" in viewer.get(f"/0/data/job/{failed_id}.json")["exc_info"]
    counts = viewer.counts()
    assert counts["count"] == 0 and counts["started_job_registry_count"] == 0
    assert counts["finished_job_registry_count"] == 1 and counts["failed_job_registry_count"] == 1
