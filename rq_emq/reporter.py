"""The log lines of the lock manager's threads, handed to a thread of their own.

The lock manager's two threads (its tick, which renews every lease of the process in one
round trip, and its lease clock, which stops a run past its local deadline) never call an
application's log handler: a handler may take seconds per record (a log shipper gone slow,
a full disk, a network handler with no timeout), and a renewal held up that long is a lease
lost and a healthy run killed. What those threads log (our lines, RQ's worker heartbeat's
DEBUG line, the kill of a horse) is put on a queue, and a reporter thread
(``rq-emq-reporter``, one per process, started with the lock manager) hands it to its
logger. The record keeps the time, the place in the code and the thread of the call.

- Our modules whose code those threads run log through a :class:`PathLogger`; RQ's own
  methods the tick calls log through the worker's ``log``, which on those threads is one
  too (:class:`rq_emq.hold.heartbeats.HeartbeatMixin`). On any other thread a call is the
  logger's own, at once, as before.
- redis-py logs a DEBUG line when a command or a connection fails, on the thread of the
  call and with the connection still checked out: its loggers get a filter
  (:func:`keep_libraries_off`) that hands such a record to the reporter instead of the
  handlers, made on any thread of the process whose lock manager installed it (the worker:
  its sweeper and main thread share the control connection with the renewals, and a
  slow handler there held a renewal back for the length of two records).
- The queue holds at most :data:`CAPACITY` lines: past that, new ones are dropped and
  counted (:func:`dropped`), and the reporter says how many once it has caught up. A put
  never waits: not on a handler, not on the reporter.
- A worker's stop gives the lines still queued up to :data:`EXIT_GRACE_S` (so does any
  process at its normal exit); a forked child starts with no queue and no thread of its
  parent's, and starts its own on its first line.
"""

from __future__ import annotations

import atexit
import logging
import os
import queue
import sys
import threading
import time
import traceback
from collections.abc import Iterable, Mapping
from types import FrameType
from typing import Any, NamedTuple

#: Lines a process keeps for its handlers at most; past that, new ones are dropped. A tick
#: logs one line at most in steady state (RQ's heartbeat at DEBUG): days of ticks at the
#: shortest renew interval are not this many, and a line is a few hundred bytes.
CAPACITY = 10_000

#: How long a process that ends normally waits for the lines still queued (as the event
#: hooks' grace, rq_emq.events.EXIT_GRACE_S): a blocked handler never holds a stop.
EXIT_GRACE_S = 1.0

#: redis-py's loggers that a failed command or connection of the lock manager's client
#: logs to (redis-py 5 to 8); a name this redis-py lacks costs an unused logger.
LIBRARY_LOGGERS = (
    "redis.client",
    "redis.connection",
    "redis.maint_notifications",
    "redis.utils",
    "redis._parsers.base",
    "redis._parsers.hiredis",
    "redis._parsers.resp3",
)

logger = logging.getLogger("rq_emq.lease")

_local = threading.local()


def mark_renewal_thread() -> None:
    """The calling thread is one of the lock manager's: its log lines go to the reporter."""
    _local.renewal = True


def on_renewal_thread() -> bool:
    return getattr(_local, "renewal", False)


class _Line(NamedTuple):
    """A log call made on a renewal thread, as the reporter makes its record."""

    logger: Any  # a logging.Logger, or what an application set as RQ's ``worker.log``
    level: int
    msg: object
    args: tuple[Any, ...]
    exc_info: Any
    extra: Mapping[str, object] | None
    stack: str | None
    where: tuple[str, int, str]  # file, line, function
    at: float  # time.time() of the call
    thread: tuple[int | None, str]


class PathLogger:
    """A logger for code that the lock manager's threads run: there, each call is put on
    the reporter's queue; on any other thread it is ``logger``'s own. Everything else
    (its level, its handlers, ``isEnabledFor``) is ``logger``'s."""

    __slots__ = ("logger",)

    def __init__(self, logger: logging.Logger | str) -> None:
        self.logger: Any = logging.getLogger(logger) if isinstance(logger, str) else logger

    @property
    def name(self) -> str:
        return self.logger.name

    def debug(self, msg: object, *args: object, **kwargs: Any) -> None:
        self._log(logging.DEBUG, msg, args, kwargs)

    def info(self, msg: object, *args: object, **kwargs: Any) -> None:
        self._log(logging.INFO, msg, args, kwargs)

    def warning(self, msg: object, *args: object, **kwargs: Any) -> None:
        self._log(logging.WARNING, msg, args, kwargs)

    def error(self, msg: object, *args: object, **kwargs: Any) -> None:
        self._log(logging.ERROR, msg, args, kwargs)

    def exception(self, msg: object, *args: object, exc_info: Any = True, **kwargs: Any) -> None:
        self._log(logging.ERROR, msg, args, {**kwargs, "exc_info": exc_info})

    def critical(self, msg: object, *args: object, **kwargs: Any) -> None:
        self._log(logging.CRITICAL, msg, args, kwargs)

    def log(self, level: int, msg: object, *args: object, **kwargs: Any) -> None:
        self._log(level, msg, args, kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.logger, name)

    def _log(self, level: int, msg: object, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        if getattr(_local, "renewal", False):
            _queue_line(self.logger, level, msg, args, kwargs, sys._getframe(2))
            return
        # the caller of debug(), info() ...: two frames up from here
        kwargs["stacklevel"] = kwargs.get("stacklevel", 1) + 2
        self.logger.log(level, msg, *args, **kwargs)


_path_loggers: dict[Any, PathLogger] = {}


def path_logger(of: Any) -> PathLogger:
    """The :class:`PathLogger` of ``of`` (RQ's worker logger, read on a renewal thread)."""
    found = _path_loggers.get(of)
    if found is None:
        found = _path_loggers[of] = PathLogger(of)
    return found


def _queue_line(
    to: Any,
    level: int,
    msg: object,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    frame: FrameType,
) -> None:
    """What a log call on a renewal thread leaves for the reporter: no call into logging."""
    for _ in range(int(kwargs.get("stacklevel", 1)) - 1):
        frame = frame.f_back or frame
    exc_info = kwargs.get("exc_info")
    if exc_info:
        if isinstance(exc_info, BaseException):
            exc_info = (type(exc_info), exc_info, exc_info.__traceback__)
        elif not isinstance(exc_info, tuple):
            exc_info = sys.exc_info()
    stack = None
    if kwargs.get("stack_info"):
        stack = "Stack (most recent call last):\n" + "".join(traceback.format_stack(frame)).rstrip("\n")
    code = frame.f_code
    current = threading.current_thread()
    line = _Line(
        to,
        level,
        msg,
        args,
        exc_info or None,
        kwargs.get("extra"),
        stack,
        (code.co_filename, frame.f_lineno, code.co_name),
        time.time(),
        (current.ident, current.name),
    )
    _reporter().put(line)


class _Reporter:
    """The reporter thread of one process and the bounded queue that feeds it."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.dropped = 0
        self._behind = 0  # lines dropped since the reporter last caught up
        self._counting = threading.Lock()  # the drop counts only: never held across a call
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._starting = threading.Lock()
        self.drained = False  # the process's exit grace is spent (drain_at_exit)

    def start(self) -> None:
        with self._starting:
            if self._thread is not None:
                return
            thread = threading.Thread(target=self._run, name="rq-emq-reporter", daemon=True)
            try:
                thread.start()
            except RuntimeError:  # at interpreter shutdown: nothing to hand lines to
                return
            self._thread = thread

    def put(self, item: _Line | logging.LogRecord) -> None:
        """Queue ``item`` for the reporter, or drop and count it if the queue is full."""
        if self._queue.qsize() >= CAPACITY:
            with self._counting:
                self.dropped += 1
                self._behind += 1
            return
        self._queue.put(item)
        if self._thread is None:
            self.start()  # a process whose lock manager never started it (a forked child)

    def flush(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds until every line queued before the call was
        handed on; whether it was."""
        done = threading.Event()
        self._queue.put(done)
        self.start()
        return done.wait(timeout)

    def waiting(self) -> int:
        return self._queue.qsize()

    def _run(self) -> None:
        _local.reporting = True  # a library's record handed on here is not queued again
        while True:
            item = self._queue.get()
            if isinstance(item, threading.Event):  # a flush: what was dropped is said first
                self._say_dropped()
                item.set()
                continue
            _hand_on(item)
            if self._queue.empty():
                self._say_dropped()

    def _say_dropped(self) -> None:
        """Once the reporter has caught up: how many lines it dropped while behind."""
        if not self._behind:
            return
        with self._counting:
            behind, self._behind = self._behind, 0
        logger.warning(
            "the log handlers were behind: dropped %d lines of the lock manager's threads (now caught up)",
            behind,
        )


def _hand_on(item: _Line | logging.LogRecord) -> None:
    """One queued line to its logger's handlers, on the reporter thread."""
    try:
        if isinstance(item, logging.LogRecord):
            logging.getLogger(item.name).handle(item)  # a library's, made on a renewal thread
            return
        to = item.logger
        if not isinstance(to, logging.Logger):  # a LoggerAdapter as RQ's worker.log: its own call
            to.log(item.level, item.msg, *item.args, exc_info=item.exc_info, extra=item.extra)
            return
        if not to.isEnabledFor(item.level):
            return
        file, line, function = item.where
        extra = dict(item.extra) if item.extra is not None else None
        record = to.makeRecord(
            to.name, item.level, file, line, item.msg, item.args, item.exc_info, function, extra, item.stack
        )
        record.relativeCreated -= (record.created - item.at) * 1000
        record.created = item.at
        record.msecs = int((item.at - int(item.at)) * 1000) + 0.0
        record.thread, record.threadName = item.thread
        to.handle(record)
    except Exception:  # a line that cannot be made (an ``extra`` naming a record field)
        try:
            sys.stderr.write(f"rq-emq: a log line of the lock manager could not be logged: {item!r}\n")
        except Exception:
            pass


class _LibraryLines(logging.Filter):
    """On a library's logger: a record made on a renewal thread, or on any thread of the
    process that installed the filter, goes to the reporter (but for the reporter's own
    hand-on of it)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if getattr(_local, "reporting", False):
            return True
        if getattr(_local, "renewal", False) or os.getpid() == _libraries_kept_off_in:
            _reporter().put(record)
            return False
        return True


_library_filter = _LibraryLines()
#: the process whose library lines all go to the reporter (a forked horse's do not)
_libraries_kept_off_in = 0


def keep_libraries_off(names: Iterable[str] = LIBRARY_LOGGERS) -> None:
    """Give each of these loggers the filter that takes their records made in this process
    off to the reporter (once per logger)."""
    global _libraries_kept_off_in
    _libraries_kept_off_in = os.getpid()
    for name in names:
        library = logging.getLogger(name)
        if _library_filter not in library.filters:
            library.addFilter(_library_filter)


_current: _Reporter | None = None
_guard = threading.Lock()


def _reporter() -> _Reporter:
    """This process's reporter (a forked child's own)."""
    global _current
    current = _current
    if current is not None and current.pid == os.getpid():
        return current
    with _guard:
        if _current is None or _current.pid != os.getpid():
            _current = _Reporter()
        return _current


def start() -> None:
    """Start this process's reporter thread now (the lock manager does, as it starts: a
    renewal thread then never starts one)."""
    _reporter().start()


def flush(timeout: float = 5.0) -> bool:
    """Wait up to ``timeout`` seconds until the lines of the lock manager's threads queued
    before the call have reached their handlers; whether they have."""
    current = _current
    return current is None or current.pid != os.getpid() or current.flush(timeout)


def dropped() -> int:
    """How many lines this process dropped because its log handlers were behind."""
    current = _current
    return 0 if current is None or current.pid != os.getpid() else current.dropped


def drain_at_exit() -> bool:
    """At a process's normal end: up to :data:`EXIT_GRACE_S` for the lines still queued,
    once per process (a worker's teardown, then ``atexit``, share the one grace)."""
    current = _current
    if current is None or current.pid != os.getpid() or current.drained:
        return True
    current.drained = True
    if current.flush(EXIT_GRACE_S):
        return True
    try:
        sys.stderr.write(
            f"rq-emq: {current.waiting()} log lines of the lock manager not logged as this process "
            f"ends (its log handlers were behind; waited {EXIT_GRACE_S:.1f} s)\n"
        )
    except Exception:
        pass
    return False


def _forget_in_child() -> None:
    global _current, _guard
    _guard = threading.Lock()
    _current = None
    _local.__dict__.clear()


os.register_at_fork(after_in_child=_forget_in_child)
atexit.register(drain_at_exit)
