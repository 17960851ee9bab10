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
  5.. pairs: job id, token
Returns: {lost, settled}: ids whose lease is lost (the job was taken from this holder, or
deleted while it ran), and ids whose job this holder already finished (a tick raced the
finish; a finish that deleted the job hash, as `result_ttl=0` does, counts too: the
finish also removed the index entry, which a deletion during the run leaves).
]]
-- @include lib/lease.lua

local lease_ms, prefix, heartbeat, job_prefix = tonumber(ARGV[1]), ARGV[2], ARGV[3], ARGV[4]
local deadline = now_ms() + lease_ms
local lost = {}
local settled = {}
local renewed = 0
for i = 5, #ARGV, 2 do
  local job_id, token = ARGV[i], ARGV[i + 1]
  local job_key = job_prefix .. job_id
  local owner = redis.call('HGET', job_key, 'emq_token')
  local indexed = redis.call('ZSCORE', KEYS[1], job_id)
  if owner == token and indexed then
    redis.call('SET', prefix .. job_id .. ':lock', token, 'PX', lease_ms)
    redis.call('ZADD', KEYS[1], deadline, job_id)
    redis.call('ZREM', KEYS[2], job_id)
    if heartbeat ~= '' then redis.call('HSET', job_key, 'last_heartbeat', heartbeat) end
    renewed = renewed + 1
  elseif owner == 'done:' .. token or (not owner and not indexed and redis.call('EXISTS', job_key) == 0) then
    settled[#settled + 1] = job_id
  else
    lost[#lost + 1] = job_id
  end
end
if renewed > 0 then redis.call('HINCRBY', KEYS[3], 'renewed', renewed) end
if #lost > 0 then redis.call('HINCRBY', KEYS[3], 'lease_lost', #lost) end
return {lost, settled}
