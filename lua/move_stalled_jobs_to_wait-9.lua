--[[ move_stalled_jobs_to_wait: one call of the two-phase stalled sweep for one queue.

Detect, decide and move happen inside this one script, so sweepers running at once can
never both recover the same job. A job is recovered only after a grace pass: a sweep
marks it (lock gone), and only a later sweep, at least `grace_ms` later, recovers it if
its lock is still gone. A holder that renews in between keeps the job (renewal unmarks);
the grace is at least one renew interval, so a live holder always gets that chance, even
after a Redis stall that let every lease lapse at once.

Phase 2 (recover): each job marked at least `grace_ms` ago
  - lock back, or no longer in flight: unmarked;
  - ended by RQ since the take (its owner token is no longer a lease's, or its status,
    enqueue or start stamp is no longer what the lease's last write left, and RQ put the
    job where that status says: canceled, failed or requeued by stock cleanup, run by a
    stock worker, ...; lib/lease.lua `untouched`, `placed_by_rq`): only our lease entry
    goes, and the job is left as RQ put it (a stale whole-hash save puts it nowhere: the
    job is still the dead run's, and is recovered);
  - else recovered: out of the started registry, the moving list and the lease
    index; then back to the front of its queue (status queued) or, when its attempts have
    reached its max attempts, to RQ's failed registry (status failed) with an outbox entry
    (owner `outbox`) so that a worker writes RQ's Result and runs the failure callback
    exactly once.
Phase 1 (mark): leased jobs whose deadline passed and whose lock is gone, and lock-less
entries of the moving list (our BLMOVE, then the worker died before its claim). Jobs that
never held a lease (stock RQ workers in the same fleet) are left alone.

Work per call is bounded by `batch` in each phase; `more` tells the caller to call again.

KEYS:
  1 emq:{<q>}:leases   2 emq:{<q>}:stalled   3 emq:{<q>}:sweep   4 emq:{<q>}:stats
  5 rq:queue:<q>       6 emq:{<q>}:moving   7 rq:wip:<q>   8 rq:failed:<q>
  (RQ's keys as the queue's class and RQ build them)
  9 emq:{<q>}:outbox
ARGV:
  1 window_ms: fleet-wide rate limit of sweep rounds
  2 batch      3 lease key prefix `emq:{<q>}:`
  4 default failure_ttl (seconds)     5 worker-wide default max attempts
  6 mode: "round" (rate limited), "continue" (same round), "dry-run" (changes nothing)
  7 timestamp for `ended_at` (RQ's format)
  8 grace_ms: how long a mark must stand before phase 2 may recover the job
  9 job key prefix (the job class's, `rq:job:`)   10 RQ's key prefix (`rq:`), for executions
  11 the sweeper's name (for the record of the round)
Also: a round that runs records its time and sweeper in `emq:{<q>}:swept` ("<ms> <name>"),
and each mark, recovery and failure goes to the queue's record (lib/record.lua).
Returns:
  {-1, job_prefix} when the queue's workers recorded (in `emq:{<q>}:job_prefix`, by the
  lease key prefix: same slot) another job key prefix than ARGV 9: this sweeper would read
  every leased job as deleted, so it changes nothing;
  {0} when another sweeper ran this round; else
  {1, marked, requeued, failed, unmarked, dropped, more, outbox_due, ended, malformed} where
  marked, requeued, failed, dropped (index entries of deleted jobs) and ended (jobs RQ ended
  while they were leased, left as RQ put them) are lists of job ids, and `malformed` names
  our keys found malformed and skipped or replaced ({key, what, ...}: lib/own_keys.lua; a
  rate-limit key `emq:{<q>}:sweep` without an expiry, which would refuse every round
  forever, is replaced too).
]]
-- @include lib/lease.lua
-- @include lib/record.lua

local leases_key, stalled_key, sweep_key, stats_key = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local queue_key, moving_key, started_key, failed_key, outbox_key = KEYS[5], KEYS[6], KEYS[7], KEYS[8], KEYS[9]
local window_ms, batch, prefix = tonumber(ARGV[1]), tonumber(ARGV[2]), ARGV[3]
local default_failure_ttl, default_max, mode, ended_at = tonumber(ARGV[4]), tonumber(ARGV[5]), ARGV[6], ARGV[7]
local grace_ms = tonumber(ARGV[8])
local job_prefix, rq_prefix = ARGV[9], ARGV[10]
local dry = mode == 'dry-run'

local recorded = redis.pcall('GET', prefix .. 'job_prefix')
if refused(recorded) then
  malformed(prefix .. 'job_prefix', 'not a string: no job key prefix recorded to check')
elseif recorded and recorded ~= job_prefix then
  return {-1, recorded}
end

-- ours always lapses: one without an expiry (or of another type) would refuse every round
if mode == 'round' and not redis.call('SET', sweep_key, '1', 'NX', 'PX', window_ms) then
  if redis.call('PTTL', sweep_key) ~= -1 then return {0} end
  redis.call('SET', sweep_key, '1', 'PX', window_ms)
  malformed(sweep_key, 'held no expiry (every round refused): replaced')
end

local now = now_ms()
-- when a round last ran, for readers (the dashboard): one SET, only in a round that runs
if mode == 'round' then redis.call('SET', prefix .. 'swept', string.format('%d ', now) .. (ARGV[11] or '')) end
local counts = {}
local marked, requeued, failed, dropped, ended = {}, {}, {}, {}, {}
local unmarked, more = 0, 0

-- an entry of the moving list (ours alone: no stock worker moves a job there) is a job
-- our BLMOVE moved and no claim has leased: its worker died between the two
local function orphaned_in_moving(job_id)
  return index_read('list', false, 'LPOS', moving_key, job_id) ~= false
end

-- Whether a marked job is still in flight as we left it. Leased: its owner is a lease
-- token (not `done:` after a finish, nor `outbox` after a stall failure) and RQ has not
-- moved it on since our last write (a changed field alone is no evidence: placed_by_rq). Found lock-less in the moving list (its
-- worker died between BLMOVE and the lease): RQ still has it queued.
local function still_in_flight(job_key, job_id, leased)
  local found = lease_fields(job_key)
  local owner = found[1]
  if not leased then return found[2] == 'queued' end
  if not owner or owner:sub(1, 5) == 'done:' or owner:sub(1, 6) == 'outbox' then return false end
  return untouched(found, 2) or not placed_by_rq(job_key, job_id, queue_key, rq_prefix)
end

-- Phase 2: recover what an earlier round marked and is still without a lock.
local due_marks = index_read('zset', {}, 'ZRANGEBYSCORE', stalled_key, '-inf', now - grace_ms, 'LIMIT', 0, batch)
if #due_marks == batch then more = 1 end
for _, job_id in ipairs(due_marks) do
  local lock_key = prefix .. job_id .. ':lock'
  local job_key = job_prefix .. job_id
  local leased = index_read('zset', false, 'ZSCORE', leases_key, job_id) ~= false
  if redis.call('EXISTS', lock_key) == 1 or not (leased or orphaned_in_moving(job_id)) then
    if not dry then index_write('zset', 'ZREM', stalled_key, job_id) end
    unmarked = unmarked + 1
  elseif redis.call('EXISTS', job_key) == 0 then
    if not dry then
      index_write('zset', 'ZREM', stalled_key, job_id)
      index_write('zset', 'ZREM', leases_key, job_id)
      index_write('list', 'LREM', moving_key, 0, job_id)
    end
    dropped[#dropped + 1] = job_id
  elseif not still_in_flight(job_key, job_id, leased) then
    if not dry then
      index_write('zset', 'ZREM', stalled_key, job_id)
      index_write('zset', 'ZREM', leases_key, job_id)
      redis.call('DEL', lock_key)
      if not leased then index_write('list', 'LREM', moving_key, 0, job_id) end
      drop_stale_pin(started_key, job_key)
      redis.call('HDEL', job_key, unpack(NOTES))
    end
    ended[#ended + 1] = job_id
  else
    local attempts, max_attempts, exhausted, failure_ttl, no_progress = attempts_used(job_key, default_max)
    if exhausted then
      failed[#failed + 1] = job_id
    else
      requeued[#requeued + 1] = job_id
    end
    if not dry then
      local holder = leased and redis.call('HGET', job_key, 'emq_worker') or ''
      release_started(started_key, job_key, job_id, rq_prefix)
      index_write('list', 'LREM', moving_key, 0, job_id)
      drop_lease(job_key, lock_key, leases_key, stalled_key, job_id, false)
      -- a lease its renewals stopped holding for want of progress says so
      local why = (no_progress and (no_progress .. ' on attempt ') or 'stalled on attempt ')
        .. attempts .. ' of ' .. max_attempts
      if exhausted then
        fail_to_outbox(job_key, failed_key, outbox_key, job_id, why, failure_ttl, default_failure_ttl, ended_at, now)
        record_event(prefix, counts, 'failed', job_id, holder, why)
      else
        requeue_front(job_key, queue_key, job_id)
        record_event(prefix, counts, 'recovered', job_id, holder, why)
      end
    end
  end
end

-- Phase 1: mark leased jobs past their deadline whose lock is gone.
local function mark(job_id, leased)
  -- a marked lease leaves the due range until phase 2 may act on it
  if leased and not dry then index_write('zset', 'ZADD', leases_key, now + grace_ms, job_id) end
  if index_read('zset', false, 'ZSCORE', stalled_key, job_id) then return end
  if not dry then
    index_write('zset', 'ZADD', stalled_key, now, job_id)
    local holder = leased and redis.call('HGET', job_prefix .. job_id, 'emq_worker') or ''
    local why = leased and 'its lock lapsed' or 'taken from the queue, never leased'
    record_event(prefix, counts, 'marked', job_id, holder, why)
  end
  marked[#marked + 1] = job_id
end

local due_leases = index_read('zset', {}, 'ZRANGEBYSCORE', leases_key, '-inf', now, 'LIMIT', 0, batch)
if #due_leases == batch then more = 1 end
for _, job_id in ipairs(due_leases) do
  local ttl = redis.call('PTTL', prefix .. job_id .. ':lock')
  if ttl > 0 then
    -- the lock lives on: a stale deadline; index it where the lock ends
    if not dry then index_write('zset', 'ZADD', leases_key, now + ttl, job_id) end
  elseif ttl == -1 then
    if not dry then index_write('zset', 'ZADD', leases_key, now + window_ms, job_id) end
  elseif redis.call('EXISTS', job_prefix .. job_id) == 0
      and not index_read('zset', false, 'ZSCORE', stalled_key, job_id) then
    if not dry then index_write('zset', 'ZREM', leases_key, job_id) end
    dropped[#dropped + 1] = job_id
  else
    mark(job_id, true)
  end
end

-- The moving list is short-lived (BLMOVE, then the lease within milliseconds), so the
-- first `batch` entries are all a call needs to look at.
local waiting = index_read('list', {}, 'LRANGE', moving_key, 0, batch - 1)
for _, job_id in ipairs(waiting) do
  if index_read('zset', false, 'ZSCORE', leases_key, job_id) == false then mark(job_id, false) end
end

if not dry then
  count(stats_key, 'marked', #marked)
  count(stats_key, 'recovered', #requeued)
  count(stats_key, 'failed', #failed)
  count(stats_key, 'unmarked', unmarked)
  count(stats_key, 'ended_by_rq', #ended)
  record_minute(prefix, counts, now)
end
local outbox_due = index_read('zset', 0, 'ZCOUNT', outbox_key, '-inf', now)
return {1, marked, requeued, failed, unmarked, dropped, more, outbox_due, ended, MALFORMED}
