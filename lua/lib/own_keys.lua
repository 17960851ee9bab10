-- lib/own_keys.lua: writes to the keys only rq-emq writes (its counters, its record, its
-- indexes), made so that a malformed one never fails a script (issue 33, rule 4: bad data
-- never wedges a queue). Included (textually, by rq_emq/scripts.py, once per script) where
-- a script or a library says `-- @include lib/own_keys.lua`.
--
-- Redis cannot roll a script back: one that errors after a write leaves that write (a job
-- half taken: its lock and lease entry written, out of no queue list yet, and the worker
-- gone with the error). So a command on one of our keys goes through redis.pcall: Redis
-- refuses a command for its key's type or a field's value before it writes anything, so
-- catching the refusal costs no command on the normal path, and only a refused command
-- costs any more. What follows a refusal depends on what the key is for:
-- - telemetry (the stats hash's counters, the events stream, the minutes ring): the write
--   is skipped. Counters never cost a job; and a key something else wrote is left as it is
--   for the operator to look at: replacing it would erase what says who wrote there, and
--   two writers would go on undoing each other.
-- - an index (the leases, stalled and outbox zsets, the moving list): one of another type
--   holds no entry of ours (our scripts only ever write that type there), and without it
--   no job could be taken or recovered. It reads as empty, and the first write replaces it.
-- Either way the key is named in MALFORMED (key, what is wrong, ...), which the script
-- returns: the Python side logs each once per process (rq_emq/malformed.py).

local MALFORMED = {}

-- Note what is wrong with `key`, once per call.
local function malformed(key, what)
  for i = 1, #MALFORMED, 2 do
    if MALFORMED[i] == key and MALFORMED[i + 1] == what then return end
  end
  MALFORMED[#MALFORMED + 1] = key
  MALFORMED[#MALFORMED + 1] = what
end

-- Whether a redis.pcall reply is an error reply.
local function refused(reply)
  return type(reply) == 'table' and reply.err ~= nil
end

local function wrong_type(reply)
  return refused(reply) and string.find(reply.err, 'WRONGTYPE', 1, true) ~= nil
end

-- Add `n` to the counter `field` of the stats hash (or ring) `key`; skipped, and noted,
-- when the key is not a hash or the field holds no integer (or would overflow).
local function count(key, field, n)
  if n == 0 then return end
  local reply = redis.pcall('HINCRBY', key, field, n)
  if wrong_type(reply) then
    malformed(key, 'not a hash: its counters are not kept')
  elseif refused(reply) then
    malformed(key, 'field ' .. field .. ' is not a counter (' .. reply.err .. '): not counted')
  end
end

local function index_problem(kind)
  return 'not a ' .. kind .. ': an index of ours, read as empty and replaced by the next write'
end

-- Run a write `command` on an index of ours (`kind`: zset or list) at `key`. A key of
-- another type holds none of our entries: it is replaced (DEL) and the write run again.
-- Any other refusal is raised, as redis.call would.
local function index_write(kind, command, key, ...)
  local reply = redis.pcall(command, key, ...)
  if not refused(reply) then return reply end
  if not wrong_type(reply) then return error(reply) end
  redis.call('DEL', key)
  malformed(key, index_problem(kind))
  return redis.call(command, key, ...)
end

-- Run a read `command` on an index of ours at `key`; one of another type reads as `empty`
-- (and true second: it was unreadable), and is noted; nothing is written here.
local function index_read(kind, empty, command, key, ...)
  local reply = redis.pcall(command, key, ...)
  if wrong_type(reply) then
    malformed(key, index_problem(kind))
    return empty, true
  end
  if refused(reply) then return error(reply) end
  return reply, false
end
