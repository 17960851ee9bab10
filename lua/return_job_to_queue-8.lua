--[[ return_job_to_queue: a worker told to stop now hands its in-flight job back to the
front of its queue and releases the lease, if it still holds it.

The attempt is refunded: the job did not stall, its worker was stopped.

KEYS:
  1  rq:job:<id>
  2  emq:{<q>}:<id>:lock
  3  emq:{<q>}:leases
  4  emq:{<q>}:stalled
  5  emq:{<q>}:stats
  6  rq:queue:<q>
  7  rq:queue:<q>:intermediate
  8  rq:wip:<q>
ARGV:
  1  job id
  2  token
Returns: 1 when the job went back to its queue, 0 when the lease was no longer ours.
]]
-- @include lib/lease.lua

local job_id, token = ARGV[1], ARGV[2]
if redis.call('HGET', KEYS[1], 'emq_token') ~= token then
  redis.call('HINCRBY', KEYS[5], 'fenced', 1)
  return 0
end
remove_executions(KEYS[8], job_id)
redis.call('LREM', KEYS[7], 0, job_id)
drop_lease(KEYS[1], KEYS[2], KEYS[3], KEYS[4], job_id, false)
if tonumber(redis.call('HGET', KEYS[1], 'emq_attempts') or '0') > 0 then
  redis.call('HINCRBY', KEYS[1], 'emq_attempts', -1)
end
redis.call('HSET', KEYS[1], 'status', 'queued')
redis.call('LREM', KEYS[6], 0, job_id)
redis.call('LPUSH', KEYS[6], job_id)
redis.call('HINCRBY', KEYS[5], 'returned', 1)
return 1
