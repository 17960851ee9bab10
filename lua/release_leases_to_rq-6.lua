--[[ release_leases_to_rq: hand a queue's leased jobs back to stock RQ's handling (a fleet
rolled back to stock workers: `rq-emq rollback`).

A lease worker pins the started-registry entry of each run it holds (score +inf), so no
stock process fails it while the lease entry exists, and leaves the rest to the sweep.
With no lease worker left, nothing would ever sweep. This call, for each lease whose lock
is gone (a lock alive means a lease worker still runs the job: it is left, and counted):
  - a run that started (its pinned entry is named by the job hash's `emq_started`): the
    entry is scored due now, so stock cleanup treats the job as stock RQ would treat an
    abandoned one (failed with AbandonedJobError, or retried through `Retry`);
  - a take that never started (no RQ execution): nothing ran; back to the front of its
    queue, status queued;
  - then our bookkeeping goes: lock, lease index entry, stall mark, `emq_token`,
    `emq_started` and the fields the lease recorded (`emq_status`, ...).
Jobs in the moving list (moved by an idle lease worker's BLMOVE, never claimed) go back
to the front of their queue, and pinned entries left without a lease entry are scored due.

KEYS:
  1 emq:{<q>}:leases   2 emq:{<q>}:stalled   3 rq:wip:<q>   4 rq:queue:<q>
  5 emq:{<q>}:moving   6 emq:{<q>}:stats
ARGV:
  1 lease key prefix `emq:{<q>}:`   2 job key prefix (`rq:job:`)   3 RQ's key prefix (`rq:`)
  4 batch (entries looked at per part)   5 offset into the lease index (leases left
  alive by earlier calls of this pass)
Returns: {unpinned, requeued, alive, more, malformed}: runs handed to stock cleanup, jobs
put back in their queue, leases left because their lock is alive, 1 when the caller should
call again (with offset + alive), and our keys found malformed and skipped or replaced
({key, what, ...}: lib/own_keys.lua). {-1, what} when RQ's queue list or started registry
is of another type: nothing could be handed back there, and nothing was written.
]]
-- @include lib/lease.lua

local leases_key, stalled_key, started_key, queue_key, moving_key, stats_key =
  KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]
local prefix, job_prefix, rq_prefix = ARGV[1], ARGV[2], ARGV[3]
local batch, offset = tonumber(ARGV[4]), tonumber(ARGV[5])
local due_now = math.floor(now_ms() / 1000)
local unpinned, requeued, alive, more = 0, 0, 0, 0

-- RQ's keys this writes, checked before the first write (a script cannot be rolled back:
-- a job put back as queued into no queue list would be lost to every worker)
if refused(redis.pcall('LLEN', queue_key)) then return {-1, queue_key .. ' is not a list'} end
if refused(redis.pcall('ZSCORE', started_key, '')) then return {-1, started_key .. ' is not a sorted set'} end

-- Score a pinned entry due now; true when there was one.
local function unpin(job_key)
  local pinned = redis.call('HGET', job_key, 'emq_started')
  if not pinned then return false end
  local score = redis.call('ZSCORE', started_key, pinned)
  if not score or tonumber(score) ~= math.huge then return false end
  redis.call('ZADD', started_key, 'XX', due_now, pinned)
  return true
end

local ids = index_read('zset', {}, 'ZRANGE', leases_key, offset, offset + batch - 1)
if #ids == batch then more = 1 end
for _, job_id in ipairs(ids) do
  local lock_key = prefix .. job_id .. ':lock'
  local job_key = job_prefix .. job_id
  if redis.call('EXISTS', lock_key) == 1 then
    alive = alive + 1
  else
    if unpin(job_key) then
      unpinned = unpinned + 1
    elseif redis.call('EXISTS', job_key) == 1
      and redis.call('EXISTS', rq_prefix .. 'executions:' .. job_id) == 0 then
      redis.call('HSET', job_key, 'status', 'queued')
      redis.call('LPUSH', queue_key, job_id)
      requeued = requeued + 1
    end
    index_write('zset', 'ZREM', leases_key, job_id)
    index_write('zset', 'ZREM', stalled_key, job_id)
    if redis.call('EXISTS', job_key) == 1 then
      redis.call('HDEL', job_key, 'emq_token', 'emq_started', unpack(NOTES))
      forget_seen(job_key)
    end
  end
end

local moving = index_read('list', {}, 'LRANGE', moving_key, 0, batch - 1)
if #moving == batch then more = 1 end
for _, job_id in ipairs(moving) do
  index_write('list', 'LREM', moving_key, 1, job_id)
  redis.call('LPUSH', queue_key, job_id)
  requeued = requeued + 1
end

-- pinned entries whose lease entry is gone already (only those whose job names them)
local strays = redis.call('ZRANGEBYSCORE', started_key, '+inf', '+inf', 'LIMIT', 0, batch)
for _, member in ipairs(strays) do
  local job_id = string.match(member, '^[^:]*')
  local job_key = job_prefix .. job_id
  if redis.call('HGET', job_key, 'emq_started') == member
    and not index_read('zset', false, 'ZSCORE', leases_key, job_id) and unpin(job_key) then
    redis.call('HDEL', job_key, 'emq_started')
    unpinned = unpinned + 1
  end
end

count(stats_key, 'released_to_rq', unpinned + requeued)
return {unpinned, requeued, alive, more, MALFORMED}
