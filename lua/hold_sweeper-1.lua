--[[ hold_sweeper: take, keep or give up the sweeper election of one set of queues.

One worker per queue set sweeps for the whole fleet; the others stand by. The election is
a string holding the sweeper's token with an expiry, so a sweeper that dies or freezes
loses it within `hold_ms` and a standby (a plain `SET NX PX`) takes over. Only the holder
may keep or give it up: the check and the write are one step here.

KEYS:
  1 emq:sweeper:<queue set>
ARGV:
  1 token of the caller
  2 hold_ms: keep (or take, when free) the election this long; 0 gives it up if held
Returns: 1 when the caller holds the election after the call, else 0.
]]
local key, token, hold_ms = KEYS[1], ARGV[1], tonumber(ARGV[2])
if redis.call('GET', key) == token then
  if hold_ms == 0 then
    redis.call('DEL', key)
    return 0
  end
  -- SET rather than PEXPIRE: the ACL that runs rq-emq (README) allows no more commands
  redis.call('SET', key, token, 'PX', hold_ms)
  return 1
end
if hold_ms > 0 and redis.call('SET', key, token, 'NX', 'PX', hold_ms) then
  return 1
end
return 0
