--[[ claim_job: lease a job that a blocking BLMOVE just moved to the queue's intermediate list.

A crash between the BLMOVE and this script leaves the job in the intermediate list with
no lock, where the sweep finds it; nothing is lost.

KEYS:
  1  <queue prefix><q>:intermediate   (`rq:queue:<q>:intermediate`; the queue class's prefix)
  2  <job prefix><id>                  (`rq:job:<id>`; the job class's prefix)
  3  emq:{<q>}:<id>:lock
  4  emq:{<q>}:leases
  5  emq:{<q>}:stats
ARGV:
  1 job id  2 token  3 worker name  4 lease_ms
Returns:
  {-1}  the job is no longer in the intermediate list (someone else handled it)
  {0}   the job hash no longer exists (the id is dropped, as RQ does)
  {1, attempts, field, value, ...}  leased; the job's hash as HGETALL gives it
]]
-- @include lib/lease.lua

local job_id = ARGV[1]
-- the intermediate list is short (a job stays there between BLMOVE and this call), so LPOS
-- is cheap; the lease is written before the job leaves the list, so a failing write loses nothing
if redis.call('LPOS', KEYS[1], job_id) == false then return {-1} end
local hash = redis.call('HGETALL', KEYS[2])
if #hash == 0 then
  redis.call('LREM', KEYS[1], 1, job_id)
  return {0}
end
local attempts = grant_lease(KEYS[2], KEYS[3], KEYS[4], KEYS[5], job_id, ARGV[2], ARGV[3],
  tonumber(ARGV[4]), hash)
redis.call('LREM', KEYS[1], 1, job_id)
local reply = {1, attempts}
for k = 1, #hash do reply[2 + k] = hash[k] end
return reply
