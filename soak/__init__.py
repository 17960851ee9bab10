"""The chaos soak: real ``rq worker`` processes, a private redis-server with AOF, faults
injected while jobs flow, then invariant checks. Run ``python -m soak --help``."""
