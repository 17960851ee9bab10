--[[ return_moved_job: put back at the head of its queue a job that a worker's blocking
BLMOVE moved into the queue's moving list but that the worker will not claim: two of
its queues handed it a job at the same moment (it claims the one of its first queue), or
it was told to stop while the job was on its way.

KEYS:
  1  emq:{<q>}:moving                 (ours, see claim_job)
  2  <queue prefix><q>                 (`rq:queue:<q>`)
ARGV:
  1  job id
Returns: 1 when the job went back to its queue, 0 when it was no longer in the
moving list (the sweep had returned it already).
]]

-- The moving list is short by construction: it holds only jobs between a BLMOVE and
-- their claim (milliseconds). Count -1 searches from the tail, where BLMOVE ... RIGHT put it.
if redis.call('LREM', KEYS[1], -1, ARGV[1]) == 0 then return 0 end
redis.call('LPUSH', KEYS[2], ARGV[1])
return 1
