--[[ pop_job: take the first job waiting on the given queues, in order, and lease it.

One atomic step replaces RQ's BLPOP/BLMOVE + fetch: there is no moment at which the job
is out of its queue without a lease, so no crash can lose it. The lease is written before
the job leaves its queue, so a write that fails (a bad argument, a full server) leaves
the job where it was.

An entry whose job id an earlier run still holds (lib/lease.lua `take_verdict`: the job was
deleted, or enqueued again, while that run went on) stays at its place: the take looks past
it (up to BUSY_LOOK such entries per queue) and the job is taken once that run's lock is gone.

KEYS (3 per queue i = 1..n, in priority order):
  3i-2  <queue prefix><q>   the queue list (`rq:queue:<q>`)
  3i-1  emq:{<q>}:leases    lease deadline index (zset id -> ms)
  3i    emq:{<q>}:stats     counters
ARGV:
  1  token (>= 128 random bits + worker name)
  2  worker name
  3  lease_ms
  4  how many dropped ids (deleted jobs, stray copies) to skip in this call
  4+i  lease key prefix of queue i, `emq:{<q>}:`
  5+n  job key prefix (the job class's, `rq:job:`)
  6+n  RQ's key prefix (`rq:`), for the registries RQ keeps a job in
  7+n  RQ's suspension key (`rq:suspended`, set by `rq suspend`), or "": while it exists
       nothing is taken (the first take after a job carries RQ's suspension check)
Returns:
  {}                            every queue is empty
  {-2}                          RQ's workers are suspended: nothing taken
  {0, skipped}                  only dropped ids were found; call again
  {-1, skipped, busy_ms}        no job to take now, but entries wait for an earlier run of
                                their job id to end: the first of those locks lapses
                                within busy_ms (its holder releases it as its run ends)
  {i, job_id, attempts, skipped, malformed, field, value, ...}  the job (its hash as HGETALL
                                gives it); `malformed` names our keys found malformed and
                                skipped or replaced ({key, what, ...}: lib/own_keys.lua)
  where `skipped` lists popped ids dropped unrun: a job whose hash no longer exists (as RQ
  does), or a stray copy (lib/lease.lua `take_verdict`: a push a client sent again after a
  lost reply, found while the job runs under a live lease or while RQ has it elsewhere).
]]
-- @include lib/lease.lua

-- Entries of one queue held back by an earlier run's live lock that a take looks past (each
-- costs four reads): a few such ids never hold up the jobs behind them.
local BUSY_LOOK = 10

local token, worker, lease_ms = ARGV[1], ARGV[2], tonumber(ARGV[3])
local skip_budget = tonumber(ARGV[4])
local skipped = {}
local busy_ms = nil
local n = #KEYS / 3
local job_prefix, rq_prefix, suspended_key = ARGV[5 + n], ARGV[6 + n], ARGV[7 + n]
if suspended_key and suspended_key ~= '' and redis.call('EXISTS', suspended_key) == 1 then return {-2} end

-- Take the entry at `at` out of its queue: every entry before it is another job id (one
-- held back), so LREM's first match from the head is this one.
local function take_out(queue_key, at, job_id)
  if at == 0 then
    redis.call('LPOP', queue_key)
  else
    redis.call('LREM', queue_key, 1, job_id)
  end
end

for i = 1, n do
  local queue_key, leases_key, stats_key = KEYS[3 * i - 2], KEYS[3 * i - 1], KEYS[3 * i]
  local at = 0  -- entries before `at` are held back by an earlier run
  while at < BUSY_LOOK do
    local job_id = redis.call('LINDEX', queue_key, at)
    if not job_id then break end
    local job_key = job_prefix .. job_id
    local hash = redis.call('HGETALL', job_key)
    local lock_key = ARGV[4 + i] .. job_id .. ':lock'
    local verdict, left = 'gone', nil
    if #hash > 0 then verdict, left = take_verdict(hash, lock_key, job_key, job_id, rq_prefix) end
    if verdict == 'take' then
      local attempts = grant_lease(job_key, lock_key, leases_key, stats_key, job_id, token, worker,
        lease_ms, hash)
      take_out(queue_key, at, job_id)
      local reply = {i, job_id, attempts, skipped, MALFORMED}
      for k = 1, #hash do reply[5 + k] = hash[k] end
      return reply
    elseif verdict == 'busy' then
      -- left at its place: no second run while the first holds the job id
      busy_ms = math.min(busy_ms or left, left)
      at = at + 1
    else
      -- a deleted job's id, or a stray copy (run under a live lease, or ended): dropped
      take_out(queue_key, at, job_id)
      skipped[#skipped + 1] = job_id
      if #skipped >= skip_budget then return {0, skipped} end
    end
  end
end
if busy_ms then return {-1, skipped, busy_ms} end
if #skipped > 0 then return {0, skipped} end
return {}
