"""Imported at start-up by every process a test starts (``tests/`` leads their
PYTHONPATH, :meth:`procs.Processes.env`): stock RQ's workers, the baseline of many tests,
exit as they do with redis-py before 8.2.

redis-py 8.2's ``PubSubWorkerThread.stop()`` joins the thread, with no bound unless given
one. Stock RQ calls it right after its UNSUBSCRIBE: when the thread takes that reply first
(on a loaded host), it goes back to its 60 s read and the worker's exit waits it out (two
stock bursts of one full suite timed out at 60 s). Here a ``stop()`` given no timeout only
tells the thread, as before 8.2; RQ's own ``join(timeout=1)`` follows it. rq-emq's workers
pass a timeout (:func:`rq_emq.compat.ask_pubsub_thread_to_stop`), so they run unchanged,
and the in-process test of their stop meets redis-py as installed.

Every such process also writes the stacks of all its threads to its log on SIGWINCH
(:meth:`procs.Processes.stacks`): what a test that timed out on a live process shows of
where each thread stood. No worker reacts to SIGWINCH otherwise (its default is to ignore
it)."""

from __future__ import annotations

import faulthandler
import inspect
import signal
import sys
from typing import Any

if hasattr(signal, "SIGWINCH"):
    faulthandler.register(signal.SIGWINCH, file=sys.stderr, all_threads=True)

try:
    from redis.client import PubSubWorkerThread
except ImportError:  # a process without redis-py
    PubSubWorkerThread = None  # type: ignore[assignment,misc]

if PubSubWorkerThread is not None and "timeout" in inspect.signature(PubSubWorkerThread.stop).parameters:
    _joining_stop = PubSubWorkerThread.stop
    _NOT_GIVEN: Any = object()

    def _stop(self: Any, timeout: Any = _NOT_GIVEN) -> None:
        if timeout is _NOT_GIVEN:
            self._running.clear()
            return
        _joining_stop(self, timeout)

    PubSubWorkerThread.stop = _stop  # type: ignore[method-assign]
