"""The RQ-suite runner (python -m rqsuite, docs/testing.md): every process of a run talks
to its private Redis, never to 6379, and runs our workers where RQ's tests name stock
ones; a stock pass that fails ours fails the run unless the allowlist names it, and every
white-box entry is documented."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from rqsuite.suite import HOOK
from rqsuite.verdict import WHITE_BOX, judge, read_allowlist

ROOT = Path(__file__).resolve().parents[2]  # tests/tooling/ -> the repository

PROBE = """
import redis, rq, rq.worker, rq.worker_pool, rq_emq
ports = {
    "default": redis.Redis().connection_pool.make_connection().port,
    "url": redis.Redis.from_url("redis://127.0.0.1:6379/5").connection_pool.make_connection().port,
    "other": redis.Redis(port=6390).connection_pool.make_connection().port,
}
print(ports["default"], ports["url"], ports["other"])
print(rq.Worker is rq_emq.LeaseWorker, rq.worker.Worker is rq_emq.LeaseWorker,
      rq.SimpleWorker is rq_emq.SimpleLeaseWorker, rq.worker.SimpleWorker is rq_emq.SimpleLeaseWorker,
      rq.worker_pool.WorkerPool.__init__.__defaults__.count(rq_emq.LeaseWorker) == 1)
"""


def probe(tmp_path: Path, workers: str, xdist_worker: str | None = None) -> list[str]:
    env = {
        **os.environ,
        "PYTHONPATH": str(HOOK),
        "RQSUITE_REDIS_PORTS": "-=7001,gw1=7002",
        "RQSUITE_WORKERS": workers,
    }
    env.pop("PYTEST_XDIST_WORKER", None)
    if xdist_worker:
        env["PYTEST_XDIST_WORKER"] = xdist_worker
    # making a connection object never connects: nothing here reaches any Redis
    done = subprocess.run(
        [sys.executable, "-c", PROBE], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.split("\n")


def test_every_connection_to_local_6379_goes_to_the_private_server(tmp_path: Path) -> None:
    assert probe(tmp_path, "stock")[0] == "7001 7001 6390"
    assert probe(tmp_path, "stock", xdist_worker="gw1")[0] == "7002 7002 6390"


def test_ours_swaps_rqs_worker_classes_everywhere_and_stock_leaves_them(tmp_path: Path) -> None:
    assert probe(tmp_path, "ours")[1] == "True True True True True"
    assert probe(tmp_path, "stock")[1] == "False False False False False"


def test_a_stock_pass_failing_ours_fails_the_run_unless_listed() -> None:
    passed, failed = {"outcome": "passed", "why": ""}, {"outcome": "failed", "why": "AssertionError"}
    stock = {"a": passed, "b": passed, "c": passed, "d": failed}
    ours = {"a": passed, "b": failed, "c": failed, "d": failed}
    verdict = judge(stock, ours, {"c": (WHITE_BOX, "why"), "a": ("issue-x", "why")})
    assert verdict.failed == {"b": "failed: AssertionError"}  # d failed stock too: not ours to answer
    assert verdict.allowed == {"c": WHITE_BOX}
    assert verdict.stale == ["a"]  # listed, yet passes: the runner says to drop it


def test_every_white_box_test_is_named_in_docs_with_a_reason() -> None:
    docs = (ROOT / "docs" / "testing.md").read_text()
    entries = read_allowlist()
    white_box = [node for node, (section, _) in entries.items() if section == WHITE_BOX]
    assert white_box
    assert all(why for _, why in entries.values())
    assert [node for node in white_box if f"`{node}`" not in docs] == []


def test_the_stock_baseline_comes_from_the_cache_then_the_repository_unless_asked_anew(
    tmp_path: Path,
) -> None:
    from rqsuite.__main__ import baseline_file, parse_args

    cache, repository = tmp_path / "cache", tmp_path / "baselines"
    cache.mkdir(), repository.mkdir()
    args = parse_args(["-n", "2", "--cache", str(cache)])
    name = "rq-3.0.0.stock-n2.json"
    assert baseline_file(args, "3.0.0", repository) is None
    (repository / name).write_text("{}")
    assert baseline_file(args, "3.0.0", repository) == repository / name
    (cache / name).write_text("{}")
    assert baseline_file(args, "3.0.0", repository) == cache / name
    assert baseline_file(args, "3.0.1", repository) is None  # another release runs its stock pass
    anew = parse_args(["-n", "2", "--cache", str(cache), "--refresh-stock"])
    assert baseline_file(anew, "3.0.0", repository) is None
