"""How one RQ transaction rides in one script call: its commands packed as the fenced
scripts read them (a variadic command too long for Lua's ``unpack`` split into several),
their replies merged back into one per queued command, a transaction that only reads
recognised, and the run's start status folded into RQ's own ``HSET`` of the job.

Nothing here talks to Redis: :mod:`rq_emq.fence.fencing` decides what is fenced and sends it.
"""

from __future__ import annotations

from functools import cache
from typing import Any, Protocol

from redis.exceptions import ResponseError

from .. import compat
from ..keys import PINNED_FIELD


class StartRecord(Protocol):
    """What :func:`start_record` reads of a fence (:class:`rq_emq.fence.fencing.Fence` has it)."""

    @property
    def records_status(self) -> bool: ...
    @property
    def max_attempts(self) -> str: ...
    @property
    def started_entry(self) -> str: ...
    @property
    def keys(self) -> list[str]: ...


# Commands that only read: a transaction of nothing else is not an outcome. Anything not
# listed counts as a write, so an unknown command is fenced rather than let through.
READ_ONLY = frozenset(
    """GET MGET STRLEN GETRANGE EXISTS TYPE TTL PTTL HGET HGETALL HMGET HEXISTS HLEN HKEYS HVALS
    HSTRLEN SMEMBERS SISMEMBER SMISMEMBER SCARD ZSCORE ZMSCORE ZRANGE ZRANGEBYSCORE ZREVRANGE
    ZREVRANGEBYSCORE ZCARD ZCOUNT ZRANK ZREVRANK LRANGE LLEN LINDEX LPOS XRANGE XREVRANGE XLEN
    SCAN HSCAN SSCAN ZSCAN PING TIME DBSIZE""".split()
)

# A packed command's arguments reach redis.call through Lua's unpack, which fails past
# about 8000 values (after the commands before it ran: a half-run outcome). Longer
# variadic commands are sent as several of at most this many arguments each.
MAX_PACKED_ARGS = 1000

# Variadic commands that split into several of the same: words before the repeated part
# (the name included), the size of one repeated item, and how the replies combine.
_SPLITTABLE: dict[str, tuple[int, int, str]] = {
    "DEL": (1, 1, "sum"),
    "UNLINK": (1, 1, "sum"),
    "SADD": (2, 1, "sum"),
    "SREM": (2, 1, "sum"),
    "ZREM": (2, 1, "sum"),
    "HDEL": (2, 1, "sum"),
    "HSET": (2, 2, "sum"),
    "LPUSH": (2, 1, "last"),
    "RPUSH": (2, 1, "last"),
    "ZADD": (2, 2, "sum"),
}
_ZADD_FLAGS = frozenset({"NX", "XX", "GT", "LT", "CH"})


def reads_only(commands: list[Any]) -> bool:
    return all(command_name(args) in READ_ONLY for args, _ in commands)


#: Commands on the job hash that leave its ``status`` field as it was.
_KEEP_FIELDS = frozenset(
    {"PERSIST", "EXPIRE", "PEXPIRE", "EXPIREAT", "PEXPIREAT", "HGET", "HMGET", "HGETALL"}
)


#: The job's fields whose values the lease records as its own after each of its writes
#: (lua/lib/lease.lua SEEN), each with the field that records it.
SEEN_FIELDS = {"status": "emq_status", "enqueued_at": "emq_enqueued_at", "started_at": "emq_started_at"}


def start_record(
    fence: StartRecord, commands: list[Any], pieces: list[tuple[list[list[Any]], str]]
) -> list[str]:
    """``guard_job_write``'s max attempts and record arguments: what it records on the job
    hash with RQ's commands. When one HSET of RQ's writes every seen field the commands
    change (RQ's start writes status and started_at), their values (and the job's own max
    attempts, and the run's pinned started entry) ride in that very HSET, which changes the
    job hash in the same way as the script's own write after it would, one command fewer;
    else the script reads them back (and the pin is found through RQ's execution records)."""
    if not fence.records_status:
        return [fence.max_attempts, "0"]
    written, at = _seen_written(fence.keys[0], commands)
    if written == {}:
        return [fence.max_attempts, "0"]  # RQ 2's PERSIST of the job alone, say: no read-back
    if written is None or at is None or pieces[at][1] != "one":
        return [fence.max_attempts, "1"]
    extra = [word for field, value in written.items() for word in (SEEN_FIELDS[field], value)]
    if fence.max_attempts:
        extra += ["emq_max_attempts", fence.max_attempts]
    if fence.started_entry:
        extra += [PINNED_FIELD, fence.started_entry]
    pieces[at][0][0].extend(extra)
    return ["", "0"]


def _seen_written(key: str, commands: list[Any]) -> tuple[dict[str, str] | None, int | None]:
    """The seen fields ``commands`` write on the job hash ``key`` and the index of the one
    HSET that writes them all, status among them, when nothing but plain HSETs (and expiry
    changes, reads) touch the hash; ({}, None) when they write none of the seen fields;
    else (None, None): the script reads them back, the only sure answer then."""
    keys = (key, key.encode())  # a pickled job's data need not decode: compare as sent
    written: dict[str, str] = {}
    at: int | None = None
    for index, (args, _) in enumerate(commands):
        if not any(word in keys for word in args[1:] if isinstance(word, (str, bytes))):
            continue
        name = command_name(args)
        if name in _KEEP_FIELDS and args[1] in keys:
            continue
        if name != "HSET" or args[1] not in keys or len(args) % 2:
            return None, None
        for field, value in zip(args[2::2], args[3::2], strict=True):
            name_ = _sent(field)
            if name_ in SEEN_FIELDS:
                sent = _sent(value)
                if sent is None or (at is not None and at != index):
                    return None, None
                written[name_], at = sent, index
    if not written:
        return {}, None  # nothing the lease records changed: its record stands
    return (written, at) if "status" in written else (None, None)


def _sent(value: Any) -> str | None:
    """A command argument as redis-py sends it (RQ's statuses are str enums: their text
    is the value, not what ``str()`` of the member says); None for other types."""
    if isinstance(value, bytes):
        return value.decode()
    if isinstance(value, str):
        return value.encode().decode()
    return None


def text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def split(args: tuple[Any, ...]) -> tuple[list[list[Any]], str]:
    """One queued command as the packed commands that carry it, and how their replies
    combine ("one": a single command)."""
    words = _split_name(args)
    name = text(words[0]).upper()
    rule = _SPLITTABLE.get(name)
    if rule is None or len(words) <= MAX_PACKED_ARGS:
        return [words], "one"
    head_len, item, combine = rule
    if name == "ZADD":
        while head_len < len(words) and text(words[head_len]).upper() in _ZADD_FLAGS:
            head_len += 1
    head, body = words[:head_len], words[head_len:]
    step = max(item, (MAX_PACKED_ARGS - head_len) // item * item)
    return [[*head, *body[i : i + step]] for i in range(0, len(body), step)], combine


def merge_replies(pieces: list[tuple[list[list[Any]], str]], replies: list[Any]) -> list[Any]:
    merged: list[Any] = []
    at = 0
    for parts, combine in pieces:
        mine = replies[at : at + len(parts)]
        at += len(parts)
        errors = [reply for reply in mine if isinstance(reply, ResponseError)]
        if combine == "one":
            merged.append(mine[0])
        elif errors:
            merged.append(errors[0])
        elif combine == "sum":
            merged.append(sum(int(reply) for reply in mine))
        else:
            merged.append(mine[-1])
    return merged


#: Command names already read, by first argument and word count: a worker sends a handful
#: of commands, and a fenced job's commands are named some 70 times (bounded all the same).
_NAMES: dict[tuple[Any, int], str] = {}
_NAMES_KEPT = 1024


def command_name(args: tuple[Any, ...], words: int = 1) -> str:
    first = args[0]
    try:
        return _NAMES[first, words]
    except KeyError:
        pass
    except TypeError:  # an unhashable first argument (a memoryview): named, not kept
        return _name_of(first, words)
    name = _name_of(first, words)
    if len(_NAMES) < _NAMES_KEPT:
        _NAMES[first, words] = name
    return name


def _name_of(first: Any, words: int) -> str:
    text = first.decode() if isinstance(first, bytes) else str(first)
    return " ".join(text.upper().split()[:words])


@cache
def resp2_callbacks() -> dict[str, Any]:
    return {name.upper(): callback for name, callback in compat.resp2_callbacks().items()}


def _split_name(args: tuple[Any, ...]) -> list[Any]:
    # redis-py lets a command name carry literal words ("CONFIG GET"); Lua wants them apart.
    first = args[0]
    words: list[Any] = first.split() if isinstance(first, str) else [first]
    return [*words, *args[1:]]


def pack(pieces: list[tuple[list[list[Any]], str]]) -> list[Any]:
    """The packed commands' part of a fenced script's arguments: their count, then each
    as its number of words followed by the words."""
    packed: list[Any] = [sum(len(parts) for parts, _ in pieces)]
    for parts, _ in pieces:
        for words in parts:
            packed.append(len(words))
            packed.extend(words)
    return packed
