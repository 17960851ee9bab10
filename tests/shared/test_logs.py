"""The worker's log handler (:mod:`rq_emq.run.logs`) in one process: RQ's format with the
level and the worker, JSON lines, and nothing touched where the application (or a mere
producer) owns logging. The real ``rq worker`` lines: tests/run/test_worker_logs.py."""

from __future__ import annotations

import json
import logging
import os
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


@pytest.fixture
def json_mode() -> Iterator[None]:
    """JSON mode in this process, turned off after the test."""
    logs.write_json(True)
    try:
        yield
    finally:
        logs.write_json(False)


def test_in_json_mode_rqs_own_handlers_write_json_and_give_their_format_back_after(
    bare_logging: logging.Logger, capsys: pytest.CaptureFixture[str]
) -> None:
    from rq.logutils import setup_loghandlers

    logging.getLogger().handlers.clear()  # pytest's own: RQ adds its handlers where none is
    rq_logger = logging.getLogger("rq.emq-test")
    setup_loghandlers("INFO", "%H:%M:%S", "%(asctime)s %(message)s", name=rq_logger.name)
    try:
        logs.write_json(True)
        try:
            rq_logger.info("Worker w1: started")
            rq_logger.error("job j1 failed", exc_info=ValueError("boom"))
        finally:
            logs.write_json(False)
        out, err = capsys.readouterr()
        (started,), (failed,) = (
            [json.loads(line) for line in out.splitlines()],
            [json.loads(line) for line in err.splitlines()],
        )
        assert (started["logger"], started["level"], started["message"]) == (
            "rq.emq-test",
            "INFO",
            "Worker w1: started",
        )
        assert failed["level"] == "ERROR" and "ValueError: boom" in failed["exception"]
        rq_logger.info("Worker w1: stopped")
        assert capsys.readouterr().out.endswith(" Worker w1: stopped\n")  # RQ's format again
    finally:
        rq_logger.handlers.clear()


def test_in_json_mode_a_line_logged_with_no_handler_and_a_python_warning_are_json(
    json_mode: None, capsys: pytest.CaptureFixture[str]
) -> None:
    assert logging.lastResort is not None
    logging.lastResort.handle(
        logging.makeLogRecord({"name": "rq_emq.startup", "msg": "misspelled", "levelno": 30})
    )
    (entry,) = [json.loads(line) for line in capsys.readouterr().err.splitlines()]
    assert entry["logger"] == "rq_emq.startup" and entry["message"] == "misspelled"
    assert logging.getLogger("py.warnings").handlers == [] and logging._warnings_showwarning is not None  # type: ignore[attr-defined]


def test_a_producer_importing_rq_emq_leaves_rqs_handlers_and_the_environment_alone() -> None:
    code = (
        "import logging, os, rq_emq, rq.logutils as u; "
        "print(u.ColorizingStreamHandler.format.__module__, logging.lastResort.formatter, "
        "'RQ_EMQ_POOL_CHECKED' in os.environ)"
    )
    env = {**os.environ, "RQ_EMQ_LOG_FORMAT": "json"}
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env
    ).stdout
    assert out.split() == ["rq.logutils", "None", "False"]
