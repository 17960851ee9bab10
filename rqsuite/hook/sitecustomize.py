"""Loaded at start-up by every Python process of an RQ-suite run (the runner puts this
directory first on ``PYTHONPATH``): pytest, its xdist workers, and every ``rq worker``,
worker-pool child and spawned horse that RQ's tests start.

It does two things, each driven by the environment the runner sets:

- ``RQSUITE_REDIS_PORTS`` (``gw0=PORT,gw1=PORT,-=PORT``): every redis-py connection to
  ``localhost``/``127.0.0.1`` port 6379 (RQ's tests hard-code it: ``Redis()``, and
  ``redis://127.0.0.1:6379/N`` URLs) goes to the run's private redis-server instead, one per
  xdist worker (looked up by ``PYTEST_XDIST_WORKER`` at connect time, since xdist sets it
  after start-up). The machine's Redis on 6379 is never reached.
- ``RQSUITE_WORKERS=ours``: ``rq.Worker``, ``rq.SimpleWorker`` and ``rq.SpawnWorker`` become
  rq_emq's LeaseWorker, SimpleLeaseWorker and SpawnLeaseWorker in every module that exports
  them, and WorkerPool's default worker class with them (SpawnWorker on RQ 3 only: on RQ 2
  rq-emq refuses to lease for it, by design). ``stock`` leaves RQ alone.

Self-contained on purpose: it must not import anything of the rq-emq source tree, whose
``tests`` package would shadow RQ's.
"""

from __future__ import annotations

import os
import sys
from typing import Any

LOCAL_HOSTS = {"localhost", "127.0.0.1", "::1"}
STOCK_PORT = 6379


def private_port() -> int:
    ports = dict(item.split("=", 1) for item in os.environ["RQSUITE_REDIS_PORTS"].split(","))
    return int(ports.get(os.environ.get("PYTEST_XDIST_WORKER", "-"), ports["-"]))


def redirect_redis() -> None:
    import redis.connection

    original = redis.connection.Connection.__init__

    def __init__(
        self: Any, host: str = "localhost", port: int = STOCK_PORT, *args: Any, **kwargs: Any
    ) -> None:
        if str(host) in LOCAL_HOSTS and int(port) == STOCK_PORT:
            port = private_port()
        original(self, host, port, *args, **kwargs)

    redis.connection.Connection.__init__ = __init__  # type: ignore[method-assign]


def swap_workers() -> None:
    import rq
    import rq.worker
    import rq.worker_pool

    import rq_emq

    swaps: dict[Any, Any] = {rq.Worker: rq_emq.LeaseWorker, rq.SimpleWorker: rq_emq.SimpleLeaseWorker}
    spawn = getattr(rq.worker, "SpawnWorker", None)
    if spawn is not None and int(rq.__version__.split(".")[0]) >= 3:  # SpawnLeaseWorker needs RQ 3
        swaps[spawn] = rq_emq.SpawnLeaseWorker  # type: ignore[attr-defined]
    for name, module in list(sys.modules.items()):
        if name == "rq" or name.startswith("rq."):
            for attr, value in list(vars(module).items()):
                if isinstance(value, type) and value in swaps:
                    setattr(module, attr, swaps[value])
    # default arguments were bound when rq.worker_pool was defined
    for function in (rq.worker_pool.WorkerPool.__init__, rq.worker_pool.run_worker):
        defaults = function.__defaults__ or ()
        function.__defaults__ = tuple(swaps.get(value, value) for value in defaults)
        kwdefaults = function.__kwdefaults__ or {}
        for key, value in kwdefaults.items():
            kwdefaults[key] = swaps.get(value, value)


if os.environ.get("RQSUITE_REDIS_PORTS"):
    redirect_redis()


def is_stock_spawned_horse() -> bool:
    """RQ 2's SpawnWorker (left stock there) runs its horse as ``python -c`` code that looks
    itself up as ``rq.Worker``: that name is RQ's own there, not a test's."""
    argv = getattr(sys, "orig_argv", [])
    code = argv[argv.index("-c") + 1] if "-c" in argv[:-1] else ""
    return "from rq import Worker" in code and "Worker.find_by_key" in code


if os.environ.get("RQSUITE_WORKERS") == "ours" and not is_stock_spawned_horse():
    swap_workers()
