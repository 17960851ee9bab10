--[[ guard_job_write: run a worker's bookkeeping for a job only while it holds the lease,
and keep the lease.

A worker writes to a job before its outcome too: as a run starts, RQ marks it started
and records its execution. A worker (or horse) that was frozen or cut off past its
lease may wake after the job was recovered and even finished elsewhere; unguarded, those
writes would turn the job back to `started` under a worker that no longer runs it. This
packs RQ's transaction here unchanged, like finish_job, but leaves the lease in place.

After RQ's commands of a run's start (the horse's, which mark the job started), and after
any other write the holder makes to the job itself (RQ's `set_status` of a delayed
`Retry`, an exception handler's `job.save()`, `save_meta`: rq_emq/direct_writes.py routes
them here), the job's seen fields (status, enqueued_at, started_at; lib/lease.lua) are
recorded as the lease's own: from then on a change to any of them means RQ or an operator
changed the job, not us. The worker's own record of the execution leaves them alone and
records nothing.

KEYS:
  1  <job prefix><id>   (`rq:job:<id>`; the job class's prefix)
  2  emq:{<q>}:<id>:lock
  3  emq:{<q>}:leases
  4  emq:{<q>}:stalled
  5  emq:{<q>}:stats
  6  <queue prefix><q>  (`rq:queue:<q>`: where RQ would have pushed the job again)
ARGV:
  1  job id
  2  token
  3  RQ's key prefix (`rq:`), for the registries RQ puts an ended job in
  4  the job's own max attempts to record ('' for none)
  5  whether to record the job's seen fields after RQ's commands as ours: '1' read them
     back, '0' not at all (nothing to record, or the caller folded the record into RQ's
     own HSET of them)
  6  '1' to refuse the whole block, writing nothing, when MULTI would refuse one of the
     commands as it is queued (an unknown command, a wrong number of arguments, an ACL
     denial: lib/lease.lua `refused_at_queue`), as EXEC aborts then (the job's own fenced
     pipeline); '0' not to look (RQ's own writes: one COMMAND INFO less)
  7  number of commands; then per command: its argument count, then the arguments
Returns (each reply ends with `malformed`: our keys found malformed and skipped or
replaced, {key, what, ...}, lib/own_keys.lua):
  {0}               fenced out: the lease is not ours (or RQ ended the job since the
                    take: the lease is left to the run's end, lib/lease.lua
                    `check_holder`), nothing was written
  {1, replies}      replies[i] is the i-th command's reply (an error reply in place, as
                    EXEC gives a command's error at run time, WRONGTYPE say)
  {3, i, error}     MULTI would have refused the i-th command as it was queued: nothing
                    was checked or written (the caller raises `error`, as EXEC aborts)
]]
-- @include lib/lease.lua

local job_id, token = ARGV[1], ARGV[2]
if ARGV[6] == '1' then
  local at, why = refused_at_queue(8, tonumber(ARGV[7]))
  if at then return {3, at, why, MALFORMED} end
end
-- the run goes on: a refusal here leaves its lease (and the lock holding the job's next
-- take back) to the run's end
local state = check_holder(KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], job_id, token, KEYS[6], ARGV[3], false)
if state ~= 'held' then return {0, MALFORMED} end
local replies = run_packed(8, tonumber(ARGV[7]))
local record = {}
if ARGV[5] == '1' then record = seen_record(KEYS[1]) end
if ARGV[4] ~= '' then
  record[#record + 1] = 'emq_max_attempts'
  record[#record + 1] = ARGV[4]
end
-- a job RQ's commands deleted is not re-created by the record
if #record > 0 and redis.call('EXISTS', KEYS[1]) == 1 then redis.call('HSET', KEYS[1], unpack(record)) end
return {1, replies, MALFORMED}
