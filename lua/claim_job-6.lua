--[[ claim_job: lease a job that a blocking BLMOVE just moved to the queue's moving list.

A crash between the BLMOVE and this script leaves the job in the moving list with
no lock, where the sweep finds it; nothing is lost. The script is atomic: no moment
exists in which the job is out of the list without its lease.

KEYS:
  1  emq:{<q>}:moving                 (ours: never RQ's intermediate list, see rq_emq/wake.py)
  2  <job prefix><id>                  (`rq:job:<id>`; the job class's prefix)
  3  emq:{<q>}:<id>:lock
  4  emq:{<q>}:leases
  5  emq:{<q>}:stats
  6  <queue prefix><q>                 (`rq:queue:<q>`: where a job held back goes again)
ARGV:
  1 job id  2 token  3 worker name  4 lease_ms  5 RQ's key prefix (`rq:`), for its registries
Returns:
  {-1}  the job is no longer in the moving list (someone else handled it)
  {0}   the job hash no longer exists (the id is dropped, as RQ does)
  {-2}  the entry was a stray copy (lib/lease.lua `take_verdict`: the job runs under a live
        lease, or RQ has it elsewhere): dropped
  {-3, busy_ms}  an earlier run of this job id still holds its lock (`take_verdict`): the
        job went back to the head of its queue, where the BLMOVE took it; that lock lapses
        within busy_ms (its holder releases it as its run ends)
  {1, attempts, malformed, field, value, ...}  leased; the job's hash as HGETALL gives it;
        `malformed` names our keys found malformed ({key, what, ...}: lib/own_keys.lua)
]]
-- @include lib/lease.lua

local job_id = ARGV[1]
-- read first: a hash of the wrong type fails the script here, before any write
local hash = redis.call('HGETALL', KEYS[2])
-- the moving list is short (a job stays there between BLMOVE and this call), so
-- LREM is cheap, and its count says whether the job was still there (no LPOS first).
-- Taking it out before the lease is written loses nothing: once a script has written,
-- Redis refuses none of its later writes for memory (it cannot stop it halfway), and
-- those touch only our own keys and the hash read above.
if redis.call('LREM', KEYS[1], 1, job_id) == 0 then return {-1} end
if #hash == 0 then return {0} end
local verdict, left = take_verdict(hash, KEYS[3], KEYS[2], job_id, ARGV[5])
-- a stray copy of a job another lease runs, or of one RQ has elsewhere: dropped
if verdict == 'stray' then return {-2} end
-- no second run while an earlier one holds the job id: back where it was
if verdict == 'busy' then
  redis.call('LPUSH', KEYS[6], job_id)
  return {-3, left}
end
local attempts = grant_lease(KEYS[2], KEYS[3], KEYS[4], KEYS[5], job_id, ARGV[2], ARGV[3],
  tonumber(ARGV[4]), hash)
local reply = {1, attempts, MALFORMED}
for k = 1, #hash do reply[3 + k] = hash[k] end
return reply
