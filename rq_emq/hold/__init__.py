"""The hold room: every lease of a process kept alive in one round trip per tick.

It owns the lock manager and its renewal loop (``lease``), RQ's worker and execution
heartbeats folded into that same round trip (``heartbeats``), and the loop thread both
run on (``background``). It imports the shared modules and the fence room (a lease hands
out the fence its writes go through).
"""
