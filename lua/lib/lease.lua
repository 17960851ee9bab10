-- lib/lease.lua: helpers shared by the scripts that grant, end and recover leases.
-- Included (textually, by rq_emq/scripts.py) where a script says `-- @include lib/lease.lua`.
-- Redis-side time only: no clock of any client is trusted.
-- Our own keys are written through lib/own_keys.lua: a malformed one fails no script.
-- @include lib/own_keys.lua

local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- The value of `field` in `hash`, a job hash as HGETALL returns it, and its position.
local function hash_field(hash, field)
  for i = 1, #hash, 2 do
    if hash[i] == field then return hash[i + 1], i + 1 end
  end
  return nil, nil
end

-- Each field's value position in `hash` (as HGETALL returns it): field -> position.
local function value_positions(hash)
  local position = {}
  for i = 1, #hash, 2 do position[hash[i]] = i + 1 end
  return position
end

-- A count our scripts stored (attempts, max attempts): digits only, else nil. Anything
-- else (a float, "nan", "1e3", a negative number) reads as absent, the same way in every
-- script and in Python, so a malformed value can neither crash a script nor exempt a job.
local function count_value(value)
  if type(value) ~= 'string' or #value > 15 or not string.match(value, '^%d+$') then return nil end
  return tonumber(value)
end

-- What says which enqueue and which start of a job this is: RQ's status, and the two
-- stamps RQ rewrites with the time of day on every enqueue (enqueued_at: `_enqueue_job`,
-- a rate-limit promotion, the scheduler, `requeue`, `Retry`) and every start
-- (started_at: `prepare_for_execution`), in RQ 2.0 to 3.x. Our scripts record their
-- values after each of the lease's own writes (`emq_status`, `emq_enqueued_at`,
-- `emq_started_at`). A status that left and came back cannot fake them: coming back to
-- `queued` is an enqueue and to `started` a start, each with a stamp of its own.
local SEEN = {'status', 'enqueued_at', 'started_at'}
local RECORDED = {'emq_status', 'emq_enqueued_at', 'emq_started_at'}

-- What the running job told its lease (`rq_emq.current_lease().report(...)`): its last
-- report (JSON), when it last showed progress (its grant or its last report, Redis ms),
-- and why a renewal stopped holding it (its progress timeout passed); and when the lease
-- was granted (Redis ms: its age for readers). Gone with the lease.
local NOTES = {'emq_report', 'emq_progress_at', 'emq_no_progress', 'emq_granted_at'}

-- Every field a lease keeps on the job hash that must go when the lease does.
local function lease_only_fields(...)
  local fields = {...}
  for _, name in ipairs(RECORDED) do fields[#fields + 1] = name end
  for _, name in ipairs(NOTES) do fields[#fields + 1] = name end
  return fields
end

-- The job's seen fields now, as {field, value, ...} of the recorded ones, for HSET.
local function seen_record(job_key)
  local values = redis.call('HMGET', job_key, unpack(SEEN))
  local record = {}
  for i = 1, #SEEN do
    record[#record + 1] = RECORDED[i]
    record[#record + 1] = values[i] or ''
  end
  return record
end

-- Whether nothing but the lease's own writes changed the job: `found` holds, from
-- position `at`, the SEEN values then the RECORDED ones (HMGET order). A lease taken by
-- an older version records no stamps; what it did record is still compared.
local function untouched(found, at)
  for i = 0, #SEEN - 1 do
    local recorded = found[at + #SEEN + i]
    if recorded and (found[at + i] or '') ~= recorded then return false end
  end
  return true
end

-- HMGET of the owner, then SEEN, then RECORDED: what lease_state and the sweep compare;
-- last the lease's length (for the finish's tombstone, finish_job).
local function lease_fields(job_key)
  return redis.call('HMGET', job_key, 'emq_token', 'status', 'enqueued_at', 'started_at',
    'emq_status', 'emq_enqueued_at', 'emq_started_at', 'emq_lease_ms')
end

-- The value of a job's lock key (its holder's token, or `done:<token>` that a finish
-- leaves), or nil. A lock of another type (no script of ours writes one) is no holder's:
-- read as none and noted; the next grant's SET replaces it.
local function lock_value(lock_key)
  local reply = redis.pcall('GET', lock_key)
  if wrong_type(reply) then
    malformed(lock_key, 'not a string: no lease holds it; the next grant replaces it')
    return nil
  end
  if refused(reply) then return error(reply) end
  return reply or nil
end

-- Whether a job is in flight under a live lease: its lock (`lock`, its value) names the
-- job's owner, and nothing but that lease's writes changed the job since (`untouched`).
-- An entry of such a job in a queue list is a stray duplicate (a client's push retried
-- after a Redis restart: redis-py retries a command whose reply the restart lost), never
-- a second run. `hash` is the job's HGETALL, which the taking scripts read anyway.
local function leased_live(hash, lock)
  local owner = (hash_field(hash, 'emq_token'))
  if not owner or owner:sub(1, 5) == 'done:' or owner:sub(1, 6) == 'outbox' then return false end
  local found = {owner}
  for i = 1, #SEEN do found[1 + i] = (hash_field(hash, SEEN[i])) end
  for i = 1, #RECORDED do found[1 + #SEEN + i] = (hash_field(hash, RECORDED[i])) end
  return untouched(found, 2) and lock == owner
end

-- Where RQ puts a job as it writes each status that takes it out of the queues: the
-- registry `<RQ prefix><name>:<origin>` that holds it (RQ 2.0 to 3.x). A status is read as
-- RQ's doing only with the job found there: a whole-hash `job.save()` of a copy a web
-- process fetched earlier writes an old status back and puts the job nowhere.
local PLACED_IN = {
  finished = 'finished:', failed = 'failed:', stopped = 'failed:', canceled = 'canceled:',
  scheduled = 'scheduled:', deferred = 'deferred:', ready_to_enqueue = 'ready:',
}
-- How far from each end of a queue list a job RQ pushed again is looked for: RQ pushes at
-- the tail (at the head with `at_front`), so a push since the lease's last write sits near
-- one end unless thousands were pushed after it. Bounded work whatever the queue's length.
local QUEUE_LOOK = 1000

-- Whether RQ put job_id somewhere its status says (the evidence "RQ moved it on" is read
-- from): `queued` in its queue list (queue_key); `started` under an execution in RQ's
-- started registry that is not a lease's pin (a stock worker's run: a finite score);
-- RQ 3's `rate_limited` in the waiting set of the limit key the job names
-- (`<RQ prefix>rl:<key>:rate_limited`); an end or waiting status in its registry
-- (PLACED_IN).
local function placed_by_rq(job_key, job_id, queue_key, rq_prefix)
  local found = redis.call('HMGET', job_key, 'status', 'origin', 'rate_limit_key')
  local status, origin = found[1], found[2]
  if not status then return false end
  if status == 'queued' then
    return redis.call('LPOS', queue_key, job_id, 'MAXLEN', QUEUE_LOOK) ~= false
      or redis.call('LPOS', queue_key, job_id, 'RANK', -1, 'MAXLEN', QUEUE_LOOK) ~= false
  end
  if status == 'rate_limited' then
    local limit = found[3]
    return limit ~= false and limit ~= ''
      and redis.call('ZSCORE', rq_prefix .. 'rl:' .. limit .. ':rate_limited', job_id) ~= false
  end
  if not origin then return false end
  if status == 'started' then
    local started_key = rq_prefix .. 'wip:' .. origin
    for _, execution_id in ipairs(redis.call('ZRANGE', rq_prefix .. 'executions:' .. job_id, 0, 63)) do
      local score = redis.call('ZSCORE', started_key, job_id .. ':' .. execution_id)
      if score and tonumber(score) ~= math.huge then return true end
    end
    return false
  end
  local registry = PLACED_IN[status]
  return registry ~= nil and redis.call('ZSCORE', rq_prefix .. registry .. origin, job_id) ~= false
end

-- What a take makes of an entry of a job in a queue list (`hash`: the job's HGETALL):
-- 'stray': a stray copy, dropped unrun: a duplicate of a push that a client sent again
--   after a lost reply (redis-py resends a command or a transaction after a connection
--   error, whether or not Redis ran it: a producer's enqueue, RQ's scheduler moving a due
--   job, RQ 3's fan-in enqueueing a dependent twice), found while the job runs under a live
--   lease (`leased_live`) or while RQ has it elsewhere (`placed_by_rq`: ended, scheduled,
--   deferred, or started by a stock worker). Running it would run the job again, or early.
--   A status that RQ's placement does not back (a stale whole-hash save) leaves the entry a
--   job waiting to run.
-- 'busy', and the ms left on the lock: an earlier run of this job id still holds its lock
--   (the job was deleted, or RQ enqueued it again, while that run went on). Its holder's
--   renewal finds the lease lost (its job hash no longer names it) and stops the run, or
--   its local lease clock does before the lock lapses; its end releases the lock
--   (`release_own_lock`). Until then the entry stays where RQ reads it: no second run.
-- 'take': a job waiting to run.
-- The lock is read once (one GET per take; its PTTL only for a lock a holder's token holds).
local function take_verdict(hash, lock_key, job_key, job_id, rq_prefix)
  local status = hash_field(hash, 'status')
  if status and status ~= 'queued' then
    if placed_by_rq(job_key, job_id, nil, rq_prefix) then return 'stray' end
  end
  local lock = lock_value(lock_key)
  if leased_live(hash, lock) then return 'stray' end
  -- a finish leaves `done:<token>`; ours always expire (one that does not was written by
  -- something else, and would hold the job back for ever)
  if lock and lock:sub(1, 5) ~= 'done:' then
    local left = redis.call('PTTL', lock_key)
    if left > 0 then return 'busy', left end
  end
  return 'take'
end

-- Delete a lock that still holds `token` once its run is over and its lease was not
-- settled by this holder (the job hash no longer names it: `check_holder`), so a new take
-- of the job id (held back by `take_verdict` while it lives) need not wait for it to
-- lapse. Another holder's lock is left alone.
local function release_own_lock(lock_key, token)
  if lock_value(lock_key) == token then redis.call('DEL', lock_key) end
end

-- Forget what the lease recorded: the job is no lease's now (handed back, recovered).
local function forget_seen(job_key)
  redis.call('HDEL', job_key, unpack(RECORDED))
end

-- Whether `token` still holds job_key: 'held' when it owns the job and nothing but the
-- lease's own writes changed it since the take (`untouched`), or something did but RQ put
-- the job nowhere (a stale whole-hash save: the job is still this run's, in no other
-- place); 'ended' when it owns it but RQ or an operator (cancel, stock cleanup, a
-- requeue, a stock worker's run, ...) changed it since and put it where its status says
-- (`placed_by_rq`); 'lost' when the job is someone else's, or gone.
-- The lease's length (ms, as granted) comes second.
local function lease_state(job_key, job_id, token, queue_key, rq_prefix)
  local found = lease_fields(job_key)
  if found[1] ~= token then return 'lost' end
  local lease_ms = count_value(found[8])
  if untouched(found, 2) then return 'held', lease_ms end
  if placed_by_rq(job_key, job_id, queue_key, rq_prefix) then return 'ended', lease_ms end
  return 'held', lease_ms
end

-- Grant job_id to the holder of `token`: lock with a PX expiry, deadline in the index,
-- one more attempt counted, the next fencing token, the owner and the job's seen fields
-- at the take recorded on the job hash (the fence). `hash` is the job's hash as HGETALL
-- gave it (the caller's existence check); it is updated to match, so the caller can
-- return it without reading the job again. The max attempts is not written here: a job
-- without its own keeps "the configured default", which the sweep and `rq-emq leases`
-- read as such.
--
-- The fencing token (`emq_fence`) rises on every grant of the job, and nothing else writes
-- or removes it (a finish clears the attempts, never the token): an outside store that
-- keeps the highest token it has seen refuses a holder that was replaced. It is the
-- grant's Redis time in ms, or one more than the last token when that is higher (two
-- grants in one ms): a count kept only in Redis would start again at 1 after Redis lost
-- its data (a restart without persistence) while the holder of a higher token still ran,
-- and the clock is the one thing such a loss leaves. (Limit: a Redis clock set back.)
local function grant_lease(job_key, lock_key, leases_key, stats_key, job_id, token, worker, lease_ms, hash)
  local now = now_ms()
  redis.call('SET', lock_key, token, 'PX', lease_ms)
  index_write('zset', 'ZADD', leases_key, now + lease_ms, job_id)
  -- one value only: hash_field's second return value is a position
  local attempts = (count_value((hash_field(hash, 'emq_attempts'))) or 0) + 1
  local fencing_token = math.max((count_value((hash_field(hash, 'emq_fence'))) or 0) + 1, now)
  -- emq_lease_ms: the length its renewals keep too, so readers tell a lease's age from its deadline
  local fields = {'emq_attempts', tostring(attempts), 'emq_token', token, 'emq_worker', worker,
    'emq_lease_ms', string.format('%d', lease_ms), 'emq_fence', string.format('%d', fencing_token),
    'emq_progress_at', string.format('%d', now), 'emq_granted_at', string.format('%d', now)}
  -- the rest looked up by position, indexed in one pass: a scan per field went through the
  -- whole hash for each one a first take does not find (50k of a take's 370k Redis instructions)
  local position = value_positions(hash)
  -- a report of an earlier grant that no end forgot (a lease RQ ended) is not this one's
  if position['emq_report'] or position['emq_no_progress'] then
    redis.call('HDEL', job_key, 'emq_report', 'emq_no_progress')
    for i = #hash - 1, 1, -2 do
      if hash[i] == 'emq_report' or hash[i] == 'emq_no_progress' then
        table.remove(hash, i + 1)
        table.remove(hash, i)
      end
    end
    position = value_positions(hash)
  end
  for i = 1, #SEEN do
    local at = position[SEEN[i]]
    fields[#fields + 1] = RECORDED[i]
    fields[#fields + 1] = at and hash[at] or ''
  end
  redis.call('HSET', job_key, unpack(fields))
  -- the caller's copy follows
  for i = 1, #fields, 2 do
    local at = position[fields[i]]
    if at then
      hash[at] = fields[i + 1]
    else
      hash[#hash + 1] = fields[i]
      hash[#hash + 1] = fields[i + 1]
    end
  end
  count(stats_key, 'taken', 1)
  return attempts
end

-- Run the `count` commands packed in ARGV from position `pos` (per command: its argument
-- count, then its arguments), as RQ queued them for one transaction. An error reply takes
-- its command's place, as EXEC would report it. Returns the replies.
local function run_packed(pos, count)
  local replies = {}
  for i = 1, count do
    local argc = tonumber(ARGV[pos])
    replies[i] = redis.pcall(unpack(ARGV, pos + 1, pos + argc))
    pos = pos + argc + 1
  end
  return replies
end

-- What MULTI would refuse as the `count` commands packed from ARGV position `pos` are
-- queued, so that EXEC would abort and write nothing: an unknown command, a wrong number
-- of arguments, or one the caller's ACL user may not run. Found before any of them runs
-- (a script cannot be rolled back: a refusal met while running them would leave the ones
-- before it written). Returns nil, or the command's position and the error MULTI gives.
-- Arity and existence come from one COMMAND INFO of all their names (a user who may not
-- run it gets neither checked here); the ACL from redis.acl_check_cmd, which scripts have
-- from Redis 7.0 (on 6.2 an ACL refusal is met as it runs: an error reply in its place).
local function refused_at_queue(pos, count)
  local names, at = {}, {}
  for i = 1, count do
    at[i] = pos
    names[i] = string.lower(ARGV[pos + 1])
    pos = pos + tonumber(ARGV[pos]) + 1
  end
  local specs = redis.pcall('COMMAND', 'INFO', unpack(names))
  for i = 1, count do
    local argc, first = tonumber(ARGV[at[i]]), at[i] + 1
    local unknown = "ERR unknown command '" .. ARGV[first] .. "'"
    if not refused(specs) then
      if not specs[i] then return i, unknown end
      local arity = tonumber(specs[i][2])
      if (arity >= 0 and argc ~= arity) or (arity < 0 and argc < -arity) then
        return i, "ERR wrong number of arguments for '" .. names[i] .. "' command"
      end
    end
    if redis.acl_check_cmd then
      local known, allowed = pcall(redis.acl_check_cmd, unpack(ARGV, first, first + argc - 1))
      if not known then return i, unknown end
      if not allowed then
        return i, "NOPERM this user has no permissions to run the '" .. names[i] .. "' command or its subcommand"
      end
    end
  end
  return nil
end

-- Forget the lease on job_id: lock, index entry and stall mark. The owner token is
-- replaced by `settled` (so the holder's next renewal learns the job ended normally
-- rather than being taken from it), or removed when `settled` is false. Returns whether
-- the job hash exists.
local function drop_lease(job_key, lock_key, leases_key, stalled_key, job_id, settled)
  redis.call('DEL', lock_key)
  index_write('zset', 'ZREM', leases_key, job_id)
  index_write('zset', 'ZREM', stalled_key, job_id)
  if redis.call('EXISTS', job_key) == 0 then return false end
  if settled then
    redis.call('HSET', job_key, 'emq_token', settled)
    redis.call('HDEL', job_key, unpack(NOTES))
  else
    redis.call('HDEL', job_key, 'emq_token', unpack(NOTES))
  end
  return true
end

-- lease_state, with the bookkeeping of a refusal. The lock is what holds the job's next
-- take back (`take_verdict`), so it goes only with its run: a caller that knows the run is
-- over (`run_over`: its job returned, or its process was seen gone) releases a lease RQ
-- ended (the holder's next renewal reads it as settled: the job is RQ's again; counted in
-- `ended_by_rq`) and a lock that still holds its token on a job that is not its own any
-- more (`release_own_lock`: deleted, or enqueued again, while it ran). A refusal in the
-- middle of a run (a guarded write of the run's own) proves nothing about its end: it
-- leaves both as they are. A lease that is not ours is counted in `fenced`. Returns the
-- state (and the lease's length).
local function check_holder(job_key, lock_key, leases_key, stalled_key, stats_key, job_id, token,
    queue_key, rq_prefix, run_over)
  local state, lease_ms = lease_state(job_key, job_id, token, queue_key, rq_prefix)
  if state == 'ended' and run_over then
    drop_lease(job_key, lock_key, leases_key, stalled_key, job_id, 'done:' .. token)
    count(stats_key, 'ended_by_rq', 1)
  elseif state == 'lost' then
    if run_over then release_own_lock(lock_key, token) end
    count(stats_key, 'fenced', 1)
  end
  return state, lease_ms
end

-- Take job_id out of RQ's view of "in flight": its executions (rq:executions:<id>, a
-- small per-job zset) name the started-registry members `<id>:<execution>` to remove,
-- so no stale entry can later fall due and make stock cleanup fail a re-run.
-- `rq_prefix` is RQ's key prefix (`rq:`; RQ 3 reads it from RQ_KEY_PREFIX).
local function remove_executions(started_key, job_id, rq_prefix)
  local registry = rq_prefix .. 'executions:' .. job_id
  local ids = redis.call('ZRANGE', registry, 0, 63)
  for _, execution_id in ipairs(ids) do
    local member = job_id .. ':' .. execution_id
    local execution_key = rq_prefix .. 'execution:' .. member
    local worker = redis.call('HGET', execution_key, 'worker_name')
    if worker and worker ~= '' then
      redis.call('SREM', rq_prefix .. 'worker:' .. worker .. ':executions', member)
    end
    redis.call('ZREM', started_key, member)
    redis.call('DEL', execution_key)
  end
  redis.call('DEL', registry)
end

-- remove_executions, and first the run's pinned entry (scored +inf by a lease worker;
-- its member recorded on the job hash as `emq_started`), which outlives RQ's execution
-- records when the whole fleet was down: RQ's records expire, the pin never does.
local function release_started(started_key, job_key, job_id, rq_prefix)
  local pinned = redis.call('HGET', job_key, 'emq_started')
  if pinned then
    redis.call('ZREM', started_key, pinned)
    redis.call('HDEL', job_key, 'emq_started')
  end
  remove_executions(started_key, job_id, rq_prefix)
end

-- The pinned entry of a job RQ ended while it was leased, if RQ left it: stale, and
-- pinned it would show the job as started forever. An entry RQ wrote since (a stock
-- worker's run) has another member, and a finite score: left alone.
local function drop_stale_pin(started_key, job_key)
  local pinned = redis.call('HGET', job_key, 'emq_started')
  if not pinned then return end
  local score = redis.call('ZSCORE', started_key, pinned)
  if score and tonumber(score) == math.huge then redis.call('ZREM', started_key, pinned) end
  redis.call('HDEL', job_key, 'emq_started')
end

-- A leased job's attempts so far (this one included), the most it may have (its own,
-- else `default_max`), whether they are used up, its raw failure_ttl field, and why its
-- holder's renewals were refused if its progress timeout passed (else nil).
local function attempts_used(job_key, default_max)
  local counts = redis.call('HMGET', job_key, 'emq_attempts', 'emq_max_attempts', 'failure_ttl', 'emq_no_progress')
  local attempts = count_value(counts[1]) or 0
  local max_attempts = count_value(counts[2]) or default_max
  return attempts, max_attempts, attempts >= max_attempts and attempts > 0, counts[3], counts[4] or nil
end

-- Put a job whose lease was just dropped back at the front of its queue. An in-flight
-- job is in no queue list, so no LREM, whose cost would grow with the queue's length.
local function requeue_front(job_key, queue_key, job_id)
  redis.call('HSET', job_key, 'status', 'queued')
  forget_seen(job_key)
  redis.call('LPUSH', queue_key, job_id)
end

-- Fail a job whose lease was just dropped: RQ's failed registry (status failed, the
-- job's failure_ttl else `default_ttl`) and an outbox entry with owner `outbox`, so that
-- only the outbox drain completes the failure (RQ's Result, the failure callback) once.
local function fail_to_outbox(job_key, failed_key, outbox_key, job_id, reason, failure_ttl, default_ttl, ended_at, now)
  local ttl = tonumber(string.match(failure_ttl or '', '^-?%d+$') or '') or default_ttl
  forget_seen(job_key)
  redis.call('HSET', job_key, 'status', 'failed', 'ended_at', ended_at, 'emq_token', 'outbox',
    'emq_status', 'failed', 'emq_failure', reason)
  if ttl < 0 then
    redis.call('ZADD', failed_key, '+inf', job_id)
    redis.call('PERSIST', job_key)
  elseif ttl == 0 then
    -- RQ deletes a job with failure_ttl=0 once failed, after its failure callback ran: the
    -- hash stays until the outbox drain has run that callback, then goes
    redis.call('ZADD', failed_key, math.floor(now / 1000), job_id)
  else
    redis.call('ZADD', failed_key, math.floor(now / 1000) + ttl, job_id)
    redis.call('EXPIRE', job_key, ttl)
  end
  index_write('zset', 'ZADD', outbox_key, now, job_id)
end
