--[[ claim_outbox: claim due entries of a queue's failure outbox for one drainer.

A job the sweep failed at max attempts still needs what Lua cannot do: RQ's Result and
the job's failure callback. The sweep leaves its id in the outbox; a drainer claims it
here with a fresh token (recorded as the job's owner, like a lease) for `claim_ms`, then
commits the Result and the outbox removal in one fenced step. A drainer that dies lets
its claim expire and another one takes the entry over; a slow one is fenced out.

KEYS:
  1  emq:{<q>}:outbox  (zset id -> ms when due)
ARGV:
  1  claim_ms
  2.. one fresh token per entry to claim at most
Returns: {id, token, id, token, ...} for the entries claimed.
]]
-- @include lib/lease.lua

local now = now_ms()
local wanted = #ARGV - 1
local ids = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', 0, wanted)
local claimed = {}
for i, job_id in ipairs(ids) do
  local job_key = 'rq:job:' .. job_id
  if redis.call('EXISTS', job_key) == 1 then
    local token = ARGV[1 + i]
    redis.call('HSET', job_key, 'emq_token', token)
    redis.call('ZADD', KEYS[1], now + tonumber(ARGV[1]), job_id)
    claimed[#claimed + 1] = job_id
    claimed[#claimed + 1] = token
  else
    redis.call('ZREM', KEYS[1], job_id)
  end
end
return claimed
