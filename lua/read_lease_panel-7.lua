--[[ read_lease_panel: everything the dashboard's lease panel shows for one queue, in one
bounded read (one script call: one round trip, one consistent moment). Changes nothing.

The work is bounded whatever the queue's size: counts are ZCARD/LLEN, the leases shown
are the first ARGV 1 by deadline (each one HMGET, one ZSCORE and one PTTL), the events
the newest ARGV 2, and the per-minute ring a fixed-size hash (lib/record.lua).

KEYS:
  1 emq:{<q>}:leases   2 emq:{<q>}:stalled   3 emq:{<q>}:stats   4 emq:{<q>}:events
  5 emq:{<q>}:minutes  6 emq:{<q>}:swept     7 rq:queue:<q> (RQ's, as the queue's class builds it)
ARGV:
  1 how many leases to show (earliest deadline first)   2 how many events to show (newest first)
  3 job key prefix (the job class's, `rq:job:`)        4 lease key prefix `emq:{<q>}:`
Returns: {now_ms, waiting, in_flight, stalled, stats, swept, events, minutes, leases}:
  stats and minutes as HGETALL gives them; swept the `swept` string or nil; events as
  XREVRANGE gives them; leases a list of {job id, deadline ms, marked at ms or nil, lock
  PTTL, then the job hash's LEASE_FIELDS (nil where absent)}.
]]

local LEASE_FIELDS = {'status', 'description', 'emq_worker', 'emq_attempts', 'emq_max_attempts',
  'emq_fence', 'emq_report', 'emq_progress_at', 'emq_granted_at', 'emq_no_progress', 'emq_lease_ms'}

local shown, events_shown, job_prefix, prefix = tonumber(ARGV[1]), tonumber(ARGV[2]), ARGV[3], ARGV[4]
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

local leases = {}
local first = redis.call('ZRANGE', KEYS[1], 0, shown - 1, 'WITHSCORES')
for i = 1, #first, 2 do
  local job_id = first[i]
  local entry = {job_id, first[i + 1], redis.call('ZSCORE', KEYS[2], job_id),
    redis.call('PTTL', prefix .. job_id .. ':lock')}
  local fields = redis.call('HMGET', job_prefix .. job_id, unpack(LEASE_FIELDS))
  for j = 1, #LEASE_FIELDS do entry[4 + j] = fields[j] end
  leases[#leases + 1] = entry
end

return {
  now,
  redis.call('LLEN', KEYS[7]),
  redis.call('ZCARD', KEYS[1]),
  redis.call('ZCARD', KEYS[2]),
  redis.call('HGETALL', KEYS[3]),
  redis.call('GET', KEYS[6]),
  redis.call('XREVRANGE', KEYS[4], '+', '-', 'COUNT', events_shown),
  redis.call('HGETALL', KEYS[5]),
  leases,
}
