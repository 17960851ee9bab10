"""The connection room: what every Redis connection of a worker goes through.

It owns riding out a short connection blip (``blips``) and Redis Sentinel: finding the
master the most recent sentinel names (``discovery``), the per-process watch that moves
every connection to a new master at once (``failover``), and the rules a take and an
outbox claim must pass before anything acts on them (``confirm``). It sits beside the
shared modules at the bottom of the layer order and imports nothing else of the package:
the fence, hold, take, recover and run rooms all reach Redis through it.
"""
