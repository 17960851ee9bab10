"""Our own keys found malformed by a script: logged once per process, never raised.

A key only rq-emq writes (the stats hash, the events stream, the minutes ring, the leases,
stalled and outbox indexes, the moving list, the sweep's rate-limit key) may still be
overwritten by something else: an operator's ``SET``, another app sharing the prefix, a
restore. The scripts never fail on one (``lua/lib/own_keys.lua``: telemetry is skipped,
an index is replaced) and name it in their reply as ``{key, what, ...}``. A worker meets
the same key on every take, so each (key, what) is logged once per process: one line an
operator can act on, not one per job (issue 33, rule 4: bad data never wedges a queue).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

from . import reporter

logger = reporter.PathLogger("rq_emq.lease")  # code the lock manager's threads run

_logged: set[tuple[str, str]] = set()
_lock = threading.Lock()


def _text(value: Any) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def problems(found: Any) -> list[tuple[str, str]]:
    """A script's ``malformed`` reply as (key, what) pairs; anything else reads as none."""
    if not isinstance(found, Sequence) or isinstance(found, (bytes, str)):
        return []
    words = [_text(word) for word in found]
    return list(zip(words[0::2], words[1::2], strict=False))


def report(found: Any) -> list[tuple[str, str]]:
    """Log each (key, what) of a script's ``malformed`` reply the first time this process
    sees it; returns them all (for a report of its own, as ``rq-emq sweep`` prints)."""
    pairs = problems(found)
    for key, what in pairs:
        with _lock:
            if (key, what) in _logged:
                continue
            _logged.add((key, what))
        logger.warning("rq-emq key %s is malformed: %s", key, what, extra={"queue": None, "key": key})
    return pairs


def forget() -> None:
    """Log every key again from now on (for tests)."""
    with _lock:
        _logged.clear()
