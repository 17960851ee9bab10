"""The recover room: stalled and crashed jobs found and put back exactly once.

It owns the two-phase sweep (``sweep``), the outbox of jobs failed at max attempts
(``outbox``), which worker of a fleet sweeps (``election``), what stock RQ's cleanup may
touch (``registries``, and ``rollback`` for handing leases back to RQ), and a horse that
died under a living worker (``horse_crash``). It imports the rooms below it: shared,
fence, hold (never take, run or operate).
"""
