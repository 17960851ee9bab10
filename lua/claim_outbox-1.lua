--[[ claim_outbox: claim due entries of a queue's failure outbox for one drainer.

A job the sweep failed at max attempts still needs what Lua cannot do: RQ's Result and
the job's failure callback. The sweep leaves its id in the outbox and `outbox` as its
owner; a drainer claims it here with a fresh token (recorded as the job's owner, like a
lease), then runs the callback and commits the Result and the outbox removal in one
fenced step. A drainer that dies lets its claim expire and another one takes the entry
over; a slow one is fenced out. The claim lasts at least the job's failure callback
timeout plus `margin_ms`, so a callback still running is never started a second time.

Only a job still failed by that stall is claimed: status `failed` and owned by the
outbox (`outbox`, or an expired claim `outbox:<token>`). A job requeued since (by an
operator, `rq requeue`, ...) and perhaps leased again, or deleted, loses its entry.

KEYS:
  1  emq:{<q>}:outbox  (zset id -> ms when due)
ARGV:
  1  claim_ms: shortest claim
  2  margin_ms: added to the job's failure callback timeout
  3  default callback timeout (seconds), for a job hash that names none
  4  job key prefix (`rq:job:`)
  5.. one fresh token per entry to claim at most (`outbox:<random>`)
Returns: {id, token, id, token, ...} for the entries claimed.
]]
-- @include lib/lease.lua

local claim_ms, margin_ms, default_timeout = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local now = now_ms()
local wanted = #ARGV - 4
local ids = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', 0, wanted)
local claimed = {}
for i, job_id in ipairs(ids) do
  local job_key = ARGV[4] .. job_id
  local found = redis.call('HMGET', job_key, 'emq_token', 'status', 'failure_callback_timeout')
  local owner = found[1]
  if found[2] == 'failed' and owner and (owner == 'outbox' or owner:sub(1, 7) == 'outbox:') then
    local token = ARGV[4 + i]
    local timeout_s = count_value(found[3]) or default_timeout
    redis.call('HSET', job_key, 'emq_token', token)
    redis.call('ZADD', KEYS[1], now + math.max(claim_ms, timeout_s * 1000 + margin_ms), job_id)
    claimed[#claimed + 1] = job_id
    claimed[#claimed + 1] = token
  else
    redis.call('ZREM', KEYS[1], job_id)
  end
end
return claimed
