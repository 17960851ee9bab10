"""The hold room: every lease of a process kept alive in one round trip per tick.

It owns one held job's lease as its holder sees it (``held``: the token, the local lease
clock, lost, settled or expired), the lock manager and its renewal loop (``lease``), RQ's
worker and execution heartbeats folded into that same round trip (``heartbeats``), and
the loop thread both run on (``background``). It imports the shared modules and the fence
room (a lease hands out the fence its writes go through).
"""
