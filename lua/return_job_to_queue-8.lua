--[[ return_job_to_queue: a worker told to stop now hands its in-flight job back to the
front of its queue and releases the lease, if it still holds it.

The attempt is refunded: the job did not stall, its worker was stopped. A job that RQ
ended or moved since the take (canceled, requeued, ...) is left as RQ put it.

KEYS:
  1  rq:job:<id>
  2  emq:{<q>}:<id>:lock
  3  emq:{<q>}:leases
  4  emq:{<q>}:stalled
  5  emq:{<q>}:stats
  6  rq:queue:<q>
  7  emq:{<q>}:moving
  8  rq:wip:<q>
ARGV:
  1  job id
  2  token
  3  RQ's key prefix (`rq:`), for the job's executions and the registries RQ ends jobs in
Returns: {1, malformed} when the job went back to its queue, {0, malformed} when the
lease was no longer ours (or RQ had ended the job; its lease is then released);
`malformed` names our keys found malformed and skipped or replaced ({key, what, ...}:
lib/own_keys.lua).
]]
-- @include lib/lease.lua

local job_id, token = ARGV[1], ARGV[2]
local state = check_holder(KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], job_id, token, KEYS[6], ARGV[3], true)
if state ~= 'held' then return {0, MALFORMED} end
release_started(KEYS[8], KEYS[1], job_id, ARGV[3])
index_write('list', 'LREM', KEYS[7], 0, job_id)  -- the moving list is short by construction
drop_lease(KEYS[1], KEYS[2], KEYS[3], KEYS[4], job_id, false)
local attempts = count_value(redis.call('HGET', KEYS[1], 'emq_attempts'))
if attempts and attempts > 0 then
  redis.call('HSET', KEYS[1], 'emq_attempts', tostring(attempts - 1))
end
-- held under this lease, so in no queue list (RQ has not moved it: checked above)
requeue_front(KEYS[1], KEYS[6], job_id)
count(KEYS[5], 'returned', 1)
return {1, MALFORMED}
