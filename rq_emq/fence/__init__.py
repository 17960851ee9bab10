"""The fence room: a write to a leased job goes through only while its lease holds.

It owns the token check every write makes (``fencing``: RQ's start under
``guard_job_write``, its outcome and the release in one ``finish_job``), how a job's
fields are packed for those scripts (``packing``), the worker's job writes routed through
them (``job_writes``) and RQ's direct job writes caught on their way (``direct_writes``).
It imports only the shared modules; the hold room above hands out its fences.
"""
