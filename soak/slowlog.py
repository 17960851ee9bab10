"""The settings module (``rq worker -c soak.slowlog --logging_level DEBUG``) of the soak's
DEBUG workers (``--debug-workers``): an application whose log handler goes slow.

RQ's CLI hands ``DICT_CONFIG`` to ``logging.config.dictConfig``: every record of the worker
process and its horses, RQ's ``rq.worker`` lines and rq_emq's included (both leave an
application's root handler alone), then goes through :class:`SlowHandler`. While the file
named by ``SOAK_SLOW_LOG_FLAG`` exists (the ``slow_log`` fault, :mod:`soak.chaos`) each
record takes ``SOAK_SLOW_LOG_SECONDS`` (a log shipper gone slow); otherwise it is written
at once. Every record goes to stderr, the worker's log. The module imports nothing of the
soak's: the worker's CLI imports it before anything else.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time

DICT_CONFIG = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"slow": {"class": "soak.slowlog.SlowHandler", "level": "DEBUG"}},
    "root": {"level": "DEBUG", "handlers": ["slow"]},
}

#: Seconds per record while the fault lasts: above the soak's lease (1.5 s), so a record
#: on the renewal path would cost a renewal its lease.
DEFAULT_SECONDS = 2.0


class SlowHandler(logging.Handler):
    def emit(self, record: logging.LogRecord) -> None:
        flag = os.environ.get("SOAK_SLOW_LOG_FLAG", "")
        slowed = bool(flag) and os.path.exists(flag)
        if slowed:
            time.sleep(float(os.environ.get("SOAK_SLOW_LOG_SECONDS", DEFAULT_SECONDS)))
        try:
            text = record.getMessage()
        except Exception:  # noqa: BLE001 - a record that cannot format is still shown
            text = str(record.msg)
        where = f"[{threading.current_thread().name}]{' (slowed)' if slowed else ''}"
        sys.stderr.write(f"{time.strftime('%H:%M:%S')} {record.levelname} {where} {record.name}: {text}\n")
