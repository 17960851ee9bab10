--[[ hold_sweeper: keep (or take, when free) the sweeper election of one set of queues,
keep its deputy, recruit a deputy from the line; or give both up.

One worker per queue set sweeps for the whole fleet. One other worker, the deputy, watches
the election (this script, every standby interval) and takes it once the sweeper's hold
lapsed; every other standby waits for a call on the line's channel (RQ's pubsub connection,
which each worker holds anyway) and costs nothing. The
election and the deputy are strings holding a token with an expiry; only the holder keeps
or gives them up: the check and the write are one step here.

The caller ends up:
- the sweeper, when the election is its token or free: it is kept for hold_ms; a deputy
  that became the sweeper drops its deputy key; and when the set has no deputy and the line
  is empty, one element (the call) is pushed onto the line and announced on the channel
  named as the line: the standbys that hear it race to LPOP it, and the one that gets it
  takes the deputy key (SET NX). A call nobody took waits in the line, where a standby
  just come to the line looks first;
- the deputy (the election is another's and the deputy key is the caller's, or free): kept
  (or taken) for hold_ms;
- neither (another holds the deputy key): it goes (back) to the line.

KEYS:
  1 emq:sweeper:<queue set>           the election
  2 emq:sweeper:<queue set>:deputy    the deputy
  3 emq:sweeper:<queue set>:line      the line (a list holding the call; also the channel name)
  4 emq:sweeper:<queue set>:watch     the idle watcher of a set of several queues (hold_watch)
  5 emq:sweeper:<queue set>:wake      its wake list
ARGV:
  1 token of the caller
  2 hold_ms: keep the election or the deputy this long; 0 gives up whichever the caller holds
  3 '1': a sweeper without a deputy looks at the line (and calls a deputy when it is empty);
    '0' leaves the line alone (a lone sweeper whose call nobody took: it looks now and then)
  4 '1' for a set of several queues: a sweeper that finds no watcher and an empty wake list
    pushes a wake (a watcher that died is replaced by an idle standby within a renewal)
Returns: 1 when the caller holds the election after the call (3 when, besides, it has no
deputy and its call is still in the line: no standby took it), 2 when it is the deputy,
else 0.
]]
local election, deputy, line = KEYS[1], KEYS[2], KEYS[3]
local token, hold_ms, look, watched = ARGV[1], tonumber(ARGV[2]), ARGV[3], ARGV[4]
local held = redis.call('MGET', election, deputy)
local sweeper, deputy_token = held[1], held[2]
if hold_ms == 0 then
  if sweeper == token then
    redis.call('DEL', election)
  end
  if deputy_token == token then
    redis.call('DEL', deputy)
  end
  return 0
end
if sweeper == token or not sweeper then
  -- SET rather than PEXPIRE: the ACL that runs rq-emq (docs/operating.md) allows no more commands
  redis.call('SET', election, token, 'PX', hold_ms)
  if deputy_token == token then
    redis.call('DEL', deputy)  -- the deputy took over: the line gives the set a new one
    deputy_token = false
  end
  if watched == '1' and redis.call('EXISTS', KEYS[4]) == 0 and redis.call('LLEN', KEYS[5]) == 0 then
    redis.call('RPUSH', KEYS[5], token)
  end
  if not deputy_token and look == '1' then
    if redis.call('EXISTS', line) == 1 then
      return 3  -- a call waits in the line already (a standby come to the line looks there)  -- a call waits in the line already: no standby took it
    end
    redis.call('LPUSH', line, token)
    redis.call('PUBLISH', line, token)
  end
  return 1
end
-- the deputy keeps its key; a caller whose deputy key lapsed (its thread starved past the
-- hold on a loaded host), or a sweeper that woke to find the election another's, takes a
-- free deputy key: sending it to the line would leave the set without a watcher until a
-- line wait ends (lease multiples), should the sweeper die meanwhile
if deputy_token == token or not deputy_token then
  redis.call('SET', deputy, token, 'PX', hold_ms)
  return 2
end
return 0
