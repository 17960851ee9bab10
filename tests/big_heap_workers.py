"""Worker classes whose module holds state its jobs read, for tests/run/test_spare_age.py:

- ``STAMP``: a time a thread of the worker moves every ``STAMP_S``; a job reads how old the
  copy it sees is (``state_jobs.memory_age``);
- ``HEAP``: ``BIG_HEAP_MB`` of memory written at import, as a worker that preloads data
  for its jobs (RQ's copy-on-write sharing) holds it; a thread rewrites every page of it
  once the file named by ``BIG_HEAP_RELOAD`` appears (a reload, or a ``gc.collect()``
  moving objects), then creates ``<that file>.done``.
"""

from __future__ import annotations

import os
import threading
import time

from rq import Worker

import rq_emq

STAMP_S = 0.02
STAMP = [time.time()]
PAGE = 4096
HEAP = bytearray(int(os.environ.get("BIG_HEAP_MB", "0")) << 20)
HEAP[::PAGE] = b"\x01" * len(HEAP[::PAGE])


def _stamp() -> None:
    while True:
        STAMP[0] = time.time()
        time.sleep(STAMP_S)


def _reload_on_request(request: str) -> None:
    while not os.path.exists(request):
        time.sleep(0.02)
    HEAP[::PAGE] = b"\x02" * len(HEAP[::PAGE])
    with open(request + ".done", "w"):
        pass


class BigHeapWorker(Worker):
    """Stock RQ's forking worker, with the module's state."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        threading.Thread(target=_stamp, daemon=True).start()
        request = os.environ.get("BIG_HEAP_RELOAD")
        if request:
            threading.Thread(target=_reload_on_request, args=(request,), daemon=True).start()


LeaseBigHeapWorker = rq_emq.lease_worker(BigHeapWorker)
