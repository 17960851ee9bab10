"""The watchdog's Redis client: one script call over a plain TCP or Unix socket, spoken in
RESP2 with the standard library alone.

A watchdog hands a dead worker's lease back once (:mod:`.seen_death`); importing redis-py
for that call costs its fresh interpreter 0.1 s of CPU and 20 MB on a quiet host, and on a
loaded one the import alone outlasted a short lease. This client sends ``AUTH`` and
``SELECT`` as the worker's settings ask and the script call in one write (one round trip),
and parses the replies that scripts give: integers, bulk and simple strings, arrays and
errors. Of redis-py's settings only the address, ``db``, the credentials and the timeouts
shape this one call (a client name or RESP3 would change nothing it reads); a TLS
connection keeps redis-py (:func:`.seen_death.recover`).
"""

from __future__ import annotations

import socket
import time
from typing import Any

#: How long the call may wait on Redis when the worker's settings name no timeout: the
#: watchdog must not hang on a Redis that never answers (the sweep recovers the job then).
DEFAULT_TIMEOUT_S = 30.0


class ReplyError(Exception):
    """An error reply from Redis (``-ERR ...``, ``-NOSCRIPT ...``)."""


def encode(*args: Any) -> bytes:
    """A command as RESP2's array of bulk strings."""
    out = [b"*%d\r\n" % len(args)]
    for arg in args:
        data = arg if isinstance(arg, bytes) else str(arg).encode()
        out += [b"$%d\r\n" % len(data), data, b"\r\n"]
    return b"".join(out)


def read_reply(stream: Any) -> Any:
    """One reply from a buffered binary stream; an error reply is returned as
    :class:`ReplyError` (raised by the caller, after the other replies of its write)."""
    line = stream.readline()
    if not line.endswith(b"\r\n"):
        raise ConnectionError("Redis closed the connection mid-reply")
    kind, body = line[:1], line[1:-2]
    if kind == b"+":
        return body
    if kind == b"-":
        return ReplyError(body.decode(errors="replace"))
    if kind == b":":
        return int(body)
    if kind == b"$":
        size = int(body)
        if size < 0:
            return None
        data = stream.read(size + 2)
        if len(data) != size + 2:
            raise ConnectionError("Redis closed the connection mid-reply")
        return data[:-2]
    if kind == b"*":
        count = int(body)
        return None if count < 0 else [read_reply(stream) for _ in range(count)]
    raise ConnectionError(f"not a RESP2 reply: {line[:40]!r}")


def call_script(
    settings: dict[str, Any],
    sha: str,
    source: str,
    keys: list[str],
    args: list[Any],
    timeout: float | None = None,
) -> Any:
    """``EVALSHA`` (``EVAL`` when the server lacks the script) on a connection of its own,
    closed before returning; the whole call, connect included, is bounded by ``timeout``
    (seconds) or the worker's own socket timeout, whichever is shorter. Raises
    :class:`ReplyError` or an ``OSError`` (``TimeoutError`` once that time is up)."""
    own = settings.get("socket_timeout") or DEFAULT_TIMEOUT_S
    end = time.monotonic() + (own if timeout is None else max(min(own, timeout), 0.001))

    def left() -> float:
        remaining = end - time.monotonic()
        if remaining <= 0:
            raise TimeoutError("no reply from Redis in time")
        return remaining

    connect_timeout = min(settings.get("socket_connect_timeout") or own, left())
    if settings.get("path"):
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(connect_timeout)
        sock.connect(settings["path"])
    else:
        host, port = settings.get("host") or "localhost", int(settings.get("port") or 6379)
        sock = socket.create_connection((host, port), timeout=connect_timeout)
    with sock, sock.makefile("rb") as stream:

        def read() -> Any:
            sock.settimeout(left())
            return read_reply(stream)

        preamble = []
        if settings.get("password") is not None:
            user = [settings["username"]] if settings.get("username") else []
            preamble.append(encode("AUTH", *user, settings["password"]))
        if int(settings.get("db") or 0):
            preamble.append(encode("SELECT", int(settings["db"])))
        sock.settimeout(left())
        sock.sendall(b"".join([*preamble, encode("EVALSHA", sha, len(keys), *keys, *args)]))
        for _ in preamble:
            reply = read()
            if isinstance(reply, ReplyError):
                raise reply
        reply = read()
        if isinstance(reply, ReplyError) and str(reply).startswith("NOSCRIPT"):
            sock.settimeout(left())
            sock.sendall(encode("EVAL", source, len(keys), *keys, *args))
            reply = read()
    if isinstance(reply, ReplyError):
        raise reply
    return reply
