"""rq_emq's log lines under ``rq worker``: a handler that follows RQ's logging options.

RQ's CLI gives its own ``rq.worker`` logger a handler (``--log-format``, ``--date-format``)
and a level (``--logging_level``, ``--quiet``, ``--verbose``), and hands the worker's
``bootstrap`` the same options. rq_emq's loggers (``rq_emq.*``) got nothing: their lines
went through Python's last-resort handler, with no time, no level and no worker, and
every INFO line (a recovery, a lease taken) was dropped.

:func:`setup`, called by the worker's bootstrap, gives the ``rq_emq`` logger what RQ gives
its own, from the same options: the same streams (below ERROR to stdout, the rest to
stderr), the same level, RQ's format with the level and the worker's name before the
message (``12:00:01 WARNING Worker w1: job ...``), or one JSON object per line
(``RQ_EMQ_LOG_FORMAT=json``). Where the application set up logging itself (a handler on
the root logger, ``logging.basicConfig``, RQ's ``DICT_CONFIG``, or on ``rq_emq``), it is
left alone: our lines go where the application sends them, once. Nothing is touched in a
process that only imports rq_emq (a producer).

In JSON mode the whole stream is JSON, not only our lines (:func:`write_json`): RQ's own
handlers (``setup_loghandlers``'s, on ``rq.worker``, ``rq.job``, ``rq.scheduler``,
``rq.worker_pool``), Python's last-resort handler (a line logged before any handler
exists, or in a spawned horse RQ gives none) and Python's warnings write one object per
line too.
"""

from __future__ import annotations

import json
import logging
import sys
from datetime import datetime, timezone
from typing import Any

LOGGER = "rq_emq"

#: The record attributes a JSON line carries when a log call gave them (``extra=``).
JSON_EXTRAS = ("job_id", "queue")

#: The handlers :func:`setup` attached in this process (replaced by a later setup: a
#: worker built again in one process, as RQ's own tests and a pool's members do).
_attached: list[logging.Handler] = []

#: The name of the worker this process runs (:func:`setup`): the ``worker`` of a JSON line
#: whose record does not carry one (RQ's lines, which name it in their message only).
_worker: str | None = None


class WorkerName(logging.Filter):
    """Gives every record of ours the worker's name (``%(worker)s``, the JSON ``worker``)."""

    def __init__(self, worker: str) -> None:
        super().__init__()
        self.worker = worker

    def filter(self, record: logging.LogRecord) -> bool:
        if not hasattr(record, "worker"):
            record.worker = self.worker
        return True


class JsonFormatter(logging.Formatter):
    """One JSON object per record: time (UTC, ISO 8601, ms), level, logger, worker,
    message, and ``job_id`` / ``queue`` when the log call gave them; a traceback, if any,
    as ``exception`` (a pipeline gets one line per record, whatever it holds)."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, timezone.utc).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "worker": getattr(record, "worker", None) or _worker,
            "message": record.getMessage(),
        }
        for key in JSON_EXTRAS:
            value = getattr(record, key, None)
            if value is not None:
                entry[key] = value
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str)


def text_format(log_format: str) -> str:
    """RQ's ``--log-format`` (default ``%(asctime)s %(message)s``) with the level and the
    worker's name put before the message, each unless the format shows it already."""
    if "%(message)" not in log_format:
        return log_format  # the operator's format leaves the message out: theirs to decide
    added = ("" if "%(levelname)" in log_format else "%(levelname)s ") + (
        "" if "%(worker)" in log_format else "Worker %(worker)s: "
    )
    return log_format.replace("%(message)", added + "%(message)", 1)


def has_handler(logger: logging.Logger) -> bool:
    """Whether a record of ``logger`` meets a handler up its hierarchy (what RQ's
    ``setup_loghandlers`` checks before it adds its own)."""
    current: logging.Logger | None = logger
    while current is not None:
        if current.handlers:
            return True
        current = current.parent if current.propagate else None
    return False


def level_of(logging_level: int | str | None) -> int:
    """The level the worker logs at: its ``logging_level`` (``--logging_level``), else the
    one RQ's CLI gave ``rq.worker`` (``--quiet``, ``--verbose``, or RQ's INFO)."""
    if logging_level is not None:
        probe = logging.Logger("probe")
        try:
            probe.setLevel(logging_level if isinstance(logging_level, int) else str(logging_level).upper())
            return probe.level
        except (TypeError, ValueError):
            pass  # RQ's own setup refuses it, in its words
    return logging.getLogger("rq.worker").getEffectiveLevel()


def setup(
    worker: str, logging_level: int | str | None, date_format: str, log_format: str, style: str = "text"
) -> bool:
    """Give the ``rq_emq`` logger RQ's streams, level and format, naming ``worker``, unless
    the application's logging already handles it; whether it did."""
    global _worker
    _worker = worker
    logger = logging.getLogger(LOGGER)
    for handler in _attached:
        logger.removeHandler(handler)
    if _attached:
        _attached.clear()
    elif has_handler(logger):
        return False  # the application's logging: its handlers, its format, its level
    if style == "json":
        formatter: logging.Formatter = JsonFormatter()
    else:
        formatter = logging.Formatter(fmt=text_format(log_format), datefmt=date_format)
    for stream, wanted in ((sys.stdout, lambda r: r.levelno < logging.ERROR), (sys.stderr, None)):
        handler = logging.StreamHandler(stream)
        handler.setFormatter(formatter)
        handler.addFilter(WorkerName(worker))
        handler.addFilter(wanted or (lambda r: r.levelno >= logging.ERROR))
        logger.addHandler(handler)
        _attached.append(handler)
    # as RQ does for its own: an application that adds a root handler later gets no copies
    logger.propagate = False
    logger.setLevel(level_of(logging_level))
    return True


#: RQ's own ``ColorizingStreamHandler.format`` while :func:`write_json` replaces it (None:
#: RQ's format is in place).
_rq_format: Any = None


def write_json(on: bool) -> None:
    """Make every line this process writes to its log stream one JSON object (``on``), or
    give the lines back their own formats. A worker turns it on as it is built, in JSON
    mode, before its first line; so does ``rq worker-pool``'s own process for its lines and
    its members' (:func:`rq_emq.run.startup.under_rq_worker_pool`).

    - RQ's handlers: every release RQ supports makes them in ``rq.logutils.setup_loghandlers``,
      one ``ColorizingStreamHandler`` per stream, for ``rq.worker`` (the CLI, before the
      worker exists), ``rq.job`` (the worker's bootstrap, after ours), ``rq.scheduler`` and
      ``rq.worker_pool``. The class's ``format`` is replaced, so that a handler made later
      in this process, or in a process forked from it (the horse, the scheduler, a pool's
      member), writes JSON too; a record keeps its traceback as ``exception``.
    - Python's last-resort handler, which writes what a logger with no handler logs: a
      warning logged as the worker is built (a misspelled setting), a spawned horse's lines.
    - Python's warnings, which go to stderr as text unless logging takes them.

    An application's own handlers keep their formats."""
    global _rq_format
    from rq.logutils import ColorizingStreamHandler

    if on and _rq_format is None:
        _rq_format = vars(ColorizingStreamHandler).get("format", _inherited)
        ColorizingStreamHandler.format = _format_as_json  # type: ignore[method-assign]
        if logging.lastResort is not None:
            logging.lastResort.setFormatter(_JSON)
        logging.captureWarnings(True)
    elif not on and _rq_format is not None:
        if _rq_format is _inherited:
            del ColorizingStreamHandler.format
        else:
            ColorizingStreamHandler.format = _rq_format  # type: ignore[method-assign]
        _rq_format = None
        if logging.lastResort is not None:
            logging.lastResort.setFormatter(None)  # type: ignore[arg-type]
        logging.captureWarnings(False)


_JSON = JsonFormatter()
_inherited = object()  # RQ's handler class defined no format of its own


def _format_as_json(handler: logging.Handler, record: logging.LogRecord) -> str:
    return _JSON.format(record)


class RqLines(logging.Filter):
    """On RQ's ``rq.worker`` logger: drops RQ's lines that would say the wrong thing about
    a job this worker handled (``misleads(record)``), each replaced by a line of ours that
    says what became of the job. A check that fails keeps the line."""

    def __init__(self, misleads: Any) -> None:
        super().__init__()
        self.misleads = misleads

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            return not self.misleads(record)
        except Exception:
            return True
