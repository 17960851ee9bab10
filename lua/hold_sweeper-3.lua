--[[ hold_sweeper: keep (or take, when free) the sweeper election of one set of queues,
keep its deputy, recruit a deputy from the line; or give both up.

One worker per queue set sweeps for the whole fleet. One other worker, the deputy, watches
the election (this script, every standby interval) and takes it once the sweeper's hold
lapsed; every other standby waits in the line (BLPOP on KEYS[3]) and costs nothing. The
election and the deputy are strings holding a token with an expiry; only the holder keeps
or gives them up: the check and the write are one step here.

The caller ends up:
- the sweeper, when the election is its token or free: it is kept for hold_ms; a deputy
  that became the sweeper drops its deputy key; and when the set has no deputy and the line
  is empty, one element is pushed onto the line: it wakes the one standby that waited
  longest (or waits there for the next standby), which then takes the deputy key (SET NX);
- the deputy (the election is another's and the deputy key is the caller's, or free): kept
  (or taken) for hold_ms;
- neither (another holds the deputy key): it goes (back) to the line.

KEYS:
  1 emq:sweeper:<queue set>           the election
  2 emq:sweeper:<queue set>:deputy    the deputy
  3 emq:sweeper:<queue set>:line      the line (a list)
ARGV:
  1 token of the caller
  2 hold_ms: keep the election or the deputy this long; 0 gives up whichever the caller holds
  3 '1': a sweeper without a deputy looks at the line (and calls a deputy when it is empty);
    '0' leaves the line alone (a lone sweeper whose call nobody took: it looks now and then)
Returns: 1 when the caller holds the election after the call (3 when, besides, it has no
deputy and a call waits in the line already: nobody waits there), 2 when it is the deputy,
else 0.
]]
local election, deputy, line = KEYS[1], KEYS[2], KEYS[3]
local token, hold_ms, look = ARGV[1], tonumber(ARGV[2]), ARGV[3]
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
  if not deputy_token and look == '1' then
    if redis.call('EXISTS', line) == 1 then
      return 3  -- a call waits in the line already: no standby is waiting for one
    end
    redis.call('LPUSH', line, token)
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
