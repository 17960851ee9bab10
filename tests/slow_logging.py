"""An application whose logging is slow: a worker's ``-c slow_logging`` settings module.

RQ's ``rq worker -c slow_logging`` reads ``DICT_CONFIG`` here and hands it to
``logging.config.dictConfig``: every record of the process (RQ's ``rq.worker`` lines and
rq_emq's included, since RQ and rq_emq leave an application's root handler alone) then goes
through :class:`SlowHandler`, which, while the file named by EMQ_TEST_SLOW_LOG_WHILE exists,
takes EMQ_TEST_SLOW_LOG_SECONDS per record (a log shipper that went slow). Each record is
also written to stderr (the worker's log, for a failure report) and one line of it to the
file named by EMQ_TEST_SLOW_LOG_SEEN: the thread that handled it, whether it was slowed,
its logger and its message.

:func:`slow_logs_while_running` is the job that makes the logging slow for as long as it
runs.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from pathlib import Path

DICT_CONFIG = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"slow": {"class": "slow_logging.SlowHandler", "level": "DEBUG"}},
    "root": {"level": "DEBUG", "handlers": ["slow"]},
}


class SlowHandler(logging.Handler):
    def emit(self, record: logging.LogRecord) -> None:
        slowed = os.path.exists(os.environ["EMQ_TEST_SLOW_LOG_WHILE"])
        if slowed:
            time.sleep(float(os.environ["EMQ_TEST_SLOW_LOG_SECONDS"]))
        try:
            text = record.getMessage()
        except Exception:
            text = str(record.msg)
        line = f"{threading.current_thread().name} {'slowed' if slowed else 'quick'} {record.name}: {text}"
        sys.stderr.write(f"{time.strftime('%H:%M:%S')} {record.levelname} {line}\n")
        with open(os.environ["EMQ_TEST_SLOW_LOG_SEEN"], "a") as out:
            out.write(line.replace("\n", " ") + "\n")


def slow_logs_while_running(log: str, seconds: float) -> str:
    """One line per run in ``log``; the process's logging is slow while it runs."""
    slow = Path(os.environ["EMQ_TEST_SLOW_LOG_WHILE"])
    with open(log, "a") as out:
        out.write(f"start {os.getpid()}\n")
    slow.touch()
    try:
        time.sleep(seconds)
    finally:
        slow.unlink(missing_ok=True)
    with open(log, "a") as out:
        out.write(f"end {os.getpid()}\n")
    return "done"
