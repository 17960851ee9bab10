"""Real worker processes for tests: started as an operator would (``rq worker -w ...``),
their logs kept, and every one of them (and its horse) reaped at the end."""

from __future__ import annotations

import os
import re
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rq_emq.run.process_tree import tree
from rq_emq.testing import watchdogs_of
from soak.selffence import CLOCK_RAN_OUT

#: the line a run's watchdog logs as it ends the run at its local lease deadline
DEADLINE_KILL = re.compile(r"rq-emq watchdog \d+: run (\d+) past its deadline")

TESTS_DIR = Path(__file__).resolve().parent
RQ_BIN = str(Path(sys.executable).parent / "rq")


def wait_for(
    predicate: Callable[[], object], timeout: float = 10.0, interval: float = 0.02, what: str = ""
) -> object:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what or predicate}")


def blocked_clients(r: Any, *commands: str) -> int:
    """Clients of the Redis behind ``r`` blocked now in one of ``commands`` (``blmove``, ``blpop``)."""
    return sum(c.get("cmd") in commands and "b" in str(c.get("flags")) for c in r.client_list())


def unseen(worker_pid: int) -> int:
    """Make the kill of the worker that follows a death no process of its own sees (a host
    or a container lost whole): the worker frozen (SIGSTOP: it cannot start another
    watchdog), then its watchdog SIGKILLed. Its job is left to the sweep, a lease and up to
    two sweep intervals later. Returns the worker's pid, for the kill that follows."""
    os.kill(worker_pid, signal.SIGSTOP)
    for watchdog in watchdogs_of(worker_pid):
        os.kill(watchdog, signal.SIGKILL)
        wait_for(lambda w=watchdog: not pid_alive(w), timeout=5, what="the watchdog to die")
    return worker_pid


def pid_alive(pid: int) -> bool:
    """Whether ``pid`` runs (or is stopped): a zombie is dead for our purposes."""
    return _proc_state(pid) not in ("Z", "gone")


class Processes:
    def __init__(self, log_dir: str) -> None:
        self.log_dir = Path(log_dir)
        self.started: list[subprocess.Popen[bytes]] = []
        #: in the environment of every process this test starts, and so of their
        #: descendants: found by it, however they were re-parented
        self.mark = secrets.token_hex(8)

    def env(self, **extra: str) -> dict[str, str]:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(TESTS_DIR), env.get("PYTHONPATH")]))
        env[MARK] = self.mark
        env.update(extra)
        return env

    def start(
        self, args: list[str], env: dict[str, str] | None = None, name: str = "proc"
    ) -> subprocess.Popen[bytes]:
        log = open(self.log_dir / f"{name}-{len(self.started)}.log", "wb")
        process = subprocess.Popen(
            args,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env or self.env(),
            cwd=str(TESTS_DIR),
            start_new_session=True,
        )
        process.log_path = log.name  # type: ignore[attr-defined]
        self.started.append(process)
        return process

    def worker(
        self,
        url: str,
        *queues: str,
        worker_class: str = "rq_emq.LeaseWorker",
        burst: bool = False,
        name: str | None = None,
        args: tuple[str, ...] = (),
        **env: str,
    ) -> subprocess.Popen[bytes]:
        cmd = [RQ_BIN, "worker", "-w", worker_class, "--url", url, *(["--burst"] if burst else []), *args]
        if name:
            cmd += ["--name", name]
        return self.start([*cmd, *(queues or ("default",))], env=self.env(**env), name="worker")

    def log(self, process: subprocess.Popen[bytes]) -> str:
        return Path(process.log_path).read_text(errors="replace")  # type: ignore[attr-defined]

    def stacks(self, process: subprocess.Popen[bytes], pid: int | None = None) -> str:
        """Where each thread of the live ``process`` (or of its descendant ``pid``, which
        writes to the same log: a pool's member) stands: its Python stacks, which it
        writes to its log on SIGWINCH (tests/sitecustomize.py), read back from there."""
        before = len(self.log(process))
        try:
            os.kill(pid or process.pid, signal.SIGWINCH)
        except ProcessLookupError:
            return "(the process has ended)"
        deadline = time.monotonic() + 2
        while time.monotonic() < deadline and "Thread 0x" not in self.log(process)[before:]:
            time.sleep(0.05)
        time.sleep(0.1)  # the other threads' stacks follow the first
        return self.log(process)[before:] or "(no stacks written)"

    def self_fenced_stops(self, job_id: str) -> int:
        """How many runs of ``job_id`` a worker of this test stopped on its local lease
        clock, by its own log line ("local lease clock ran out": no renewal landed for
        lease - margin, on a host starved of CPU). Such a run is self-fencing doing its job,
        and the sweep then runs the job once more: a test that counts runs under a
        sub-second lease adds these, as the soak does (soak/selffence.py). A repeat without
        the line still fails the test."""
        return sum(
            match.group(1) == job_id
            for path in self.log_dir.glob("worker-*.log")
            for match in CLOCK_RAN_OUT.finditer(path.read_text(errors="replace"))
        )

    def deadline_kills(self, run_pids: list[int]) -> int:
        """How many of the runs ``run_pids`` (the processes that ran a job) a watchdog of
        this test ended at their local lease deadline ("run <pid> past its deadline"): on a
        host starved of CPU the watchdog may act before the worker's own clock says so, and
        a renewal that lands late then leaves no "local lease clock ran out" line. The same
        self-fencing as :meth:`self_fenced_stops`, found by the run's pid."""
        pids = {str(pid) for pid in run_pids}
        return sum(
            match.group(1) in pids
            for path in self.log_dir.glob("worker-*.log")
            for match in DEADLINE_KILL.finditer(path.read_text(errors="replace"))
        )

    def describe(self, lines: int = 25) -> str:
        """Each process this test started, as a failure report shows it: its state now
        (running, stopped, exited with what), its descendants' states, its log's last
        ``lines``. Reaps nothing (a dead leader stays a zombie until :meth:`stop_all`)."""
        out = []
        for process in self.started:
            out.append(f"== pid {process.pid}: {' '.join(process.args[1:4])}… {_state(process)}")
            descendants = sorted(tree(process.pid) - {process.pid}) if process.returncode is None else []
            for pid in descendants:
                out.append(f"   descendant {pid} {_proc_state(pid)}: {_cmdline(pid)[:100]}")
            out += [f"   | {line}" for line in _collapsed(self.log(process).splitlines())[-lines:]]
            live = process.returncode is None and _proc_state(process.pid) not in ("T", "Z", "gone")
            if live and process.args[0] == RQ_BIN:
                # where each of its threads stands (what a worker that went silent was doing),
                # and each rq process under it (a pool's member that outlived the pool's stop)
                for pid in [process.pid, *(p for p in descendants if RQ_BIN in _cmdline(p))]:
                    if _proc_state(pid) not in ("T", "Z", "gone"):
                        out.append(f"   ! stacks of {pid}:")
                        out += [f"   ! {line}" for line in self.stacks(process, pid)[-4000:].splitlines()]
        return "\n".join(out)

    def stop_all(self) -> None:
        for process in self.started:
            # the whole group while its leader is not yet reaped (a zombie still holds the
            # pid, so the group's id cannot name another group): a dead leader's children
            # (RQ's scheduler process among them) would write to later tests' Redis. Once
            # reaped, the id may be reused by another test's group (pid_max is 32768 here,
            # and CI's two suites wrap it): never kill by it then.
            if process.returncode is None:
                try:
                    os.killpg(process.pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
                process.wait(timeout=10)
        # Whatever they started and left behind (a reaped leader's children are no longer
        # in reach of its group: a pool's members, a job's daemon, a worker's scheduler)
        # must not live on into later tests on the same Redis.
        strays = {pid: _cmdline(pid) for pid in marked(self.mark)}  # named while they live
        for pid in strays:
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        if strays and os.environ.get("RQ_EMQ_TEST_STRAYS"):  # a file to list them in
            with open(os.environ["RQ_EMQ_TEST_STRAYS"], "a") as out:
                out.writelines(f"{self.log_dir.name} {pid} {line[:120]}\n" for pid, line in strays.items())
        wait_for(lambda: not marked(self.mark), timeout=10, what="the strays to end")


def _collapsed(lines: list[str]) -> list[str]:
    """A log's lines with each run of one line repeated (its time left out: a pool's
    "Waiting for workers to shutdown..." once a second) shown once, with its count."""
    out: list[str] = []
    repeats = 0
    for line in lines:
        text = re.sub(r"^\d\d:\d\d:\d\d ", "", line)
        if out and text == re.sub(r"^\d\d:\d\d:\d\d ", "", out[-1]):
            repeats += 1
            continue
        if repeats:
            out.append(f"   (the line above {repeats} more times)")
        repeats = 0
        out.append(line)
    if repeats:
        out.append(f"   (the line above {repeats} more times)")
    return out


#: the environment variable that marks the processes of one test
MARK = "RQ_EMQ_TEST_PROCESSES"


def marked(mark: str) -> list[int]:
    """The live processes on this host whose environment carries ``mark``."""
    needle = f"{MARK}={mark}".encode()
    found = []
    for name in os.listdir("/proc"):
        if name.isdigit() and int(name) != os.getpid():
            try:
                with open(f"/proc/{name}/environ", "rb") as environ:
                    if needle in environ.read().split(b"\0") and pid_alive(int(name)):
                        found.append(int(name))
            except OSError:
                continue
    return found


def _proc_state(pid: int) -> str:
    """The kernel's state letter of ``pid`` (R, S, T stopped, Z zombie), or "gone"."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return "gone"


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
            return cmdline.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return "?"


def _state(process: subprocess.Popen[bytes]) -> str:
    if process.returncode is not None:
        return f"exited {process.returncode}"
    return {"Z": "dead, not yet reaped", "T": "STOPPED", "gone": "gone"}.get(
        letter := _proc_state(process.pid), f"alive ({letter})"
    )
