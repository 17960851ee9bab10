"""The reporter thread (rq_emq/reporter.py): what a renewal thread logs is queued, never
handled there, and a handler that blocks costs the renewal thread nothing: a full queue
drops and counts. Anywhere else a log call is the logger's own."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator

import pytest

from rq_emq import reporter

LOGGER = "rq_emq.test_reporter"


class Blocking(logging.Handler):
    """Records each record with the thread that handled it; blocks while ``gate`` is clear."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.gate = threading.Event()
        self.gate.set()
        self.seen: list[tuple[str, logging.LogRecord]] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.gate.wait()
        self.seen.append((threading.current_thread().name, record))


@pytest.fixture
def handler() -> Iterator[Blocking]:
    blocking = Blocking()
    logger = logging.getLogger(LOGGER)
    logger.addHandler(blocking)
    logger.setLevel(logging.DEBUG)
    yield blocking
    blocking.gate.set()
    reporter.flush()
    logger.removeHandler(blocking)
    logger.setLevel(logging.NOTSET)


def on_renewal_thread(work: object, name: str = "renewal") -> None:
    def run() -> None:
        reporter.mark_renewal_thread()
        work()  # type: ignore[operator]

    thread = threading.Thread(target=run, name=name)
    thread.start()
    thread.join(10)
    assert not thread.is_alive()


def test_a_line_off_the_renewal_threads_is_the_loggers_own(handler: Blocking) -> None:
    reporter.PathLogger(LOGGER).warning("at once %d", 1)
    ((thread, record),) = handler.seen
    assert thread == threading.current_thread().name and record.getMessage() == "at once 1"
    assert record.funcName == "test_a_line_off_the_renewal_threads_is_the_loggers_own"


def test_a_renewal_threads_line_is_handled_by_the_reporter_as_it_was_made(handler: Blocking) -> None:
    log = reporter.PathLogger(LOGGER)
    made: list[float] = []

    def work() -> None:
        made.append(time.time())
        try:
            raise ValueError("boom")
        except ValueError:
            log.exception("job %s failed", "j1", extra={"job_id": "j1"})

    on_renewal_thread(work)
    assert reporter.flush()
    ((thread, record),) = handler.seen
    assert thread == "rq-emq-reporter" and record.threadName == "renewal"
    assert record.getMessage() == "job j1 failed" and record.job_id == "j1"  # type: ignore[attr-defined]
    assert record.exc_info is not None and record.exc_info[0] is ValueError
    assert record.funcName == "work" and record.levelno == logging.ERROR
    assert abs(record.created - made[0]) < 1.0  # the time of the call, not of its handling


def test_a_blocked_handler_never_holds_a_renewal_thread_and_a_full_queue_drops_and_counts(
    handler: Blocking, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(reporter, "CAPACITY", 5)
    log = reporter.PathLogger(LOGGER)
    before = reporter.dropped()
    handler.gate.clear()  # the application's handler blocks
    took: list[float] = []

    def work() -> None:
        started = time.monotonic()
        for n in range(20):
            log.info("line %d", n)
        took.append(time.monotonic() - started)

    on_renewal_thread(work)  # returns, although no line could be handled
    assert took and took[0] < 1.0
    # the one the reporter holds (blocked in the handler), 5 queued, the rest dropped
    assert 20 - 6 <= reporter.dropped() - before <= 20 - 5
    handler.gate.set()
    assert reporter.flush()
    lines = [record.getMessage() for _, record in handler.seen]
    assert lines[0] == "line 0" and len(lines) == 20 - (reporter.dropped() - before)
    assert all(thread == "rq-emq-reporter" for thread, _ in handler.seen)


def test_the_reporter_says_how_many_lines_it_dropped_once_it_has_caught_up(
    handler: Blocking, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(reporter, "CAPACITY", 2)
    ours = logging.getLogger("rq_emq.lease")  # where the reporter says it
    ours.addHandler(handler)
    try:
        log = reporter.PathLogger(LOGGER)
        before = reporter.dropped()
        handler.gate.clear()
        on_renewal_thread(lambda: [log.info("line %d", n) for n in range(10)])
        dropped = reporter.dropped() - before
        handler.gate.set()
        assert reporter.flush()  # said before the flush returns
    finally:
        ours.removeHandler(handler)
    said = [r.getMessage() for _, r in handler.seen if "log handlers were behind" in r.getMessage()]
    assert dropped >= 10 - 3 and said == [
        f"the log handlers were behind: dropped {dropped} lines of the lock manager's threads (now caught up)"
    ]


def test_a_librarys_line_made_on_any_thread_of_the_worker_goes_to_the_reporter(handler: Blocking) -> None:
    """redis-py's line about a failed command is logged on the thread of the call with the
    connection still checked out: on the worker's sweeper or main thread, which share the
    control connection with the renewals, a slow handler there held a renewal back. Every
    thread's such line goes to the reporter, with the thread that made it."""
    library = logging.getLogger(LOGGER + ".library")
    reporter.keep_libraries_off([library.name])
    reporter.keep_libraries_off([library.name])  # once per logger
    assert len(library.filters) == 1
    try:
        on_renewal_thread(lambda: library.debug("reconnecting"))
        library.debug("here")
        assert reporter.flush()
        assert [(thread, r.threadName, r.getMessage()) for thread, r in handler.seen] == [
            ("rq-emq-reporter", "renewal", "reconnecting"),
            ("rq-emq-reporter", threading.current_thread().name, "here"),
        ]
    finally:
        library.filters.clear()
        reporter._libraries_kept_off_in = 0
