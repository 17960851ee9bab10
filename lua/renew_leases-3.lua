--[[ renew_leases: the lock manager's heartbeat for every lease one process holds on a queue.

A lease is renewed only for the holder recorded on the job (the token), so nobody can
extend a lease they do not hold. A holder whose lock lapsed (a pause, a slow tick) sets it
again, but only while the job is still in flight under that same holder: once a sweep has
recovered the job, the owner token is gone and the lease is reported lost.

KEYS:
  1  emq:{<q>}:leases
  2  emq:{<q>}:stalled (zset id -> ms when marked)
  3  emq:{<q>}:stats
ARGV:
  1  lease_ms
  2  lease key prefix `emq:{<q>}:`
  3  heartbeat timestamp for the job hash's `last_heartbeat` (RQ's format), or '' to
     leave the job hash alone this tick (RQ WATCHes it while it checks dependents)
  4  job key prefix (the job class's, `rq:job:`)
  5.. per lease four values: job id, token, the job's newest report ('' for none since the
     last tick; JSON, `rq_emq.current_lease().report(...)`), its progress timeout in ms
     ('' for none: `meta=rq_emq.progress_timeout(ms)`)
Returns: {lost, settled, no_progress, malformed}: ids whose lease is lost (the job was taken from this
holder, or deleted while it ran, or Redis lost it: a restart without persistence; a
lease whose evidence vanished is lost, never settled); ids whose job this holder already
finished (a tick raced the finish: the owner reads `done:<token>`, or, after a finish
that deleted the job hash as `result_ttl=0` does, the lock key keeps `done:<token>` for
one lease: finish_job); and ids
whose job showed no progress for its progress timeout: not renewed, now or ever again
under this grant (`emq_no_progress` says why), so the holder stops the run and the lock
lapses; the sweep then recovers the job with the attempt counted, as after any stall
(the refusal goes to the queue's record, lib/record.lua).
`malformed` names our keys found malformed and skipped or replaced ({key, what, ...}:
lib/own_keys.lua); a leases index found of another type is replaced, and each lease whose
job still names its holder is indexed again by its renewal (the job hash says who holds it).
A report lands with the renewal it rides on: one write per tick at most, no command more.
]]
-- @include lib/lease.lua
-- @include lib/record.lua

local lease_ms, prefix, heartbeat, job_prefix = tonumber(ARGV[1]), ARGV[2], ARGV[3], ARGV[4]
local now = now_ms()
local deadline = now + lease_ms
local lost, settled, stuck = {}, {}, {}
local renewed = 0

-- Whether the job held by this lease has shown no progress for `progress_ms`: no report
-- since its grant or its last report. Decided once per grant: a report after that
-- revives nothing (its holder was told to stop). A lease granted without the progress
-- stamp (an older version's) starts its clock now.
local function without_progress(job_key, report, progress_ms, job_id, token)
  local found = redis.call('HMGET', job_key, 'emq_no_progress', 'emq_progress_at')
  if found[1] then return true end
  if report ~= '' then return false end
  local at = count_value(found[2])
  if not at then
    redis.call('HSET', job_key, 'emq_progress_at', string.format('%d', now))
    return false
  end
  if now - at <= progress_ms then return false end
  local why = string.format('no progress for %d ms', progress_ms)
  redis.call('HSET', job_key, 'emq_no_progress', why)
  record_event(prefix, {}, 'no_progress', job_id, token_worker(token), why)
  return true
end

for i = 5, #ARGV, 4 do
  local job_id, token, report = ARGV[i], ARGV[i + 1], ARGV[i + 2]
  local progress_ms = count_value(ARGV[i + 3])
  local job_key = job_prefix .. job_id
  local owner = redis.call('HGET', job_key, 'emq_token')
  local owner_done = 'done:' .. token
  local indexed, unreadable = index_read('zset', false, 'ZSCORE', KEYS[1], job_id)
  if owner == token and (indexed or unreadable) then
    if progress_ms and without_progress(job_key, report, progress_ms, job_id, token) then
      stuck[#stuck + 1] = job_id
    else
      redis.call('SET', prefix .. job_id .. ':lock', token, 'PX', lease_ms)
      index_write('zset', 'ZADD', KEYS[1], deadline, job_id)
      index_write('zset', 'ZREM', KEYS[2], job_id)
      local fields = {}
      if heartbeat ~= '' then fields = {'last_heartbeat', heartbeat} end
      if report ~= '' then
        fields[#fields + 1] = 'emq_report'
        fields[#fields + 1] = report
        fields[#fields + 1] = 'emq_progress_at'
        fields[#fields + 1] = string.format('%d', now)
      end
      if #fields > 0 then redis.call('HSET', job_key, unpack(fields)) end
      renewed = renewed + 1
    end
  elseif owner == 'done:' .. token
      or (not owner and not indexed and redis.call('GET', prefix .. job_id .. ':lock') == owner_done) then
    settled[#settled + 1] = job_id
  else
    lost[#lost + 1] = job_id
  end
end
count(KEYS[3], 'renewed', renewed)
count(KEYS[3], 'lease_lost', #lost)
count(KEYS[3], 'no_progress', #stuck)
return {lost, settled, stuck, MALFORMED}
