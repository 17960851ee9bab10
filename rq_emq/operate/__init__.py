"""The operate room: what operators run and read.

It owns the ``rq-emq`` command (``cli``, its writing commands in ``cli_write``, with
``cli_options``, ``cli_connect``, ``cli_output``, ``cli_dashboard`` and the signal
handling of its loops in ``stop_signals``), the read-only views of leases and stalls
(``inspection`` per queue, ``lease_list`` per job, ``reports`` for what jobs told their
leases), the metrics built on them (``metrics``, ``prometheus``) and the lease panel for
rq-dashboard (``panel``, ``dashboard/``). It imports only the shared modules and the
recover room below it, and never the run room: a worker process does not load it.
"""
