--[[ finish_job: write a worker's outcome for a job only while it holds the lease, and
release the lease in the same atomic step (the fence).

The outcome is whatever RQ's own finish code queued in its transaction (status, result,
registries, retry, dependents): rq_emq packs those commands here unchanged, so RQ keeps
its semantics and a worker that lost its lease writes nothing at all.

KEYS:
  1  rq:job:<id>
  2  emq:{<q>}:<id>:lock
  3  emq:{<q>}:leases
  4  emq:{<q>}:stalled
  5  emq:{<q>}:stats
ARGV:
  1  job id
  2  token
  3  number of commands; then per command: its argument count, then the arguments
Returns:
  {0}               fenced out: the lease is not ours, nothing was written
  {1, replies}      replies[i] is the i-th command's reply (an error reply in place)
]]
-- @include lib/lease.lua

local job_id, token = ARGV[1], ARGV[2]
if redis.call('HGET', KEYS[1], 'emq_token') ~= token then
  redis.call('HINCRBY', KEYS[5], 'fenced', 1)
  return {0}
end
local replies = run_packed(4, tonumber(ARGV[3]))
if drop_lease(KEYS[1], KEYS[2], KEYS[3], KEYS[4], job_id, 'done:' .. token) then
  -- attempts count consecutive takes that did not end normally; this one did
  redis.call('HDEL', KEYS[1], 'emq_attempts')
end
redis.call('HINCRBY', KEYS[5], 'finished', 1)
return {1, replies}
