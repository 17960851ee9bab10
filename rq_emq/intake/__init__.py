"""The take room (``intake``, not ``take``: docs/architecture.md says why): a job moves
off its queue into a lease with no moment in which a crash loses it.

It owns the atomic pop-and-lease and the claim of a job a blocking wait moved
(``take``), and the idle wait itself (``wake``). It imports the shared modules and the
hold room (a take mints the lease token).
"""
