"""The fenced-effect job kind: what its run writes at the end of its work, and the
evidence of those writes that the soak reads back from Redis (:mod:`soak.effectcheck`
judges it).

A ``fenced`` job is a plain job (soak/README.md, "Jobs") whose run, at the end of its
work, writes one effect keyed by its job id, and then spends the rest of its time
(``WRAP_UP``) on its wrap-up before it returns: a crash there, between the effect and the
outcome, is what makes the next run write the effect again. It writes it twice:

- the **plain twin**, ``HINCRBY soak:effects:plain <job> 1`` through a plain pipeline:
  what a job that ignores its lease gets, at least once (every run that gets that far
  adds one, a replaced holder's too, and a resend after a lost reply adds one more);
- the **fenced effect**, through ``current_lease().fenced_pipeline()``: ``HSETNX
  soak:effects:fenced <job> <token>`` (the effect, counted by the first write that lands)
  and ``RPUSH soak:effects:writes "<job> <token>"`` (a log of every fenced write that
  committed, in commit order), in one ``execute()``: both commit, in one script, only
  while this grant's token still owns the job in Redis, or neither does and the run gets
  :class:`rq_emq.LeaseLost`.

The ``HSETNX`` is what makes the effect exactly once by construction, as a user would
make it: a later grant of the same job (a run after a crash that fell between the
effect and the outcome) writes again under a higher token, and its write commits to the
log but counts nothing. The fence is what keeps a replaced holder out: its write, however
late, lands nowhere.

A run under a stock worker (a stock neighbour, or ``--worker stock``) has no lease: it
writes the plain twin only. It never imports rq_emq (a stock neighbour stays stock):
the lease is looked up only where a lease worker already loaded the package.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import Any, TypeVar

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ReadOnlyError
from redis.exceptions import TimeoutError as RedisTimeoutError

#: The share of the producer's plain jobs planned as ``fenced`` (they keep every check of a
#: plain job, so the older checks lose nothing by it).
SHARE = 0.5
#: The share of a fenced run's time spent after its effect, before it returns (its
#: wrap-up): a fault there is the case that repeats an effect, so it is as likely as any.
WRAP_UP = 0.5
PLAIN_KEY = "soak:effects:plain"
FENCED_KEY = "soak:effects:fenced"
WRITES_KEY = "soak:effects:writes"
#: How long a run tries its writes again through connection errors (a Redis restart, a
#: cut, a ``CLIENT KILL``): a holder cut off for longer is stopped by its worker first.
RETRY_S = 30.0
#: Connection errors a write is tried again after (``ReadOnlyError``: a demoted master,
#: with Sentinel, until the worker's connection moves to the new one).
BLIPS = (RedisConnectionError, RedisTimeoutError, ReadOnlyError)

T = TypeVar("T")


def write_effect(connection: Any, job_id: str) -> tuple[str, int | None]:
    """The run's effect (see the module's docstring): (what, fencing token), where what is
    ``counted`` (this write's effect counted), ``again`` (committed, but an earlier write
    had counted it), ``refused`` (the fence refused it: nothing written) or ``nolease``
    (a stock worker's run: the plain twin only)."""
    _through_blips(lambda: connection.pipeline(transaction=False).hincrby(PLAIN_KEY, job_id, 1).execute())
    rq_emq = sys.modules.get("rq_emq")
    lease = rq_emq.current_lease() if rq_emq is not None else None
    if rq_emq is None or lease is None:
        return "nolease", None
    token = int(lease.fencing_token)

    def fenced() -> bool:
        pipe = lease.fenced_pipeline()
        pipe.hsetnx(FENCED_KEY, job_id, token).rpush(WRITES_KEY, f"{job_id} {token}")
        counted, _ = pipe.execute()
        return bool(counted)

    try:
        return ("counted" if _through_blips(fenced) else "again"), token
    except rq_emq.LeaseLost:
        return "refused", token


def _through_blips(step: Callable[[], T]) -> T:
    deadline = time.monotonic() + RETRY_S
    while True:
        try:
            return step()
        except BLIPS:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def collect(client: Any, job_ids: list[str]) -> dict[str, dict[str, Any]]:
    """Per fenced job id: ``plain`` (how many plain twins landed), ``counted`` (the token
    of the fenced write whose effect counted, or None) and ``writes`` (the tokens of every
    fenced write that committed, in commit order)."""
    plain = {k.decode(): int(v) for k, v in client.hgetall(PLAIN_KEY).items()}
    counted = {k.decode(): int(v) for k, v in client.hgetall(FENCED_KEY).items()}
    writes: dict[str, list[int]] = {}
    for entry in client.lrange(WRITES_KEY, 0, -1):
        job_id, token = entry.decode().split()
        writes.setdefault(job_id, []).append(int(token))
    return {
        job_id: dict(plain=plain.get(job_id, 0), counted=counted.get(job_id), writes=writes.get(job_id, []))
        for job_id in job_ids
    }
