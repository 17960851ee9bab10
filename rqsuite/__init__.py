"""RQ's own test suite, run against rq-emq's workers: ``python -m rqsuite``.

The installed rq's sdist (its tests ship only there) is downloaded once into a cache,
its tests run twice against private redis-servers: stock, as the baseline (cached per RQ
version), and with ``rq.Worker``/``rq.SimpleWorker``/``rq.SpawnWorker`` swapped for ours.
A test that passes stock and fails ours is a failure unless ``allowlist.txt`` names it.
See docs/testing.md.

Modules: ``sdist`` (fetch and extract), ``suite`` (servers, pytest runs), ``verdict``
(allowlist and comparison), ``__main__`` (the command line); ``hook/`` is what every
process of a run loads (redirect to the private Redis, the worker swap, the report).
"""
