"""The soak with Redis Sentinel (``python -m soak --sentinel``): a primary, one replica and
three sentinels on private ports (:class:`rq_emq.testing.sentinel.SentinelGroup`); every
worker finds the master as an operator's would, ``rq worker -c settings`` with
``SENTINEL = {...}``; and two faults that move the master, on a schedule:

- ``failover``: ``SENTINEL FAILOVER``. The old master stays writable until a sentinel's
  next look demotes it (up to 10 s); its resync then discards what it took meanwhile;
- ``kill_master``: SIGKILL of the current master. Once Sentinel named the new one, the
  killed server is started again, empty, on its port, as a replica of the new master: the
  group keeps a replica for the next round.

Each is followed, from the moment every sentinel names the new master, by a look at every
worker process's TCP connections (``/proc``, every 20 ms): a worker is *back at work*
once it holds an established connection to the new master and none to the old one (its
take, wait, lock manager and election all moved). soak/failovercheck.py holds that to
:data:`soak.model.REJOIN_S` and excuses the reruns a failover may cause, within its window.

The worker's TCP proxies cannot sit between a worker and a master it resolves through
Sentinel (the address Sentinel names is the server's own), so the faults that need them
(``cut_*``, ``hang``, ``partition_long``) and the single server's ``restart`` are not
drawn in this mode; the stock neighbour is off by default (``--stock-neighbours``).
"""

from __future__ import annotations

import time
from pathlib import Path

import redis

from rq_emq.testing import RedisServer
from rq_emq.testing.sentinel import SERVICE, SentinelGroup

from . import faults as F
from .faults import Fault
from .fleet import Fleet, Slot
from .model import REJOIN_S
from .run import Soak

#: Sentinels in the group (quorum 2): a kill_master needs a majority to agree it is down.
SENTINELS = 3
#: The first master-moving fault comes this long into the chaos, the next ones this far apart:
#: after a ``SENTINEL FAILOVER`` the old master is demoted up to 10 s later and then resyncs
#: (a second), and a replica that is not yet in sync must not be promoted (it would hold no
#: data), so a round waits for one anyway.
FIRST_AT_S = 5.0
EVERY_S = 11.0
#: No master-moving fault later than this before the chaos ends: the switch, the rejoin
#: look and the reruns it causes are then all seen while jobs still flow.
LAST_BEFORE_END_S = 8.0
#: How long a round waits for a replica in sync (the last round's old master resyncing).
REPLICA_PATIENCE_S = 15.0
#: How long the soak waits for the sentinels to agree on a new master.
SWITCH_PATIENCE_S = 30.0
#: How long it looks for a worker to come back before it records the worker as never back.
REJOIN_PATIENCE_S = 10.0


class SentinelSoak(Soak):
    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.group: SentinelGroup
        self.notes: list[str] = []
        self._last_at = 0.0  # monotonic: no master-moving fault after this (schedule())

    # -- Redis: the group, and the soak's own client through Sentinel ---------------------
    def start_redis(self) -> None:
        self.group = SentinelGroup(self.dir / "sentinel", count=SENTINELS)
        self.server = self.current_master()
        self.client = self.group.client()

    def stop_redis(self) -> None:
        self.group.stop()

    def servers(self) -> list[RedisServer]:
        return [self.group.primary, self.group.replica]

    def current_master(self) -> RedisServer:
        """The server Sentinel names now (``self.server`` follows it: ``rq info`` and
        ``client_kill`` go there)."""
        port = self.group.primary_port()
        return next(s for s in self.servers() if s.port == port)

    def make_fleet(self, env: dict[str, str], logs: Path) -> Fleet:
        cfg = self.config
        (self.dir / "soak_sentinel_settings.py").write_text(self.group.settings_text())
        neighbours = cfg.stock_neighbours if cfg.worker == "lease" else 0
        return Fleet(
            cfg.worker,
            cfg.workers,
            self.server.url,
            self.server.port,
            env,
            logs,
            proxied=0,
            stock_neighbours=neighbours,
            settings=("soak_sentinel_settings", self.dir),
        )

    # -- the faults ----------------------------------------------------------------------
    def schedule(self, start: float, end: float) -> list[tuple[float, str]]:
        # kill_master first: its killed server comes back as a replica at once, while the
        # old master of a SENTINEL FAILOVER is demoted and resynced only 10 s or more later
        kinds = [k for k in ("kill_master", "failover") if k in self.config.kinds]
        if not kinds:
            return []
        out: list[tuple[float, str]] = []
        at = start + min(FIRST_AT_S, self.config.duration / 4)
        self._last_at = max(at, end - LAST_BEFORE_END_S)
        while at <= self._last_at:
            out.append((at, kinds[len(out) % len(kinds)]))
            at += EVERY_S
        return out

    def replica_ready(self) -> bool:
        """A replica in sync with the master, and every sentinel sees it so: only then may
        it be promoted (one before its first sync holds no data at all)."""
        try:
            master = self.group.primary_port()
            for server in self.servers():
                if server.port == master:
                    continue
                info = redis.Redis(port=server.port, socket_timeout=1).info("replication")
                if info.get("role") != "slave" or int(info.get("master_port", 0)) != master:
                    return False
                if info.get("master_link_status") != "up" or info.get("master_sync_in_progress"):
                    return False
            for port in self.group.ports:
                replicas = redis.Redis(port=port, socket_timeout=1).sentinel_slaves(SERVICE)
                if not replicas or any(
                    r.get("master-link-status") != "ok"
                    or r.get("is_sdown")
                    or r.get("is_odown")
                    or r.get("is_disconnected")
                    for r in replicas
                ):
                    return False
            return True
        except (redis.RedisError, OSError, StopIteration):
            return False

    def ready_for(self, kind: str) -> bool:
        """A master-moving fault waits for a replica in sync, and is dropped once it would
        come later than LAST_BEFORE_END_S before the chaos ends."""
        if kind not in F.SENTINEL_KINDS:
            return True
        return time.monotonic() < self._last_at and self.replica_ready()

    def chaos(self) -> None:
        super().chaos()
        # the drain needs a replica in sync: the outbox runs a failure callback only once a
        # replica acknowledged its claim (docs/guarantees.md), so a job failed at max
        # attempts after the last failover waits for one
        deadline = time.monotonic() + REPLICA_PATIENCE_S
        while not self.replica_ready() and time.monotonic() < deadline:
            time.sleep(0.1)

    def inject(self, kind: str) -> Fault | None:
        if kind not in F.SENTINEL_KINDS:
            return super().inject(kind)
        deadline = time.monotonic() + REPLICA_PATIENCE_S
        while not self.replica_ready():
            if time.monotonic() > deadline:
                raise TimeoutError(f"no replica in sync within {REPLICA_PATIENCE_S:.0f}s")
            time.sleep(0.1)
        old = self.current_master()
        fault = self.record(Fault(kind, time.time(), detail=f"master :{old.port}"))
        self.writable.clear()
        try:
            if kind == "failover":
                self.group.failover()
            else:
                old.kill()
            self.group.wait_switch(old.port, SWITCH_PATIENCE_S)
            fault.switched_at = time.time()
            # the soak's own connections move too (they are no worker's), in a new client:
            # closing the old one's under the soak's threads would break their sockets
            self.client = self.group.client()
            self.server = self.current_master()
        except Exception as error:  # noqa: BLE001 - reported as the fault's own failure
            fault.detail = f"injection failed: {error!r} ({fault.detail})"
            fault.ended = time.time()
            if kind == "kill_master" and old.process is not None and old.process.poll() is not None:
                old.start()
            return fault
        finally:
            self.writable.set()
        fault.detail += f" -> :{self.server.port}"
        try:
            fault.rejoined = self.watch_rejoin(old.port, self.server.port)
        finally:
            if kind == "kill_master":
                self.restart_as_replica(old, self.server.port)
            fault.ended = time.time()
        return fault

    def restart_as_replica(self, server: RedisServer, master_port: int) -> None:
        """Start a killed master again, empty, on its port, as a replica of the new master
        (as an operator's supervisor brings a node back): Sentinel would convert it too,
        after its next look (up to 10 s); this way the next round has a replica sooner."""
        args = list(server.extra_args)
        if "--replicaof" in args:
            at = args.index("--replicaof")
            del args[at : at + 3]
        server.extra_args = (*args, "--replicaof", "127.0.0.1", str(master_port))
        server.start()

    def watch_rejoin(self, old_port: int, new_port: int) -> dict[str, float | None]:
        """Per lease worker alive and not held by another fault: seconds from the switch
        until its process holds a connection to the new master and none to the old."""
        began = time.monotonic()
        slots = [
            s
            for s in self.fleet.slots
            if s.alive() and not s.faulted and s.kind is None and s.pid is not None
        ]
        back: dict[str, float | None] = {s.name: None for s in slots}
        snapshot: list[str] = []
        while time.monotonic() - began < REJOIN_PATIENCE_S and any(v is None for v in back.values()):
            if not snapshot and time.monotonic() - began > REJOIN_S + self.config.bound_slack_s:
                snapshot = self.clients_of(old_port) + [
                    f"{s.name} {sorted(established_ports(s.pid or 0))}" for s in slots
                ]
            for slot in slots:
                if back[slot.name] is not None or slot.pid is None:
                    continue
                peers = established_ports(slot.pid)
                if new_port in peers and old_port not in peers:
                    back[slot.name] = round(time.monotonic() - began, 3)
            time.sleep(0.02)
        late = [s for s in slots if back[s.name] is None and s.pid is not None]
        if late:  # what the report needs to tell a stuck connection from a dead one
            self.notes.append(
                "not back after a failover: "
                + ", ".join(f"{s.name} on ports {sorted(established_ports(s.pid or 0))}" for s in late)
                + f" (old :{old_port}, new :{new_port}); old master's clients at the bound: {snapshot}"
            )
        # a worker that died or was stopped meanwhile (another fault) is no finding here
        return {name: at for name, at in back.items() if at is not None or _still_up(slots, name)}

    def clients_of(self, port: int) -> list[str]:
        """``cmd`` and age of the non-sentinel, non-replication clients on ``port``."""
        try:
            listed = redis.Redis(port=port, socket_timeout=1).client_list()
        except redis.RedisError as error:
            return [repr(error)]
        return [
            f"{c.get('cmd')} {c.get('addr')} age {c.get('age')}"
            for c in listed
            if not str(c.get("name", "")).startswith("sentinel")
            and not set(str(c.get("flags", ""))) & {"S", "M"}  # a replica's or master's link
        ]


def _still_up(slots: list[Slot], name: str) -> bool:
    return any(slot.name == name and slot.alive() and not slot.faulted for slot in slots)


def established_ports(pid: int) -> set[int]:
    """Remote ports of ``pid``'s established TCP connections (``/proc/net/tcp``)."""
    inodes = F._socket_inodes(pid)
    ports: set[int] = set()
    try:
        lines = Path("/proc/net/tcp").read_text().splitlines()[1:]
    except OSError:
        return ports
    for line in lines:
        parts = line.split()
        if parts[9] in inodes and parts[3] == "01":  # 01: ESTABLISHED
            ports.add(int(parts[2].split(":")[1], 16))
    return ports
