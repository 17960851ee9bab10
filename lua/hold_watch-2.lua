--[[ hold_watch: take or keep the idle watch of one set of several queues.

One worker of the set, the watcher, is told of every write to the set's queues and wakes
the others (rq_emq/intake/watch.py). The watch is a string holding the watcher's token with
an expiry. A worker takes it when it is vacant: nobody holds it, and no token waits in the
wake list for a standby (the set's first worker; one whose wait ran out; the standby that
just took the token the set's sweeper pushed when the watch lapsed, or a stopping watcher
pushed as it gave the watch up). The watcher keeps it here every third of its hold: kept while it is its own, or
lapsed with no token waiting (nobody replaced it). Otherwise the caller was replaced (it
froze past its hold): it stops watching, so one watcher remains.

KEYS:
  1 emq:sweeper:<queue set>:watch   the watcher's token, with an expiry
  2 emq:sweeper:<queue set>:wake    the wake list (the token, while nobody watches)
ARGV:
  1 token of the caller
  2 hold_ms
Returns: 1 when the caller holds the watch after the call, else 0.
]]
local watch, wake = KEYS[1], KEYS[2]
local token, hold_ms = ARGV[1], tonumber(ARGV[2])
local holder = redis.call('GET', watch)
if holder == token or (not holder and redis.call('LLEN', wake) == 0) then
  redis.call('SET', watch, token, 'PX', hold_ms)
  return 1
end
return 0
