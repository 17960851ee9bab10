"""What ``false_recoveries.py`` runs in its workers (benchmarks/ is on their PYTHONPATH).

- the jobs: :func:`work` sleeps, :func:`hold_gil` holds the GIL in C code (catastrophic
  regex backtracking); each appends one line to the runs log (``FR_RUNS``) as it starts
  and one as it ends: ``start|end <job id> <pid> <time>``;
- :func:`on_event`, a lease event hook (``RQ_EMQ_EVENT_HOOKS``): one line per event to
  ``FR_EVENTS`` (``<kind> <queue> <job id> <source>``);
- ``DICT_CONFIG``: the logging of a worker started with ``-c false_recovery_load
  --logging_level DEBUG``: every record of the process goes through :class:`SlowHandler`,
  which writes it to stderr (the worker's log: when it was logged, on which thread) and
  then takes ``FR_SLOW_LOG_SECONDS`` (a log shipper gone slow).
"""

from __future__ import annotations

import logging
import os
import re
import sys
import time

from rq import get_current_job

DICT_CONFIG = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"slow": {"class": "false_recovery_load.SlowHandler", "level": "DEBUG"}},
    "root": {"level": "DEBUG", "handlers": ["slow"]},
}

#: What :func:`hold_gil` matches: exponential in ``n`` (about twice as long per extra ``a``).
BACKTRACKING = re.compile(r"(a+)+$")


class SlowHandler(logging.Handler):
    def emit(self, record: logging.LogRecord) -> None:
        try:
            text = record.getMessage()
        except Exception:
            text = str(record.msg)
        when = time.strftime("%H:%M:%S", time.localtime(record.created))
        sys.stderr.write(f"{when} [{record.threadName}] {record.levelname} {record.name}: {text}\n")
        sys.stderr.flush()
        time.sleep(float(os.environ.get("FR_SLOW_LOG_SECONDS", "2")))


def _line(what: str) -> None:
    job = get_current_job()
    job_id = job.id if job is not None else "?"
    with open(os.environ["FR_RUNS"], "a") as out:
        out.write(f"{what} {job_id} {os.getpid()} {time.time():.3f}\n")


def work(seconds: float) -> str:
    _line("start")
    time.sleep(seconds)
    _line("end")
    return "done"


def backtrack(n: int) -> None:
    """Hold the GIL in C code for as long as ``n`` makes it (no match: all paths tried)."""
    BACKTRACKING.match("a" * n + "b")


def hold_gil(n: int) -> str:
    _line("start")
    backtrack(n)
    _line("end")
    return "done"


def on_event(event: object) -> None:
    kind = getattr(event, "kind", "?")
    if kind == "reported":
        return
    queue, job_id, source = (getattr(event, name, "?") for name in ("queue", "job_id", "source"))
    line = f"{kind} {queue} {job_id} {source}"
    with open(os.environ["FR_EVENTS"], "a") as out:
        out.write(line + "\n")
