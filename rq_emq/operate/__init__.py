"""The operate room: what operators run and read.

It owns the ``rq-emq`` command (``cli``, its writing commands in ``cli_write``, with
``cli_options``, ``cli_connect`` and ``cli_output``), the
read-only view of leases and stalls (``inspection``), and the metrics built on it
(``metrics``, ``prometheus``). It reads through the rooms below it (shared, fence, hold,
take, recover) and never imports the run room: a worker process does not load it.
"""
