--[[ recover_crashed_job: a worker whose work horse died without an outcome (killed by a
signal the worker did not send: the OOM killer's SIGKILL, a SIGSEGV; or an exit with no
outcome written) recovers the job at once, if its lease still holds it: the stall is
known the moment the horse is reaped, so nothing waits for the lease to lapse.

The attempt is counted (unlike return_job_to_queue, which refunds it: a stopped worker
is no fault of the job). The cause is appended to the job's crash history
(`emq_crashes`, a JSON list of [attempt, cause, ms], at most HISTORY entries, of this run
of consecutive attempts only: finish_job clears it, but for a failure it completes). Then, as the sweep's phase 2 does:
back to the front of its queue, or, at max attempts, failed (RQ's failed registry and the
outbox, owner `outbox`) with a reason naming the cause. A job RQ ended meanwhile is left
as RQ put it (its lease is released); a lease no longer this token's changes nothing.

KEYS:
  1  rq:job:<id>      2  emq:{<q>}:<id>:lock   3  emq:{<q>}:leases   4  emq:{<q>}:stalled
  5  emq:{<q>}:stats  6  rq:queue:<q>          7  emq:{<q>}:moving
  8  rq:wip:<q>       9  rq:failed:<q>        10  emq:{<q>}:outbox
ARGV:
  1  job id   2  token   3  RQ's key prefix (`rq:`), for the job's executions
  4  worker-wide default max attempts   5  default failure_ttl (seconds)
  6  timestamp for `ended_at` (RQ's format)   7  the cause, e.g.
     `work horse killed by signal 9 (SIGKILL; the OOM killer sends this)`
The crash, and a failure at max attempts, go to the queue's record (lib/record.lua).
Returns (each reply ends with `malformed`: our keys found malformed and skipped or
replaced, {key, what, ...}, lib/own_keys.lua):
  {0, 'lost'|'ended'}                the lease was not this token's (its lock, if it still holds
                                     this token, is released), or RQ had ended the job
  {1, attempts, max_attempts}        back at the front of its queue
  {2, attempts, max_attempts, reason} failed at max attempts, with this reason
]]
-- @include lib/lease.lua
-- @include lib/record.lua

local HISTORY = 10
local job_id, token, rq_prefix, cause = ARGV[1], ARGV[2], ARGV[3], ARGV[7]
local job_key, lock_key, leases_key, stalled_key, stats_key = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local state = check_holder(job_key, lock_key, leases_key, stalled_key, stats_key, job_id, token,
  KEYS[6], rq_prefix, true)
-- the dead horse's run is over (its session ended first): check_holder released what it
-- still held of a job that is not its own any more
if state ~= 'held' then return {0, state, MALFORMED} end

local now = now_ms()
local attempts, max_attempts, exhausted, failure_ttl = attempts_used(job_key, tonumber(ARGV[4]))

-- the history of this run of attempts only: a history whose last entry is for this
-- attempt or a later one is left from an earlier run (a failure the outbox completed
-- keeps its history; a requeue of it starts again at attempt 1), and goes
local ok, found = pcall(cjson.decode, redis.call('HGET', job_key, 'emq_crashes') or '[]')
local history = {}
local last = ok and type(found) == 'table' and found[#found]
if type(last) == 'table' and tonumber(last[1]) and tonumber(last[1]) < attempts then
  for _, entry in ipairs(found) do
    if type(entry) == 'table' and tonumber(entry[1]) and tonumber(entry[1]) < attempts then
      history[#history + 1] = entry
    end
  end
end
history[#history + 1] = {attempts, cause, now}
while #history > HISTORY do table.remove(history, 1) end
redis.call('HSET', job_key, 'emq_crashes', cjson.encode(history))

release_started(KEYS[8], job_key, job_id, rq_prefix)
index_write('list', 'LREM', KEYS[7], 0, job_id)  -- the moving list is short by construction
drop_lease(job_key, lock_key, leases_key, stalled_key, job_id, false)
count(stats_key, 'crashed', 1)
local prefix, counts, holder = queue_prefix(leases_key), {}, token_worker(token)
record_event(prefix, counts, 'crashed', job_id, holder, cause .. ' (attempt ' .. attempts .. ' of ' .. max_attempts .. ')')
if not exhausted then
  requeue_front(job_key, KEYS[6], job_id)
  record_minute(prefix, counts, now)
  return {1, attempts, max_attempts, MALFORMED}
end

-- "<cause> on each of 3 attempts" when every attempt crashed alike, else this cause and
-- the earlier ones recorded (an attempt missing from the history stalled: the sweep's)
local same = #history == attempts
for _, entry in ipairs(history) do
  if entry[2] ~= cause then same = false end
end
local reason
if same and attempts > 1 then
  reason = cause .. ' on each of ' .. attempts .. ' attempts'
else
  reason = cause .. ' on attempt ' .. attempts .. ' of ' .. max_attempts
  local earlier = {}
  for i = 1, #history - 1 do
    earlier[#earlier + 1] = 'attempt ' .. history[i][1] .. ': ' .. tostring(history[i][2])
  end
  if #earlier > 0 then reason = reason .. ' (earlier ' .. table.concat(earlier, '; ') .. ')' end
end
fail_to_outbox(job_key, KEYS[9], KEYS[10], job_id, reason, failure_ttl, tonumber(ARGV[5]), ARGV[6], now)
count(stats_key, 'failed', 1)
record_event(prefix, counts, 'failed', job_id, holder, reason)
record_minute(prefix, counts, now)
return {2, attempts, max_attempts, reason, MALFORMED}
