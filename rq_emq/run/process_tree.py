"""Ending a run whole: a process, its process group and every descendant, found in ``/proc``.

A job's own processes (``subprocess.run``, a shell pipeline, ffmpeg) are part of its run:
a stop that ends only the horse's pid leaves them working on while the job runs again
elsewhere. RQ puts each horse in a process group of its own, which ``killpg`` ends; a
child that starts its own session or group (``start_new_session=True``, ``setsid``) is
not in it, so the descendants are found by their parent links in ``/proc`` too.

The tree is frozen before it is killed: every process found is SIGSTOPped, and the walk
repeats until it finds no new one, so nothing forks out of reach between the walk and
the kill (a stopped process cannot fork). A horse is a *child subreaper*
(:func:`become_subreaper`): a process whose parent exits (a daemonizing double fork) is
re-parented to the horse, not to init, so it stays in the tree while the horse lives.
"""

from __future__ import annotations

import ctypes
import functools
import os
import signal
from collections.abc import Callable, Iterable
from typing import Any

_PR_SET_CHILD_SUBREAPER = 36


@functools.cache
def libc() -> Any:
    """The C library, loaded once in the worker so that each horse need not load it, with
    its ``prctl`` looked up: ctypes makes a function on its first lookup, which in each
    forked horse cost some 0.1 ms of copy-on-write faults (become_subreaper 200 -> 80 us)."""
    try:
        lib = ctypes.CDLL(None, use_errno=True)
    except OSError:
        return None
    getattr(lib, "prctl", None)  # not Linux: no prctl, as become_subreaper expects
    return lib


def become_subreaper() -> None:
    """Keep this process's orphaned descendants as its children (Linux), findable by a stop."""
    try:
        libc().prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    except AttributeError:  # not Linux: descendants whose parent exited are out of reach
        return


def parent_and_group(pid: int) -> tuple[int, int]:
    """(parent pid, process group) of ``pid``, from ``/proc``; (0, 0) once it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            fields = stat.read().rsplit(b")", 1)[1].split()
        return int(fields[1]), int(fields[2])
    except (OSError, IndexError, ValueError):
        return 0, 0


def state(pid: int) -> bytes:
    """The state letter of ``pid`` in ``/proc`` (``R``, ``S``, ``D``, ``T``, ``Z``, ...);
    empty once it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            return stat.read().rsplit(b")", 1)[1].split()[0]
    except (OSError, IndexError):
        return b""


def lead_own_session() -> None:
    """Make this process (a horse, as it starts) the leader of a session of its own, and
    of a process group of that id. RQ makes each horse lead a process group only
    (``os.setpgrp``); a child of the job that leads a group of its own
    (``subprocess.Popen(..., process_group=0)``) then leaves that group, and once the horse
    is gone (OOM-killed) nothing found it: it worked on beside the job's next run. In the
    horse's own session it stays findable by the session id (:func:`end_session`) however
    it regroups, until it starts a session of its own. A group leader may not start a
    session, so the horse first steps back into its parent's group (same session) for
    the instant before ``setsid``."""
    me = os.getpid()
    try:
        if os.getsid(0) == me:
            return
        if os.getpgrp() == me:
            os.setpgid(0, os.getpgid(os.getppid()))
        os.setsid()
    except OSError:
        try:  # stay the leader of a group of its own, as RQ made it
            os.setpgid(0, 0)
        except OSError:
            pass


def session_of(pid: int) -> int:
    """The session ``pid`` belongs to, from ``/proc``; 0 once it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            return int(stat.read().rsplit(b")", 1)[1].split()[3])
    except (OSError, IndexError, ValueError):
        return 0


def end_session(sid: int) -> set[int]:
    """SIGKILL every process of session ``sid`` and their descendants, frozen first (what
    is left of a dead horse: :func:`lead_own_session`). A session id stays reserved while
    any member lives, so this reaches the session's own processes, or nothing. Returns
    the pids killed."""

    def members_and_descendants() -> set[int]:
        found: set[int] = set()
        for pid in _pids():
            if session_of(pid) == sid:
                found |= tree(pid)
        return found

    return _freeze_then_kill(members_and_descendants, frozenset({os.getpid()}))


def _freeze_then_kill(find: Callable[[], set[int]], keep: frozenset[int]) -> set[int]:
    """SIGSTOP what ``find`` returns (but ``keep``), again until it finds no new process (a
    stopped process cannot fork out of reach), then SIGKILL them all. Returns them."""
    stopped: set[int] = set()
    while True:
        new = find() - stopped - keep
        if not new:
            break
        for pid in new:
            _signal(pid, signal.SIGSTOP)
        stopped |= new
    for pid in stopped:
        _signal(pid, signal.SIGKILL)
    return stopped


def _pids() -> list[int]:
    try:
        return [int(name) for name in os.listdir("/proc") if name.isdigit()]
    except OSError:
        return []


def _parents() -> dict[int, tuple[int, int]]:
    """Every process on the host: pid -> (parent pid, process group)."""
    table: dict[int, tuple[int, int]] = {}
    for pid in _pids():
        found = parent_and_group(pid)
        if found != (0, 0):  # else it ended while we looked
            table[pid] = found
    return table


def _children(pid: int) -> list[int]:
    """``pid``'s children, from its threads' ``children`` files (``CONFIG_PROC_CHILDREN``)."""
    found: list[int] = []
    try:
        threads = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return found  # ended
    for thread in threads:
        try:
            with open(f"/proc/{pid}/task/{thread}/children", "rb") as listed:
                found += [int(child) for child in listed.read().split()]
        except OSError:
            continue  # the thread ended
    return found


#: Children can be read per process: a walk costs the tree's size, not the host's.
_CHILDREN_FILES = os.path.exists(f"/proc/{os.getpid()}/task/{os.getpid()}/children")


def tree(root: int, group: bool = False) -> set[int]:
    """``root``, its descendants and (with ``group``) the members of its process group."""
    children_of: Callable[[int], Iterable[int]]
    if group or not _CHILDREN_FILES:
        table = _parents()
        index: dict[int, list[int]] = {}
        for pid, (parent, _) in table.items():
            index.setdefault(parent, []).append(pid)
        found = {root} if root in table else set()
        if group:
            found |= {pid for pid, (_, pgid) in table.items() if pgid == root}
        children_of = lambda pid: index.get(pid, ())  # noqa: E731
    else:
        found = {root} if os.path.exists(f"/proc/{root}") else set()
        children_of = _children
    todo = list(found)
    while todo:
        for child in children_of(todo.pop()):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def kill_tree(root: int, group: bool = False, spare: frozenset[int] = frozenset()) -> set[int]:
    """SIGKILL ``root``, its descendants and (``group``: ``root`` leads a group, as a horse
    does) its process group, frozen first; ``spare`` and the calling process are left
    alone until the end, when a caller inside the tree (a horse fencing itself) ends too.
    Returns the pids killed."""
    me = os.getpid()
    keep = spare | {me}
    if group and root not in keep:
        try:  # the group at once; the walks then need only follow parent links
            os.killpg(root, signal.SIGSTOP)
        except (ProcessLookupError, PermissionError):
            pass
    # its members are its descendants: a horse is a subreaper from its first instruction
    # (root too where /proc is missing)
    stopped = _freeze_then_kill(lambda: tree(root) | {root}, keep)
    if group:
        try:
            os.killpg(root, signal.SIGKILL)  # a caller in the group (a horse fencing itself) ends here
        except (ProcessLookupError, PermissionError):
            pass
    if root == me:
        os.kill(me, signal.SIGKILL)
    return stopped
