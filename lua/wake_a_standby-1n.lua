--[[ wake_a_standby: the watcher of a queue set, busy with a job, heard a write to its
queues: when one of them holds a job, and no wake already waits, wake one idle standby.

The wake list's elements: 'w' (a job waits: look) and the watch token (the watch is free:
take it, rq_emq/intake/watch.py). A wake already waiting stands for this one too: the list
never grows past one wake, however many writes a busy watcher hears.

KEYS:
  1   emq:sweeper:<queue set>:wake   the wake list
  2.. rq:queue:<q>                    every queue list of the set (a write to one says only that
                                      something changed: the one it names may be empty now while
                                      another still holds jobs)
ARGV: none
Returns: 1 when a standby was woken, 2 when a wake waits already (every standby is busy),
0 when no queue holds a job.
]]
-- most calls come from the watcher's own take (Redis tells a tracking client of writes its
-- scripts make): the queues left empty, one EXISTS
if redis.call('EXISTS', unpack(KEYS, 2)) == 0 then
  return 0
end
if redis.call('LLEN', KEYS[1]) > 0 then
  return 2
end
redis.call('RPUSH', KEYS[1], 'w')
return 1
