"""The proof that a lent work connection comes back as it was lent.

A horse runs its job on the connection its worker lent it, and hands it back once the run
is over (:class:`rq_emq.connection.budget.WorkConnectionLender`). Whatever the job did to
that connection lives in Redis, on the server's side of it: the selected db, the
authenticated user, the protocol (``HELLO 3``), ``CLIENT TRACKING``, the client name,
``CLIENT REPLY``, subscriptions, an open ``MULTI`` or ``WATCH``. Stock RQ's horse takes its
connection with it as it exits, so none of that reaches the worker or a later job. Here
it would: a job's ``SELECT 1`` would leave the worker taking from db 1's queues.

So a connection comes back only when it is proven as lent. Once the job's code and its
callbacks have ended (RQ's ``handle_job_success``, ``handle_job_failure`` or
``handle_job_retry`` begins), every round trip the horse makes on the lent connection (its
finish, RQ's bookkeeping) carries ``CLIENT INFO`` at its end, in the same write: no round
trip of its own. (A round trip that leaves a ``WATCH`` of the finish's own pending carries
none: the ``EXEC`` that must follow does.) Its reply, read after the commands' own, shows
the state that round trip left. The last round trip on the connection before the
hand-back must carry one, and show:

- the db, user and protocol the worker's pool connects with (a server before Redis 7.0
  reports no protocol in ``CLIENT INFO``: there a ``HELLO`` with no argument, which
  switches nothing, rides after it and shows the protocol in its ``proto``);
- no flag but ``N`` (or ``U``, a Unix socket): no tracking, pubsub, ``MULTI``, monitor,
  read-only, no-evict or no-touch mode;
- no subscription (``sub``, ``psub``, ``ssub``), no ``MULTI`` (``multi=-1``);
- no watched key: ``watch=0`` where the server reports it (Redis 7.4+, Valkey 8+). Where
  it does not, a ``WATCH`` the job may have left is ended by the horse's own commands: an
  ``EXEC``, ``DISCARD``, ``UNWATCH`` or ``RESET`` among them (RQ's finish ends in
  ``EXEC``), else an ``UNWATCH`` put before the ``CLIENT INFO`` of a round trip sent while
  no ``WATCH`` of the horse's own is pending (so never inside RQ's optimistic
  transaction);
- a name the worker's connection may have: none, the worker's, or the pool's
  ``client_name``;
- and a reply at all, in order: ``CLIENT REPLY OFF`` or ``SKIP`` shows as a reply
  missing, which the horse's own finish meets first, as stock's horse would.

Anything else (a command the job sent after the last proof, an error reply, a server
without ``CLIENT INFO``, before Redis 6.2, a send it cannot read) leaves the connection
unproven: the horse closes it, and the worker opens a new one, set up by redis-py as its
pool's (one connect for that job, as stock's horse makes for every job).

A ``SimpleLeaseWorker`` runs its job on its own connections, as stock's ``SimpleWorker``
does: what the job leaves on them stays, as with stock (closing them would close
connections the worker shares with the rest of its process).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from typing import Any

from redis.exceptions import ResponseError

_CLIENT_INFO = b"*2\r\n$6\r\nCLIENT\r\n$4\r\nINFO\r\n"
_UNWATCH = b"*1\r\n$7\r\nUNWATCH\r\n"
_HELLO = b"*1\r\n$5\r\nHELLO\r\n"
#: Whether the server's ``CLIENT INFO`` shows the protocol (``resp``: Redis 7.0+, Valkey):
#: set by the worker at its start from the server's version (rq_emq.run.startup), read by
#: each proof (its horses inherit it); None, not known: the proof asks ``HELLO`` too
server_shows_protocol: bool | None = None
#: commands whose replies are not one per command, or that change how replies come: a
#: send with one is passed as it is, and leaves the connection unproven
_NOT_COUNTED = frozenset(
    {b"SUBSCRIBE", b"PSUBSCRIBE", b"SSUBSCRIBE", b"UNSUBSCRIBE", b"PUNSUBSCRIBE"}
    | {b"SUNSUBSCRIBE", b"MONITOR", b"CLIENT", b"HELLO", b"SYNC", b"PSYNC", b"QUIT"}
)
_UNWATCHES = frozenset({b"EXEC", b"DISCARD", b"UNWATCH", b"RESET"})
_FLAGS_AS_LENT = frozenset("NU")


def commands_sent(packed: bytes) -> list[bytes] | None:
    """The upper-cased names of the RESP commands packed in ``packed``, in order; None if
    it is not a run of whole RESP arrays of bulk strings (as redis-py packs them)."""
    names: list[bytes] = []
    pos, end = 0, len(packed)
    try:
        while pos < end:
            if packed[pos] != 0x2A:  # "*"
                return None
            eol = packed.index(b"\r\n", pos)
            count = int(packed[pos + 1 : eol])
            pos = eol + 2
            for i in range(count):
                if packed[pos] != 0x24:  # "$"
                    return None
                eol = packed.index(b"\r\n", pos)
                size = int(packed[pos + 1 : eol])
                if i == 0:
                    names.append(packed[eol + 2 : eol + 2 + size].upper())
                pos = eol + 2 + size + 2
            if count < 1 or pos > end:
                return None
    except (ValueError, IndexError):
        return None
    return names


def _packed(command: Any) -> bytes:
    if isinstance(command, str):
        return command.encode()
    if isinstance(command, (bytes, bytearray, memoryview)):
        return bytes(command)
    return b"".join(bytes(part) if not isinstance(part, str) else part.encode() for part in command)


def _name(arg: Any) -> bytes:
    if isinstance(arg, str):
        return arg.split(" ", 1)[0].upper().encode()
    if isinstance(arg, (bytes, bytearray, memoryview)):
        return bytes(arg).split(b" ", 1)[0].upper()
    return str(arg).upper().encode()


def hello_protocol(reply: Any) -> str:
    """The ``proto`` of a ``HELLO`` reply (a map in RESP3, a flat list in RESP2); ``""``
    when it has none."""
    if isinstance(reply, dict):
        found = reply.get(b"proto", reply.get("proto"))
    else:
        items = list(reply) if isinstance(reply, (list, tuple)) else []
        keys = [item.decode() if isinstance(item, bytes) else item for item in items[0::2]]
        found = items[2 * keys.index("proto") + 1] if "proto" in keys else None
    return "" if found is None else str(int(found))


def client_info_fields(reply: Any) -> dict[str, str]:
    text = reply.decode() if isinstance(reply, (bytes, bytearray)) else str(reply)
    fields: dict[str, str] = {}
    for item in text.split():
        key, _, value = item.partition("=")
        fields[key] = value
    return fields


class LentState:
    """What a connection must show to come back: the worker's pool's db, user, protocol,
    and the names its connection may have."""

    def __init__(self, connection: Any, names: Iterable[str]) -> None:
        """As ``connection`` (the one lent, a redis-py connection) connects: its db, user
        and protocol; ``names``, besides none and its own ``client_name``."""
        self.db = str(int(getattr(connection, "db", 0) or 0))
        self.user = str(getattr(connection, "username", None) or "default")
        self.resp = str(int(getattr(connection, "protocol", 2) or 2))
        self.names = {"", *(n for n in names if n)}
        if getattr(connection, "client_name", None):
            self.names.add(str(connection.client_name))
        #: the proof asks ``HELLO`` for the protocol (a server whose CLIENT INFO has none)
        self.asks_hello = server_shows_protocol is not True

    def shown_by(self, fields: dict[str, str], unwatched: bool) -> bool:
        return (
            fields.get("db") == self.db
            and fields.get("user") == self.user
            and fields.get("resp") == self.resp
            and fields.get("name", "") in self.names
            and bool(fields.get("flags"))
            and set(fields["flags"]) <= _FLAGS_AS_LENT
            and fields.get("sub") == "0"
            and fields.get("psub") == "0"
            and fields.get("ssub", "0") == "0"
            # no MULTI open: inside one this CLIENT INFO would have been queued, not
            # answered; Redis says -1, Valkey 9 says 0 after an EXEC
            and fields.get("multi") in ("-1", "0")
            and (fields["watch"] == "0" if "watch" in fields else unwatched)
        )


class StateProof:
    """In the horse, once the job's code has ended: each send on ``connection`` carries
    ``CLIENT INFO`` at its end, whose reply is read right after the send's own last
    reply. :attr:`proven` is True only while the last send's reply showed the state as
    lent."""

    def __init__(self, connection: Any, lent: LentState) -> None:
        self.connection = connection
        self.lent = lent
        self.proven = False
        self._unwatched = False  # the job may have left a WATCH: unknown until ended
        self._watching = False  # a WATCH of the finish's own, its transaction still to come
        self._owed = 0  # replies of the last send still to be read before ours
        self._send: Callable[..., Any] = connection.send_packed_command
        self._read: Callable[..., Any] = connection.read_response
        self._pack: Callable[..., Any] = connection.pack_commands
        self._pid = os.getpid()
        #: what the last pack_commands packed, and its command names (a pipeline's send,
        #: counted from its commands instead of parsed back from its bytes)
        self._packed: Any = None
        self._packed_names: list[bytes] = []
        connection.send_packed_command = self.send_packed_command
        connection.read_response = self.read_response
        connection.pack_commands = self.pack_commands

    def detach(self) -> None:
        """The connection's own methods again (a worker's connection, which goes on)."""
        for name in ("send_packed_command", "read_response", "pack_commands"):
            self.connection.__dict__.pop(name, None)

    def pack_commands(self, commands: Iterable[Any]) -> Any:
        commands = list(commands)
        packed = self._pack(commands)
        self._packed = packed
        self._packed_names = [_name(args[0]) if args else b"" for args in commands]
        return packed

    def send_packed_command(self, command: Any, check_health: bool = True) -> Any:
        self.proven = False
        if self._owed or os.getpid() != self._pid:
            # a send before the last one's replies were read: it proves nothing, and ours is
            # still read after the replies it follows (this send's come after it)
            return self._send(command, check_health)
        names: list[bytes] | None
        if command is self._packed and isinstance(command, list):
            names, parts = self._packed_names, list(command)
        else:
            packed = _packed(command)
            names, parts = commands_sent(packed), [packed]
        self._packed = None
        if not names or any(name in _NOT_COUNTED for name in names):
            return self._send(command, check_health)
        for name in names:
            if name == b"WATCH":
                self._unwatched, self._watching = False, True
            elif name in _UNWATCHES:
                self._unwatched, self._watching = True, False
        if self._watching:
            # a WATCH of the finish's own, its EXEC still to come: that round trip proves
            return self._send(command, check_health)
        appended = _CLIENT_INFO + (_HELLO if self.lent.asks_hello else b"")
        if not self._unwatched:
            appended = _UNWATCH + appended  # what the job may have watched, let go
            self._unwatched = True
        # in one write: the round trip the send makes anyway
        self._send([*parts, appended], check_health)
        self._unwatch_owed = appended.startswith(_UNWATCH)
        self._owed = len(names)
        return None

    def read_response(self, *args: Any, **kwargs: Any) -> Any:
        if not self._owed:
            return self._read(*args, **kwargs)
        try:
            reply = self._read(*args, **kwargs)
        except ResponseError:
            self._owed -= 1
            if not self._owed:
                self._read_ours()
            raise
        except BaseException:
            self._owed = 0  # the connection is broken or closed: nothing more comes on it
            raise
        self._owed -= 1
        if not self._owed:
            self._read_ours()
        return reply

    _unwatch_owed = False

    def _read_ours(self) -> None:
        try:
            if self._unwatch_owed:
                self._unwatch_owed = False
                self._read(disable_decoding=True)
            reply = self._read(disable_decoding=True)
            fields = client_info_fields(reply)
            if self.lent.asks_hello:
                fields["resp"] = hello_protocol(self._read(disable_decoding=True))
        except Exception:  # noqa: BLE001 - an error reply (a server before 6.2, a subscribed
            # RESP2 connection) or one it cannot read (a protocol the parser does not
            # speak): what follows on it is not known to be in step, so the connection
            # goes, unproven
            self.connection.disconnect()
            return
        self.proven = self.lent.shown_by(fields, self._unwatched)
