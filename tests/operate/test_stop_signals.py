"""The stop of the commands that loop (the reaper, ``status --watch``): SIGTERM or Ctrl-C
at any moment ends the loop, and nothing in the handler can wait on the loop itself."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import rq_emq.operate.stop_signals as stop_signals
from rq_emq.operate.stop_signals import StopSignals

#: a loop of very short waits, so that a signal lands inside a wait's own code as often as
#: it can; the module is loaded by path (no package import: a start of about 30 ms)
LOOP = f"""
import importlib.util, sys
spec = importlib.util.spec_from_file_location("stop_signals", {str(Path(stop_signals.__file__))!r})
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
with module.StopSignals() as stop:
    print("ready", flush=True)
    while not stop.is_set():
        stop.wait(0.0005)
"""


def test_a_stop_signal_wakes_the_wait_at_once_and_the_old_handlers_come_back() -> None:
    before = signal.getsignal(signal.SIGTERM)
    with StopSignals() as stop:
        assert not stop.is_set() and stop.wait(0.01) is False
        threading.Timer(0.05, os.kill, (os.getpid(), signal.SIGTERM)).start()
        started = time.monotonic()
        assert stop.wait(30) is True
        assert time.monotonic() - started < 10  # woken by the signal, not the timeout
        assert stop.is_set() and stop.wait(30) is True  # and stays stopped, without waiting
    assert signal.getsignal(signal.SIGTERM) is before


def test_a_loop_of_short_waits_ends_on_a_sigterm_whenever_it_lands() -> None:
    """With ``threading.Event`` set from the handler, 1 signal in about 200 hung such a
    loop for ever (the handler waited on the lock its own thread held inside ``wait``)."""
    hung = 0
    for _ in range(60):
        process = subprocess.Popen([sys.executable, "-c", LOOP], stdout=subprocess.PIPE)
        assert process.stdout is not None and process.stdout.readline() == b"ready\n"
        time.sleep(random.uniform(0, 0.005))
        process.send_signal(signal.SIGTERM)
        try:
            assert process.wait(timeout=10) == 0
        except subprocess.TimeoutExpired:
            hung += 1
            process.kill()
            process.wait()
        finally:
            process.stdout.close()
    assert hung == 0
