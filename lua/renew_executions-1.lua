--[[ renew_executions: RQ's own heartbeat writes for the runs of the leases one process
holds on a queue, each lease's applied only while that lease is still held.

The lock manager sends this in the same round trip as renew_leases. A tick that comes
late (the worker froze past its lease, and the sweep recovered the job and removed RQ's
execution records meanwhile) or that races the job's finish must not re-create what was
removed: a lease's writes run only while the job is still in flight under that holder,
the check renew_leases makes. The writes are RQ's commands, packed unchanged (so RQ's
version decides what they are).

KEYS:
  1  emq:{<q>}:leases
ARGV: 1 the job key prefix (the job class's, `rq:job:`); then per lease: job id, token,
  number of commands; then per command its argument count, then the arguments.
Returns: how many leases' writes ran.
]]
-- @include lib/lease.lua

local ran = 0
local job_prefix = ARGV[1]
local pos = 2
while pos <= #ARGV do
  local job_id, token, count = ARGV[pos], ARGV[pos + 1], tonumber(ARGV[pos + 2])
  pos = pos + 3
  if redis.call('HGET', job_prefix .. job_id, 'emq_token') == token and redis.call('ZSCORE', KEYS[1], job_id) then
    run_packed(pos, count)
    ran = ran + 1
  end
  for _ = 1, count do pos = pos + tonumber(ARGV[pos]) + 1 end
end
return ran
