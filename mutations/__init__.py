"""Hand-written mutation testing: break one guard at a time, and check that the tests
that claim to protect it fail.

:mod:`mutations.catalog` lists the mutations (file, exact text, replacement, the tests
that must kill it); :mod:`mutations.runner` applies each one in a scratch copy of the
repository and runs those tests there. ``python -m mutations --help`` for the command.
"""
