--[[ keep_leased_started: split RQ's due started-registry entries by whether their job holds a lease.

Stock cleanup fails (or retries through `Retry`) every entry of `rq:wip:<q>` whose score
fell due, then removes the whole due range. An entry whose job holds a lease belongs to
the sweep, which recovers it exactly once: this script moves such an entry's score to
`keep_until`, so that the stock cleanup which follows neither handles nor removes it, and
returns the other due entries (jobs taken without a lease, by stock workers) for RQ.

A job holds a lease while it is in the lease index: from the take to the finish, the
recovery or the hand-back, including while a sweep has marked it stalled (a mark keeps
the index entry). Its lock alive is the same fact seen from the holder's side, and counts
too. Entries are `<job_id>:<execution_id>` (RQ 2.0+); a bare id is read as a job id.

KEYS:
  1 rq:wip:<q>
  2 emq:{<q>}:leases
ARGV:
  1 cutoff: entries scored in [0, cutoff] are due (seconds, RQ's scores)
  2 keep_until: the score a kept entry gets
  3 lease key prefix `emq:{<q>}:`
  4 offset, 5 batch: the window of due entries this call looks at (bounded work)
Returns: {scanned, member, ...}: how many due entries were looked at, then the members
(as stored) of those left to RQ.
]]

local started_key, leases_key = KEYS[1], KEYS[2]
local cutoff, keep_until, prefix = ARGV[1], ARGV[2], ARGV[3]
local offset, batch = tonumber(ARGV[4]), tonumber(ARGV[5])

local due = redis.call('ZRANGEBYSCORE', started_key, 0, cutoff, 'LIMIT', offset, batch)
local reply = {#due}
for _, member in ipairs(due) do
  local job_id = string.match(member, '^[^:]*')
  if redis.call('ZSCORE', leases_key, job_id) or redis.call('EXISTS', prefix .. job_id .. ':lock') == 1 then
    redis.call('ZADD', started_key, 'XX', keep_until, member)
  else
    reply[#reply + 1] = member
  end
end
return reply
