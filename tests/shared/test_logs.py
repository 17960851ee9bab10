"""The worker's log handler (:mod:`rq_emq.run.logs`) in one process: RQ's format with the
level and the worker, JSON lines, and nothing touched where the application (or a mere
producer) owns logging. The real ``rq worker`` lines: tests/run/test_worker_logs.py."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from collections.abc import Iterator

import pytest

from rq_emq.run import logs


@pytest.fixture
def bare_logging() -> Iterator[logging.Logger]:
    """A process whose root logger has no handler (as under ``rq worker``), restored after."""
    root, ours = logging.getLogger(), logging.getLogger(logs.LOGGER)
    saved = (root.handlers[:], ours.handlers[:], ours.level, ours.propagate)
    try:
        yield ours
    finally:
        for handler in logs._attached:
            ours.removeHandler(handler)
        logs._attached.clear()
        root.handlers[:], ours.handlers[:] = saved[0], saved[1]
        ours.setLevel(saved[2])
        ours.propagate = saved[3]


@pytest.mark.parametrize(
    ("given", "made"),
    [
        ("%(asctime)s %(message)s", "%(asctime)s %(levelname)s Worker %(worker)s: %(message)s"),
        ("%(levelname)s %(message)s", "%(levelname)s Worker %(worker)s: %(message)s"),
        ("%(worker)s %(levelname)s %(message)s", "%(worker)s %(levelname)s %(message)s"),
        ("%(asctime)s", "%(asctime)s"),
    ],
)
def test_rqs_format_gets_the_level_and_the_worker_unless_it_shows_them(given: str, made: str) -> None:
    assert logs.text_format(given) == made


def test_json_lines_carry_time_level_logger_worker_message_and_the_job(
    bare_logging: logging.Logger, capsys: pytest.CaptureFixture[str]
) -> None:
    logging.getLogger().handlers.clear()  # pytest's own, added for the test's call
    assert logs.setup("w1", "INFO", "%H:%M:%S", "%(asctime)s %(message)s", "json")
    logging.getLogger("rq_emq.lease").info("job %s: taken", "j1", extra={"job_id": "j1", "queue": "q"})
    entry = json.loads(capsys.readouterr().out)
    assert {k: entry[k] for k in ("level", "logger", "worker", "message", "job_id", "queue")} == {
        "level": "INFO",
        "logger": "rq_emq.lease",
        "worker": "w1",
        "message": "job j1: taken",
        "job_id": "j1",
        "queue": "q",
    }


def test_where_the_application_configured_logging_nothing_is_added(bare_logging: logging.Logger) -> None:
    logging.getLogger().handlers[:] = [logging.NullHandler()]  # logging.basicConfig, DICT_CONFIG...
    assert not logs.setup("w1", "INFO", "%H:%M:%S", "%(asctime)s %(message)s")
    assert bare_logging.handlers == [] and bare_logging.propagate and bare_logging.level == logging.NOTSET


def test_a_worker_set_up_again_keeps_one_pair_of_handlers(bare_logging: logging.Logger) -> None:
    logging.getLogger().handlers.clear()  # pytest's own, added for the test's call
    for name in ("w1", "w2"):
        assert logs.setup(name, "WARNING", "%H:%M:%S", "%(asctime)s %(message)s")
    assert len(bare_logging.handlers) == 2 and bare_logging.level == logging.WARNING


def test_a_producer_importing_rq_emq_gets_no_handler() -> None:
    code = "import logging, rq_emq; l = logging.getLogger('rq_emq'); print(l.handlers, l.propagate, l.level)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[] True 0"
