"""The run room: the worker classes, which compose the other rooms, and a run stopped
whole once its lease is gone.

It owns the worker classes and their composition (``worker``, the behaviour both kinds
share in ``lease_mixin``, ``compose``, ``spawn``, ``worker_check``, ``startup``, and
``logs``, the handler our lines go through under ``rq worker``), the
job's own view of its lease (``job_lease``: ``rq_emq.current_lease()``), RQ's dequeue
seam (``dequeue``: it joins a take with a burst worker's last sweep, so it sits with the
classes that compose rooms), and what ends a run past its lease: the horse's own fence
(``horse_fence``), the watchdog process (``watchdog``, run as a script by path beside
``horse_fence`` and ``process_tree``), and what ties them to the worker (``run_guard``,
``process_tree``). It may import every room but operate.
"""
