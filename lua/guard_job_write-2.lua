--[[ guard_job_write: run a worker's bookkeeping for a job only while it holds the lease,
and keep the lease.

A worker writes to a job before its outcome too: as a run starts, RQ marks it started
and records its execution. A worker (or horse) that was frozen or cut off past its
lease may wake after the job was recovered and even finished elsewhere; unguarded, those
writes would turn the job back to `started` under a worker that no longer runs it. This
packs RQ's transaction here unchanged, like finish_job, but leaves the lease in place.

KEYS:
  1  rq:job:<id>
  2  emq:{<q>}:stats
ARGV:
  1  token
  2  number of commands; then per command: its argument count, then the arguments
Returns:
  {0}               fenced out: the lease is not ours, nothing was written
  {1, replies}      replies[i] is the i-th command's reply (an error reply in place)
]]
-- @include lib/lease.lua

if redis.call('HGET', KEYS[1], 'emq_token') ~= ARGV[1] then
  redis.call('HINCRBY', KEYS[2], 'fenced', 1)
  return {0}
end
return {1, run_packed(3, tonumber(ARGV[2]))}
