--[[ finish_job: write a worker's outcome for a job only while it holds the lease, and
release the lease in the same atomic step (the fence).

The outcome is whatever RQ's own finish code queued in its transaction (status, result,
registries, retry, dependents): rq_emq packs those commands here unchanged, so RQ keeps
its semantics and a worker that lost its lease writes nothing at all.

KEYS:
  1  <job prefix><id>   (`rq:job:<id>`; the job class's prefix)
  2  emq:{<q>}:<id>:lock
  3  emq:{<q>}:leases
  4  emq:{<q>}:stalled
  5  emq:{<q>}:stats
  6  <queue prefix><q>  (`rq:queue:<q>`: where RQ would have pushed the job again)
ARGV:
  1  job id
  2  token
  3  RQ's key prefix (`rq:`), for the registries RQ puts an ended job in
  4  the counter in emq:{<q>}:stats this outcome counts in (`finished` for a lease
     holder's outcome, `outbox_completed`, `unreadable`)
  5  number of commands; then per command: its argument count, then the arguments
Returns (each reply ends with `malformed`: our keys found malformed and skipped or
replaced, {key, what, ...}, lib/own_keys.lua):
  {0}               fenced out: the lease is not ours, nothing was written (the refusal
                    goes to the queue's record, lib/record.lua) but for the lock, released
                    if it still holds this token: the run is over (lib/lease.lua
                    `check_holder`)
  {1, replies}      replies[i] is the i-th command's reply (an error reply in place)
  {2, status}       RQ or an operator changed the job since the lease's last write and
                    put it where that status says (canceled, failed or requeued by stock
                    cleanup, run by a stock worker, ...; lib/lease.lua `placed_by_rq`; a
                    stale whole-hash save puts it nowhere: the outcome is written): nothing
                    was written, the job is left as RQ put it, and the lease
                    is released (the worker then records a canceled job's run in its
                    Result only: rq_emq/job_writes.py)
]]
-- @include lib/lease.lua
-- @include lib/record.lua

local job_id, token = ARGV[1], ARGV[2]
local state, lease_ms = check_holder(KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], job_id, token, KEYS[6], ARGV[3],
  true)
if state == 'lost' then
  -- a late outcome of a replaced holder: refused, and kept in the record (a finish whose
  -- job is gone, or another's, is rare: the holder stops on its lost renewal first); a
  -- second outbox drainer's refusal is no holder's
  if ARGV[4] ~= 'outbox_completed' then
    record_event(queue_prefix(KEYS[3]), {}, 'refused', job_id, token_worker(token),
      'outcome refused: the lease was no longer its own')
  end
  return {0, MALFORMED}
end
if state == 'ended' then return {2, redis.call('HGET', KEYS[1], 'status') or '', MALFORMED} end
local replies = run_packed(6, tonumber(ARGV[5]))
-- the lease goes: lock, index entry, stall mark
redis.call('DEL', KEYS[2])
index_write('zset', 'ZREM', KEYS[3], job_id)
index_write('zset', 'ZREM', KEYS[4], job_id)
-- Attempts (and their crash history) count consecutive takes that did not end normally;
-- this one did. The take wrote both fields with the token, so finding neither means RQ's
-- commands deleted the job (result_ttl=0): then no hash is re-created, and the lock key
-- keeps `done:<token>` for one lease instead: a renewal that raced this finish reads the
-- holder's own finish there, where a job that vanished any other way (a delete, a Redis
-- that lost its data) leaves nothing, and is lost. Else the owner becomes `done:<token>`,
-- so the holder's next renewal learns the job ended normally. A failure the outbox
-- completes keeps its crash history to read.
local ended = lease_only_fields('emq_attempts', 'emq_started')
if ARGV[4] ~= 'outbox_completed' then ended[#ended + 1] = 'emq_crashes' end
if redis.call('HDEL', KEYS[1], unpack(ended)) > 0 then
  redis.call('HSET', KEYS[1], 'emq_token', 'done:' .. token)
else
  redis.call('SET', KEYS[2], 'done:' .. token, 'PX', lease_ms or 60000)
end
count(KEYS[5], ARGV[4], 1)
return {1, replies, MALFORMED}
