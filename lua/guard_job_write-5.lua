--[[ guard_job_write: run a worker's bookkeeping for a job only while it holds the lease,
and keep the lease.

A worker writes to a job before its outcome too: as a run starts, RQ marks it started
and records its execution. A worker (or horse) that was frozen or cut off past its
lease may wake after the job was recovered and even finished elsewhere; unguarded, those
writes would turn the job back to `started` under a worker that no longer runs it. This
packs RQ's transaction here unchanged, like finish_job, but leaves the lease in place.

After RQ's commands of a run's start (the horse's, which mark the job started), the job's
RQ status is recorded as ours (`emq_status`): from then on a status that differs means RQ
(or an operator) changed the job, not us. The worker's own record of the execution leaves
the status alone and records nothing.

KEYS:
  1  <job prefix><id>   (`rq:job:<id>`; the job class's prefix)
  2  emq:{<q>}:<id>:lock
  3  emq:{<q>}:leases
  4  emq:{<q>}:stalled
  5  emq:{<q>}:stats
ARGV:
  1  job id
  2  token
  3  the job's own max attempts to record ('' for none)
  4  how to record the job's RQ status after RQ's commands as ours: '1' read it back,
     '=<status>' the status RQ's commands write (the caller read it off them), '0' not at all
  5  number of commands; then per command: its argument count, then the arguments
Returns:
  {0}               fenced out: the lease is not ours (or RQ ended the job since the
                    take, which also releases the lease), nothing was written
  {1, replies}      replies[i] is the i-th command's reply (an error reply in place)
]]
-- @include lib/lease.lua

local job_id, token = ARGV[1], ARGV[2]
local state = check_holder(KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], job_id, token)
if state ~= 'held' then return {0} end
local replies = run_packed(6, tonumber(ARGV[5]))
local record = {}
if ARGV[4] == '1' then
  record = {'emq_status', redis.call('HGET', KEYS[1], 'status') or ''}
elseif ARGV[4]:sub(1, 1) == '=' then
  record = {'emq_status', ARGV[4]:sub(2)}
end
if ARGV[3] ~= '' then
  record[#record + 1] = 'emq_max_attempts'
  record[#record + 1] = ARGV[3]
end
if #record > 0 then redis.call('HSET', KEYS[1], unpack(record)) end
return {1, replies}
