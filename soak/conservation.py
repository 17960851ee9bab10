"""Conservation (issue 33, rule 1), sampled while the soak runs: each job is in exactly one
place RQ reads (its queue list, our moving list, in flight: started, or under a lease,
scheduled, deferred, ready (RQ 3 moves a dependent whose parents ended through its ready
registry to its queue), or an end registry: finished, failed, canceled; RQ puts a stopped
job in the failed registry), every 250 ms, in one script (atomic: no move is seen half-made).

"In flight" is RQ's started registry, a lease entry (the sweep's ledger: a dead holder's
job waits there for the sweep) or a live lock naming the job's owner. RQ's intermediate
list (a stock worker's ``BLMOVE``) counts only for a job in no other place: RQ leaves a
stock run's job there until its maintenance cleans it.

Judged at the end (:func:`check_conservation`): a job in no place is lost, whatever
happens to it later. Two places are allowed only where another check judges the pair: a
job in flight that RQ ended (a cancel, stock RQ's end of a stock run: the run may go on,
invariant 6), and a job queued while in flight or a copy of it queued beside another place
(invariant 3, with its credits: a copy RQ's own client pushed, stock RQ's double enqueue);
and a job the producer was canceling or deleting as the sample ran (RQ's delete is not
one step), or had canceled or deleted while a stock neighbour ran it (stock RQ's run
finishes the canceled job, or re-creates the deleted one's hash in no place): RQ's
semantics, not judged. So is a job the chaos enqueued again (``enqueue_again``) whose copy
no run has taken yet, queued beside the one place it was (RQ's enqueue leaves the old run's
end registry as it was).
"""

from __future__ import annotations

import time
from typing import Any

from rq_emq.keys import QueueKeys

from .dataloss import begun
from .stockcredit import by_stock
from .straycopies import copy_accounted_for
from .verdict import Verdict
from .witnesscheck import copy_not_yet_run

#: KEYS: the places, in the order of PLACES; ARGV: job key prefix, lease key prefix, ids.
#: Returns {id, places (comma-separated, sorted), ...} of each job whose hash exists and
#: that is not in exactly one place.
SAMPLE = """
local where = {}
local function mark(id, place)
  local at = where[id]
  if not at then at = {}; where[id] = at end
  at[place] = true
end
for i, place in ipairs({'queued', 'moving', 'intermediate'}) do
  for _, id in ipairs(redis.call('LRANGE', KEYS[i], 0, -1)) do mark(id, place) end
end
for _, member in ipairs(redis.call('ZRANGE', KEYS[4], 0, -1)) do
  mark(string.match(member, '^[^:]+'), 'in-flight')
end
for i, place in ipairs({'in-flight', 'scheduled', 'deferred', 'ready', 'finished', 'failed', 'canceled'}) do
  for _, id in ipairs(redis.call('ZRANGE', KEYS[4 + i], 0, -1)) do mark(id, place) end
end
local out = {}
for i = 3, #ARGV do
  local id = ARGV[i]
  local job_key = ARGV[1] .. id
  if not where[id] then
    local owner = redis.call('HGET', job_key, 'emq_token')
    if owner and redis.call('GET', ARGV[2] .. id .. ':lock') == owner then mark(id, 'in-flight') end
  end
  local places = {}
  for place in pairs(where[id] or {}) do places[#places + 1] = place end
  if #places ~= 1 and redis.call('EXISTS', job_key) == 1 then
    table.sort(places)
    out[#out + 1] = id
    out[#out + 1] = table.concat(places, ',')
  end
end
return out
"""

#: Where RQ puts an ended job: a run of ours may still go on beside it (RQ ended it).
ENDS = {"finished", "failed", "canceled"}


def sample_keys(queue: str) -> list[str]:
    q = QueueKeys(queue)
    return [
        q.rq_queue,
        q.moving,
        q.intermediate,
        q.started,
        q.leases,
        f"rq:scheduled:{queue}",
        f"rq:deferred:{queue}",
        f"rq:ready:{queue}",
        f"rq:finished:{queue}",
        f"rq:failed:{queue}",
        f"rq:canceled:{queue}",
    ]


def sample(client: Any, queue: str, job_ids: list[str]) -> list[str]:
    """One atomic look: a line ``<at> <job> <places> <until>`` (``none`` for no place) for
    each job that is not in exactly one place. The script ran at some moment between ``at``
    (before it was sent) and ``until`` (its reply read): a producer's call judged beside the
    sample is judged against that whole span, not the moment the sample was asked for."""
    keys = sample_keys(queue)
    at = time.time()
    reply = client.eval(SAMPLE, len(keys), *keys, "rq:job:", QueueKeys(queue).prefix, *job_ids)
    until = time.time()
    pairs = zip(reply[::2], reply[1::2], strict=True)
    return [f"{at:.3f} {job.decode()} {places.decode() or 'none'} {until:.3f}" for job, places in pairs]


def judged(line: str, ev: Any) -> str | None:
    """What is wrong with a sample's line, or None when the places it names are allowed."""
    at, job_id, listed, *rest = line.split()
    until = float(rest[0]) if rest else float(at)  # a line written before samples gave their span
    found = set() if listed == "none" else set(listed.split(","))
    if len(found) > 1:
        found.discard("intermediate")  # a stock run's trail, beside where the job is now
    if rqs_own(job_id, float(at), ev, until):
        return None
    if not found:
        return "in no place"
    if len(found) == 1:
        return None
    rest_of = found - {"in-flight"}
    if "in-flight" in found and len(rest_of) == 1 and rest_of <= ENDS:
        return None  # RQ ended it while a run goes on (invariant 6 judges the run)
    if "moving" in found and "queued" not in found:
        # a queued copy that a worker's BLMOVE took and its take has not judged yet (it
        # drops a stray copy, or puts one an earlier run still holds back at the queue's
        # head): judged as the queued copy it was
        found = (found - {"moving"}) | {"queued"}
    if found == {"queued", "in-flight"}:
        return None  # queued while in flight: invariant 3 judges it, with its credits
    if "queued" in found and copy_accounted_for(f"{at} {job_id} queued beside another place", ev):
        return None  # a copy RQ's own client pushed, dropped unrun or run by stock RQ
    if "queued" in found and len(found) == 2 and copy_not_yet_run(job_id, float(at), ev):
        return None  # the user enqueued it again: RQ's enqueue leaves its old place as it was
    return "in " + ", ".join(sorted(found))


def rqs_own(job_id: str, at: float, ev: Any, until: float) -> bool:
    """What RQ's own code did to a job the producer canceled or deleted: its call was under
    way at some moment of the sample's span [``at``, ``until``] (RQ's ``job.delete()`` takes
    the job out of its places, then deletes the hash, in commands of their own), or it had
    returned while a stock neighbour ran the job (stock RQ's run then writes over the
    cancel, finished and canceled, or re-creates the deleted job's hash in no place). RQ's
    semantics, not judged (soak/README.md)."""
    planned = ev.jobs.get(job_id)
    since, acted = getattr(planned, "acting_since", None), getattr(planned, "acted_at", None)
    if getattr(planned, "kind", "") not in ("cancel", "delete") or acted is None:
        return False
    if since is not None and since <= until and at <= acted:
        return True
    if acted > at:
        return False
    return by_stock([run for run in ev.runs.get(job_id, []) if begun(run) <= at], ev)


def check_conservation(ev: Any, v: Verdict) -> None:
    lines = getattr(ev, "conservation", [])
    bad = [(line, what) for line in lines if (what := judged(line, ev)) is not None]
    v.violations += [f"conservation sample {line}: {what}" for line, what in bad]
    v.counts["conservation_samples"] = getattr(ev, "conservation_samples", 0)
    v.counts["conservation_violations"] = len(bad)
