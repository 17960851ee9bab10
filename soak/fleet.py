"""The soak's workers: real ``rq worker`` processes, some behind their own TCP proxy, each
respawned when a fault kills it, all of them (and their horses) reaped at the end.

In a lease fleet the first ``--debug-workers`` workers run with ``--logging_level DEBUG``
and an application's log handler that a ``slow_log`` fault makes slow
(:mod:`soak.slowlog`), and the last ``--simple-workers`` are ``SimpleLeaseWorker``s
(the job runs in the worker process: no horse)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from .proxy import TcpProxy

REPO = Path(__file__).resolve().parent.parent
RQ_BIN = str(Path(sys.executable).parent / "rq")
QUEUE = "soak"

WORKER_CLASSES = {"lease": "rq_emq.LeaseWorker", "stock": "rq.Worker", "simple": "rq_emq.SimpleLeaseWorker"}
#: A DEBUG worker's log handler, and how slow it is while its ``slow_log`` fault lasts.
SLOW_LOG_ARGS = ("-c", "soak.slowlog", "--logging_level", "DEBUG")
SLOW_LOG_SECONDS = "2.0"
#: Stock RQ, as favourable as its options allow: a heartbeat every second, maintenance
#: (which fails abandoned jobs) every second, and an idle worker's blocking dequeue
#: returning every 5 s (worker_ttl - 15) so that it gets to run that maintenance.
STOCK_ARGS = ("--job-monitoring-interval", "1", "--maintenance-interval", "1", "--worker-ttl", "20")


@dataclass
class Slot:
    """One worker position in the fleet; its process is replaced when it dies."""

    index: int
    proxy: TcpProxy | None
    #: a worker kind of its own (a stock neighbour in a lease fleet), else the fleet's
    kind: str | None = None
    process: subprocess.Popen[bytes] | None = None
    generation: int = 0
    #: a stop or cut is in progress: not a victim, not respawned
    faulted: bool = False
    pids: list[int] = field(default_factory=list)
    #: a lease worker's role: "" (a ``LeaseWorker``), "simple" (a ``SimpleLeaseWorker``),
    #: "debug" (a ``LeaseWorker`` logging DEBUG through the slow handler)
    role: str = ""
    #: a DEBUG worker's flag file: while it exists, each log record takes seconds
    slow_flag: Path | None = None

    @property
    def simple(self) -> bool:
        return self.role == "simple"

    @property
    def name(self) -> str:
        letter = "s" if self.kind == "stock" else "w"
        return f"soak-{letter}{self.index}-{self.generation}"

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process is not None else None

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None


class Fleet:
    def __init__(
        self,
        kind: str,
        count: int,
        direct_url: str,
        redis_port: int,
        env: dict[str, str],
        log_dir: Path,
        proxied: int,
        stock_neighbours: int = 0,
        settings: tuple[str, Path] | None = None,
        simple: int = 0,
        debug: int = 0,
    ) -> None:
        #: (module, its directory): workers read the Redis to use from an RQ settings
        #: module (``rq worker -c``, e.g. ``SENTINEL = {...}``) instead of ``--url``
        self.settings = settings
        self.kind = kind
        self.direct_url = direct_url
        self.env = env
        self.log_dir = log_dir
        self.slots = [Slot(i, TcpProxy(redis_port).start() if i < proxied else None) for i in range(count)]
        if kind == "lease":
            for slot in self.slots[:debug]:
                slot.role, slot.slow_flag = "debug", log_dir / f"slow-log-w{slot.index}"
            for slot in self.slots[max(debug, count - simple) :]:
                slot.role = "simple"
        self.slots += [Slot(count + i, None, kind="stock") for i in range(stock_neighbours)]
        self.respawns = 0

    def neighbour_pids(self) -> set[int]:
        return {pid for slot in self.neighbours for pid in slot.pids}

    @property
    def neighbours(self) -> list[Slot]:
        """The stock workers beside a lease fleet (no fault's victim)."""
        return [slot for slot in self.slots if slot.kind == "stock" and self.kind != "stock"]

    def url(self, slot: Slot) -> str:
        return slot.proxy.url if slot.proxy is not None else self.direct_url

    def spawn(self, slot: Slot) -> None:
        slot.generation += 1
        # both kinds run RQ's scheduler (one holds its lock at a time): the mix has enqueue_in jobs
        kind = slot.kind or self.kind
        target = ["-c", self.settings[0]] if self.settings else ["--url", self.url(slot)]
        if slot.role == "debug" and not self.settings:
            target += SLOW_LOG_ARGS
        cls = WORKER_CLASSES["simple" if slot.simple else kind]
        cmd = [RQ_BIN, "worker", "--with-scheduler", "-w", cls, *target]
        cmd += ["--name", slot.name, *(STOCK_ARGS if kind == "stock" else ()), QUEUE]
        env = dict(os.environ)
        path = [str(REPO), str(self.settings[1]) if self.settings else "", env.get("PYTHONPATH")]
        env["PYTHONPATH"] = os.pathsep.join(filter(None, path))
        if kind == self.kind:
            env.update(self.env)
        if slot.slow_flag is not None:
            env.update(SOAK_SLOW_LOG_FLAG=str(slot.slow_flag), SOAK_SLOW_LOG_SECONDS=SLOW_LOG_SECONDS)
        with open(self.log_dir / f"{slot.name}.log", "wb") as log:
            slot.process = subprocess.Popen(
                cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=str(REPO), start_new_session=True
            )
        slot.pids.append(slot.process.pid)

    def start(self) -> None:
        for slot in self.slots:
            self.spawn(slot)

    def any_dead(self) -> bool:
        return any(
            not slot.faulted and slot.process is not None and slot.process.poll() is not None
            for slot in self.slots
        )

    def respawn_dead(self) -> list[tuple[str, int, int]]:
        """Replace dead workers; returns (name, pid, exit status) of each dead one."""
        dead = []
        for slot in self.slots:
            if not slot.faulted and slot.process is not None and slot.process.poll() is not None:
                dead.append((slot.name, slot.process.pid, slot.process.returncode))
                self.spawn(slot)
                self.respawns += 1
        return dead

    def sessions(self) -> set[int]:
        return {pid for slot in self.slots for pid in slot.pids}

    def stop_all(self) -> None:
        """SIGKILL every process of ours: workers and any horse left in their sessions
        (a stock horse outlives its killed worker). A process is ours when its session is
        one we started (each worker leads its own session; horses stay in it)."""
        ours = self.sessions()
        for slot in self.slots:
            if slot.alive():
                assert slot.process is not None
                os.kill(slot.process.pid, signal.SIGCONT)
                slot.process.kill()
                slot.process.wait(timeout=10)
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[3]) in ours and int(entry.name) not in ours:
                try:
                    os.kill(int(entry.name), signal.SIGCONT)
                    os.kill(int(entry.name), signal.SIGKILL)
                except ProcessLookupError:
                    pass
        for slot in self.slots:
            if slot.proxy is not None:
                slot.proxy.close()
