"""What a soak run is configured with, what it plans, and the evidence it leaves for the
checks: plain data, so the verdict can be tested on made-up evidence."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from .faults import KINDS, Fault

#: Default slack on the recovery bound: a dead holder's job must be back within
#: lease + 2 sweep intervals + this. On a busy 2-core machine (CI, other test suites) the
#: sweepers, the workers and the soak's own 20 ms watcher wait for a core. Measured: the
#: short soak's worst case was 2.3 s against the 2.5 s bound with a mutation run
#: (two pytest processes) loading the same machine.
BOUND_SLACK_S = 1.0
#: The promise for a horse that died without an outcome (``oom_horse``): its worker puts
#: the job back at once, so the bound is no ratio of the lease but "within a second".
CRASH_BOUND_S = 1.0
#: The promise after a Redis failover (``--sentinel``; docs/guarantees.md, "leaves the old
#: master at once"): each worker is back on the new master within this of every sentinel
#: naming it. A worker's watch hears Sentinel's ``+switch-master`` as it is published (every
#: sentinel publishes it as it adopts the new configuration, so once all name the new master
#: the watched one has); it then asks the sentinels (3 round trips), breaks its pools'
#: connections, and each thread's next command reconnects (a sentinel round trip, a
#: connect): milliseconds of work. The bound allows one read wait of the watch's
#: ``get_message`` (1 s) on top; the check adds the soak's bound slack (``--bound-slack``).
REJOIN_S = 1.0


@dataclass
class Config:
    duration: float = 60.0
    workers: int = 4
    worker: str = "lease"
    seed: int = 1
    rate: float = 3.0  # jobs enqueued per second
    fault_every: float = 1.5  # mean seconds between faults
    lease_ms: int = 1500
    renew_ms: int = 250
    sweep_ms: int = 500
    max_attempts: int = 5
    drain: float = 45.0
    #: seconds a recovery may take past the bound before it fails the soak (a loaded machine
    #: delays the sweeper and the watcher); see BOUND_SLACK_S
    bound_slack_s: float = BOUND_SLACK_S
    kinds: tuple[str, ...] = KINDS
    out: Path | None = None
    #: stock ``rq worker`` processes beside the lease fleet on the same queue (lease mode):
    #: frozen now and then, never killed; stock ``rq info`` runs beside them (issue 20)
    stock_neighbours: int = 1
    #: Sentinel mode (soak/sentinel.py): a primary, a replica and sentinels; workers find
    #: the master through Sentinel; the ``failover`` and ``kill_master`` faults
    sentinel: bool = False
    #: lease mode: the last of the workers are ``SimpleLeaseWorker``s (the job in the worker
    #: process), and the first run DEBUG logging through a handler a ``slow_log`` fault makes
    #: slow (soak/fleet.py)
    simple_workers: int = 1
    debug_workers: int = 1

    @property
    def grace_s(self) -> float:
        """A paused holder's lease surely outlives a pause shorter than this, by its own
        clock too: a holder trusts a lease for ``lease - margin`` past the send of its
        last renewal (self-fencing), and that send may be a renew interval old."""
        from rq_emq.settings import LeaseSettings

        margin = LeaseSettings(lease_ms=self.lease_ms, renew_interval_ms=self.renew_ms).lease_margin_ms
        return (self.lease_ms - margin - self.renew_ms) / 1000

    @property
    def bound_s(self) -> float:
        """The promise: a dead holder's job is back within lease + 2 sweep intervals."""
        return (self.lease_ms + 2 * self.sweep_ms) / 1000

    @property
    def crash_bound_s(self) -> float:
        """The promise for a horse crash: back in its queue within a second of the kill."""
        return CRASH_BOUND_S

    @property
    def double_bound_s(self) -> float:
        """The promise when another worker was hit too (the sweeper and its deputy on one
        crashed host): a standby of the election's line takes over within hold + a line
        wait instead of hold + standby, so the job is back within that plus 2 sweeps."""
        from rq_emq.recover.election import LINE_LEASES

        lease_s = self.lease_ms / 1000
        return 2 / 3 * lease_s + LINE_LEASES * lease_s + 2 * self.sweep_ms / 1000

    def env(self) -> dict[str, str]:
        return {
            "RQ_EMQ_LEASE_MS": str(self.lease_ms),
            "RQ_EMQ_RENEW_INTERVAL_MS": str(self.renew_ms),
            "RQ_EMQ_SWEEP_INTERVAL_MS": str(self.sweep_ms),
            "RQ_EMQ_MAX_ATTEMPTS": str(self.max_attempts),
        }


@dataclass
class Planned:
    job_id: str
    seconds: float
    outcome: str
    retries: int
    #: the job's own max attempts (``meta``), or None for the worker's default
    max_attempts: int | None = None
    #: the kind (soak/README.md): plain, fenced (a plain job that writes an effect,
    #: soak/effects.py), and the lifecycle's parent, dependent, cancel, delete, ttl0, scheduled
    kind: str = "plain"
    #: what does a plain job's work (soak/jobs.py): sleep, child, child_session, gil
    body: str = "sleep"
    #: a dependent's parents (job ids), and whether it runs after a parent failed too
    parents: list[str] = field(default_factory=list)
    allow_failure: bool = False
    #: a scheduled job's due time (unix time as ``enqueue_in`` was called)
    scheduled_for: float | None = None
    #: cancel/delete: how far into the run the producer acts (a fraction of ``seconds``)
    act_after: float = 0.0
    #: cancel/delete: when the producer's ``job.cancel()`` / ``job.delete()`` returned (the
    #: side-effect log's clock), and the job's status just before it
    acted_at: float | None = None
    acted_on: str | None = None
    #: cancel/delete: when the producer's call began (RQ's ``job.delete()`` takes the job
    #: out of its places before it deletes the hash, in commands of their own)
    acting_since: float | None = None


@dataclass
class Evidence:
    config: Config
    jobs: dict[str, Planned]
    faults: list[Fault]
    queue_samples: int
    queue_violations: list[str]
    final: dict[str, dict[str, Any]]
    registries: dict[str, list[str]]
    stats: dict[str, int]
    runs: dict[str, list[Any]]
    respawns: int
    drained_in: float | None
    wall: float = 0.0
    notes: list[str] = field(default_factory=list)
    #: times an RQ scheduler process (``--with-scheduler``) quit on a Redis error, from the
    #: worker logs: RQ restarts none until its lock (61 s) lapses and a worker's maintenance runs
    scheduler_deaths: int = 0
    #: pids of the stock neighbours (their runs carry no lease attempt count)
    stock_workers: list[int] = field(default_factory=list)
    #: stock ``rq info`` calls made beside the fleet, and how many failed to run
    rq_info_calls: int = 0
    #: (worker pid, job id) of each run a worker's local lease clock stopped, from its log
    #: (:mod:`soak.selffence`): the worker's own evidence for the job's next run
    self_fenced: list[tuple[int, str]] = field(default_factory=list)
    #: (worker pid, job id) of each stray copy a lease worker's take dropped unrun, from its
    #: log (:mod:`soak.straycopies`): a push of the job that RQ's own client sent again
    stray_drops: list[tuple[int, str]] = field(default_factory=list)
    #: (Redis time s, job id) of each push of a job to its queue by our scripts (a sweep's
    #: recovery, a crashed horse's job put back), from the queue's event stream
    our_pushes: list[tuple[float, str]] = field(default_factory=list)
    #: job id -> times its ``on_failure`` callback ran (the side-effect log's ``failure`` lines)
    failure_callbacks: dict[str, list[float]] = field(default_factory=dict)
    #: conservation samples taken, and their lines: ``<at> <job> <places> <until>`` of each job
    #: not in exactly one place, the script run between ``at`` and ``until`` (:mod:`soak.conservation`)
    conservation_samples: int = 0
    conservation: list[str] = field(default_factory=list)
    #: job id -> when Redis lost it (``lose_data``): resubmitted under its id by the
    #: producer, or lost with Redis (:mod:`soak.dataloss`)
    resubmitted: dict[str, float] = field(default_factory=dict)
    lost_by_redis: dict[str, float] = field(default_factory=dict)
    #: fenced job id -> its effects in Redis at the end: ``plain`` (plain twins landed),
    #: ``counted`` (the token whose fenced effect counted, or None), ``writes`` (the tokens
    #: of the fenced writes that committed, in commit order); :mod:`soak.effects`
    effects: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: pids of the SimpleLeaseWorkers (a run of one is the worker process: ``pid`` is the worker)
    simple_workers: list[int] = field(default_factory=list)


def kind_of(planned: Any) -> str:
    """A planned job's kind (soak/README.md): plain, fenced, parent, dependent, cancel,
    delete, ttl0, scheduled."""
    return getattr(planned, "kind", "plain") or "plain"


def save(evidence: Evidence, path: Path) -> None:
    """Everything the checks read, as JSON (``python -m soak --recheck DIR`` reads it back)."""
    data = asdict(evidence)
    data["config"]["out"] = None
    data["config"]["kinds"] = list(evidence.config.kinds)
    data["runs"] = {job_id: [asdict(r) for r in runs] for job_id, runs in evidence.runs.items()}
    for fault in data["faults"]:
        if isinstance(fault["token"], bytes):
            fault["token"] = fault["token"].decode()
    path.write_text(json.dumps(data))


def load(path: Path) -> Evidence:
    from .jobs import Run

    data = json.loads(path.read_text())
    config = Config(**{**data["config"], "kinds": tuple(data["config"]["kinds"])})
    faults = []
    for raw in data["faults"]:
        raw["token"] = raw["token"].encode() if raw["token"] is not None else None
        faults.append(Fault(**raw))
    return Evidence(
        config=config,
        jobs={k: Planned(**v) for k, v in data["jobs"].items()},
        faults=faults,
        queue_samples=data["queue_samples"],
        queue_violations=data["queue_violations"],
        final=data["final"],
        registries=data["registries"],
        stats=data["stats"],
        runs={k: [Run(**r) for r in v] for k, v in data["runs"].items()},
        respawns=data["respawns"],
        drained_in=data["drained_in"],
        wall=data["wall"],
        notes=data["notes"],
        scheduler_deaths=data.get("scheduler_deaths", 0),
        stock_workers=data.get("stock_workers", []),
        rq_info_calls=data.get("rq_info_calls", 0),
        self_fenced=[(int(pid), job_id) for pid, job_id in data.get("self_fenced", [])],
        stray_drops=[(int(pid), job_id) for pid, job_id in data.get("stray_drops", [])],
        our_pushes=[(float(at), job_id) for at, job_id in data.get("our_pushes", [])],
        failure_callbacks=data.get("failure_callbacks", {}),
        effects=data.get("effects", {}),
        conservation_samples=data.get("conservation_samples", 0),
        conservation=data.get("conservation", []),
        resubmitted=data.get("resubmitted", {}),
        lost_by_redis=data.get("lost_by_redis", {}),
        simple_workers=data.get("simple_workers", []),
    )
