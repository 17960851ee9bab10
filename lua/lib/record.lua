-- lib/record.lua: the bounded record of what happened to a queue's leases, for readers
-- (the dashboard's recent events and its per-minute chart). Written by the script that
-- makes the event happen, in the same atomic step; never read back by any script.
-- Included (textually, by rq_emq/scripts.py) where a script says `-- @include lib/record.lua`.
--
-- `emq:{q}:events`: a stream capped near EVENTS_KEPT entries (XADD MAXLEN ~: trimming
--   whole macro nodes, so it holds at most about a hundred more), one entry per event:
--   kind, job, worker (the holder whose lease it was), reason; its id is the Redis time.
-- `emq:{q}:minutes`: a hash of RING_MINUTES slots, one per minute of the last hour:
--   `at:<slot>` the minute (Redis ms / 60000) the slot counts, and `<kind>:<slot>` the
--   events of each RING_KINDS kind in it. A slot of an older minute is reset on its next
--   use, so the hash never holds more than RING_MINUTES * (1 + #RING_KINDS) fields.
-- Both are telemetry: either of another type, or a ring field that is not a count, is
-- skipped and named in the script's reply (lib/own_keys.lua), never the job's loss.
-- @include lib/own_keys.lua

local EVENTS_KEPT = 1000
local RING_MINUTES = 60
local RING_KINDS = {'marked', 'recovered', 'failed', 'crashed'}

-- The queue's lease key prefix (`emq:{<q>}:`) from its leases key (`emq:{<q>}:leases`).
local function queue_prefix(leases_key)
  return string.sub(leases_key, 1, #leases_key - #'leases')
end

-- The holder's name that a lease token carries after its random part (`<hex>:<worker>`).
local function token_worker(token)
  return string.match(token or '', '^[^:]*:(.*)$') or ''
end

-- Append one event; `counts` (kind -> n) gathers what record_minute adds to the ring.
local function record_event(prefix, counts, kind, job_id, worker, reason)
  local added = redis.pcall('XADD', prefix .. 'events', 'MAXLEN', '~', EVENTS_KEPT, '*',
    'kind', kind, 'job', job_id, 'worker', worker or '', 'reason', reason or '')
  if refused(added) then
    malformed(prefix .. 'events', 'not a stream this can add to (' .. added.err .. '): events not recorded')
  end
  counts[kind] = (counts[kind] or 0) + 1
end

-- Add the gathered counts to this minute's slot of the ring (Redis ms `now`).
local function record_minute(prefix, counts, now)
  local any = false
  for _, kind in ipairs(RING_KINDS) do
    if (counts[kind] or 0) > 0 then any = true end
  end
  if not any then return end
  local ring = prefix .. 'minutes'
  local minute = math.floor(now / 60000)
  local slot = minute % RING_MINUTES
  local at = redis.pcall('HGET', ring, 'at:' .. slot)
  if refused(at) then return malformed(ring, 'not a hash: the per-minute counts are not kept') end
  if at ~= tostring(minute) then
    local fresh = {'at:' .. slot, tostring(minute)}
    for _, kind in ipairs(RING_KINDS) do
      fresh[#fresh + 1] = kind .. ':' .. slot
      fresh[#fresh + 1] = '0'
    end
    redis.call('HSET', ring, unpack(fresh))
  end
  for _, kind in ipairs(RING_KINDS) do
    count(ring, kind .. ':' .. slot, counts[kind] or 0)
  end
end
