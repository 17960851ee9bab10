"""What the lease panel for rq-dashboard costs, and what its record costs (issue 25).

1. The page against jobs in flight: N = 0, 100, 1,000 and 10,000 leased jobs on one queue,
   and 10 queues of 1,000. The jobs are real leases: enqueued, taken by LeaseWorkers
   through the real take script (``pop_job``), each with its RQ execution and started as
   a horse starts it (status ``started``, in RQ's started registry); every other lease
   reported through its lock manager's tick (``emq_report``, as the renewal writes it),
   one worker per 1,000 leases. Before them, each queue has a history:
   jobs taken by a worker that died (lock gone, deadline passed), swept (marked, then
   recovered, or failed at max attempts for one in ten), so its events stream is full
   (MAXLEN ~ 1000) and its last sweep round recorded; the 59 other minutes of its
   per-minute ring are filled as the record leaves them. Then, through Flask's test
   client (server-side render, no network), GET each page ``--requests`` times: the
   panel's page ``/leases``, the fragment its auto-refresh fetches, and beside them
   rq-dashboard's own queues page, the queues JSON it fetches, and its JSON of the first
   100 started jobs of the (first) queue. Per page: latency (p50, p95, max), round trips
   (every client's requests in the process: rq-dashboard opens a new client for each
   request, so its handshake counts), Redis commands (INFO commandstats, those inside
   the read script included), Redis time (the read script's from commandstats; the other
   commands' from SLOWLOG in a second pass, as renewal.py does), the bytes Redis sent
   (INFO stats ``total_net_output_bytes``) and the page's size.
2. The record's size and cost: the events stream and the minutes ring after many events
   (XLEN, MEMORY USAGE, encoding), and what the record adds to a sweep that marks and
   recovers K stalled jobs: the real script beside the same script with the record's
   two functions made no-ops (loaded in this process only, never written to lua/), in
   alternating rounds; per recovered job: commands, Redis time in the sweep's scripts,
   the XADDs' own time, Redis CPU (each the best round and the median one).

One private redis-server for everything.

    python benchmarks/dashboard.py [--requests 20] [--rounds 12] [--quick]
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from statistics import median

import redis
from common import MEASURING, RoundTrips, Spent, percentile, private_redis, spending, table
from flask.testing import FlaskClient
from job_lease import per_unit, ratio
from redis.connection import Connection
from redis.utils import HIREDIS_AVAILABLE
from renewal import enqueue, holding, top_level

from rq_emq import scripts
from rq_emq.hold.lease import LockManager
from rq_emq.intake.take import Taker
from rq_emq.keys import QueueKeys, job_key
from rq_emq.operate.dashboard import create_app
from rq_emq.operate.panel import CHART_KINDS, CHART_MINUTES, EVENTS_SHOWN, LEASES_SHOWN
from rq_emq.recover.sweep import Sweeper
from rq_emq.run.job_lease import encode_report
from rq_emq.settings import LeaseSettings

#: The measured leases never lapse while the pages are read.
LEASE_MS = 3_600_000
#: The sweeps of a history: a short lease, a short grace between the mark and the recovery.
SWEEP = LeaseSettings(lease_ms=1_000, renew_interval_ms=10, sweep_interval_ms=16)
#: Jobs a dead worker left stalled, per queue, before the measured ones: two events each
#: (marked, then recovered or failed), so the stream is past its cap of about 1,000.
HISTORY = 600
#: Leases a worker holds at most: 10,000 leases are 10 workers' lock managers.
PER_WORKER = 1_000
#: A LuaScript's record made no-ops (after lib/record.lua, so the script's own code calls these).
NO_RECORD = """
-- benchmarks/dashboard.py: the record left out, to measure what it adds
local function record_event() end
local function record_minute() end
"""


#: What parses Redis's replies in this process (redis-py uses hiredis when it is installed).
PARSER = "hiredis" if HIREDIS_AVAILABLE else "redis-py's own, in Python"


def queue_names(queues: int) -> list[str]:
    return ["bench"] if queues == 1 else [f"bench-{i}" for i in range(queues)]


# -- building what the page reads ---------------------------------------------------------------
def stall(r: redis.Redis, queue: str, n: int) -> list[str]:
    """n jobs taken by a worker that then died: its locks gone, its deadlines passed."""
    enqueue(r, n, queue)
    taker, q = Taker(r, "dead-worker", SWEEP), QueueKeys(queue)
    ids = []
    for _ in range(n):
        taken = taker.pop([queue])
        assert taken is not None
        ids.append(taken.job_id)
    with r.pipeline(transaction=False) as pipe:
        for job_id in ids:
            pipe.delete(q.lock(job_id)).zadd(q.leases, {job_id: 0})
        pipe.execute()
    return ids


def sweep_twice(sweeper: Sweeper, queue: str) -> int:
    """One round that marks, one that recovers (or fails); the script calls of both."""
    calls = sweeper.sweep(queue, mode="force").calls
    time.sleep(sweeper.grace_ms / 1000 + 0.01)
    return calls + sweeper.sweep(queue, mode="force").calls


def history(r: redis.Redis, queue: str, stalled: int) -> None:
    """The queue's record as a dead worker's stalled jobs leave it (one in ten a poison
    pill, failed at its max attempts of 1), and its per-minute ring's other minutes."""
    ids = stall(r, queue, stalled)
    with r.pipeline(transaction=False) as pipe:
        for job_id in ids[::10]:
            pipe.hset(job_key(job_id), "emq_max_attempts", 1)
        pipe.execute()
    sweep_twice(Sweeper(r, [queue], SWEEP, name="rq-emq-sweeper:bench"), queue)
    seconds, micros = r.time()
    minute = (seconds * 1000 + micros // 1000) // 60_000
    ring: dict[str, int] = {}
    for past in range(minute - CHART_MINUTES + 1, minute):  # this minute's slot: the sweeps'
        slot = past % CHART_MINUTES
        ring[f"at:{slot}"] = past
        for k, kind in enumerate(CHART_KINDS):
            ring[f"{kind}:{slot}"] = (past * (k + 3)) % (7 - k)
    r.hset(QueueKeys(queue).minutes, mapping=ring)  # type: ignore[arg-type]


def in_flight(url: str, queue: str, n: int) -> list[LockManager]:
    """n leased, started jobs on ``queue``, every other one with a report on its job hash."""
    managers = []
    for w in range(0, n, PER_WORKER):
        count = min(PER_WORKER, n - w)
        manager = holding(url, count, queue, f"worker-{queue}-{w // PER_WORKER}", True, lease_ms=LEASE_MS)
        for i, lease in enumerate(manager.held()[::2]):
            lease.post_report(encode_report(round(i / count, 3), {"step": "load", "rows": i * 100}))
        manager.tick()
        managers.append(manager)
    return managers


def build(r: redis.Redis, url: str, queues: list[str], n: int, stalled: int) -> None:
    r.flushdb()
    for queue in queues:
        history(r, queue, stalled)
        in_flight(url, queue, n)


# -- reading the pages ----------------------------------------------------------------------------
@contextmanager
def counting_every_client() -> Iterator[None]:
    """Every request any client of this process sends adds to :attr:`RoundTrips.count`:
    rq-dashboard makes its own client (a new one per request), with no way to give it ours."""
    original = Connection.send_packed_command

    def counted(self: Connection, command: object, check_health: bool = True) -> None:
        RoundTrips.count += 1
        original(self, command, check_health)  # type: ignore[arg-type]

    Connection.send_packed_command = counted  # type: ignore[method-assign]
    try:
        yield
    finally:
        Connection.send_packed_command = original  # type: ignore[method-assign]


def sent_bytes(r: redis.Redis) -> int:
    return int(r.info("stats")["total_net_output_bytes"])


@dataclass
class Page:
    times_ms: list[float]
    trips: float
    commands: float
    script_usec: float
    usec: float
    redis_bytes: float
    page_bytes: int


def get(client: FlaskClient, path: str) -> bytes:
    answer = client.get(path)
    assert answer.status_code == 200, (path, answer.status_code, answer.data[:300])
    return answer.data


def read_page(r: redis.Redis, client: FlaskClient, path: str, requests: int) -> Page:
    """GET ``path`` ``requests`` times: what each cost (see the module's docstring)."""
    for _ in range(2):  # warm up: templates compiled, scripts loaded
        body = get(client, path)
    r.config_resetstat()
    before = sent_bytes(r)
    info_bytes = sent_bytes(r) - before  # an INFO's own reply, sent after it counted
    times = []
    before, trips = sent_bytes(r), RoundTrips.count
    with counting_every_client():
        for _ in range(requests):
            started = time.perf_counter()
            body = get(client, path)
            times.append((time.perf_counter() - started) * 1000)
    trips, after = RoundTrips.count - trips, sent_bytes(r)
    stats = r.info("commandstats")
    commands = sum(v["calls"] for k, v in stats.items() if not k.startswith(MEASURING))
    # pass 2: the commands clients sent, timed inside Redis (the read script's from pass 1:
    # SLOWLOG logs each command a script runs too)
    passes = max(requests // 4, 2)
    r.slowlog_reset()
    r.config_set("slowlog-log-slower-than", 0)
    for _ in range(passes):
        get(client, path)
    r.config_set("slowlog-log-slower-than", -1)
    sent = sum(usec for name, usec in top_level(r) if name != b"EVALSHA")
    script_usec = stats.get("cmdstat_evalsha", {"usec": 0})["usec"] / requests
    return Page(
        times,
        trips / requests,
        commands / requests,
        script_usec,
        script_usec + sent / passes,
        (after - before - info_bytes) / requests,
        len(body),
    )


def check(html: str, queues: list[str], n: int, history_events: bool) -> None:
    """The page shows what was built: every queue's count, its first leases, its events."""
    for queue in queues:
        assert f'data-queue="{queue}"' in html
    assert html.count(f'<td class="in-flight">{n}</td>') == len(queues), "in-flight count"
    assert html.count('<tr class="rq-emq-lease') == len(queues) * min(n, LEASES_SHOWN), "lease rows"
    if history_events:
        assert html.count('<tr class="rq-emq-event ') == len(queues) * EVENTS_SHOWN, "event rows"
    if n:
        assert "step=&#34;load&#34;" in html or 'step="load"' in html, "no report shown"


def page_table(url: str, setups: list[tuple[int, int]], requests: int, stalled: int) -> str:
    r = redis.Redis.from_url(url)
    client = create_app(url).test_client()
    rows = []
    for queues_count, n in setups:
        queues = queue_names(queues_count)
        build(r, url, queues, n, stalled)
        first = queues[0]
        routes = [
            ("rq-emq `/leases`", "/leases"),
            ("rq-emq panels (auto-refresh)", "/0/view/leases/panels"),
            ("rq-dashboard queues page `/`", "/"),
            ("rq-dashboard `queues.json`", "/0/data/queues.json"),
            ("rq-dashboard started jobs JSON", f"/0/data/jobs/{first}/started/100/asc/1.json"),
        ]
        check(get(client, "/leases").decode(), queues, n, 2 * stalled >= EVENTS_SHOWN)
        jobs = client.get(routes[-1][1]).get_json()["jobs"]
        assert len(jobs) == min(n, 100), len(jobs)
        measured = [(label, read_page(r, client, path, requests)) for label, path in routes]
        base = percentile(measured[-1][1].times_ms, 50)
        setup = f"{n:,}" if queues_count == 1 else f"{queues_count} × {n:,}"
        for label, page in measured:
            p50 = percentile(page.times_ms, 50)
            rows.append(
                [
                    setup,
                    label,
                    f"{p50:.1f}",
                    f"{percentile(page.times_ms, 95):.1f}",
                    f"{max(page.times_ms):.1f}",
                    f"{page.trips:.0f}",
                    f"{page.commands:.0f}",
                    f"{page.usec:.0f}",
                    f"{page.script_usec:.0f}" if page.script_usec else "",
                    f"{page.redis_bytes / 1024:.1f}",
                    f"{page.page_bytes / 1024:.1f}",
                    ratio(p50, base),
                ]
            )
    return table(
        [
            "in flight",
            "page",
            "p50 ms",
            "p95 ms",
            "max ms",
            "round trips",
            "Redis cmds",
            "Redis µs",
            "read script µs",
            "KiB from Redis",
            "page KiB",
            "p50 ÷ stock jobs JSON's",
        ],
        rows,
    )


# -- 2. the record: its size, and what it adds to a sweep --------------------------------------
def size_table(r: redis.Redis, stalled_runs: list[int]) -> str:
    """The record of one queue after ``sum(stalled_runs)`` stalled jobs were swept."""
    r.flushdb()
    queue, q = "record", QueueKeys("record")
    sweeper = Sweeper(r, [queue], SWEEP, name="rq-emq-sweeper:bench")
    rows, written = [], 0
    for stalled in stalled_runs:
        stall(r, queue, stalled)
        sweep_twice(sweeper, queue)
        written += 2 * stalled
        rows.append(size_row(r, f"{written:,}", q.events, r.xlen(q.events)))
    # an hour of them: every minute's slot of the ring in use
    history(r, "ring", 10)
    ring = QueueKeys("ring").minutes
    rows.append(size_row(r, "every minute of an hour", ring, r.hlen(ring)))
    return table(
        ["events recorded", "key", "entries / fields kept", "MEMORY USAGE bytes", "bytes each", "encoding"],
        rows,
    )


def size_row(r: redis.Redis, written: str, key: str, kept: int) -> list[object]:
    memory = int(r.memory_usage(key, samples=0) or 0)
    encoding = r.object("encoding", key).decode()  # type: ignore[union-attr]
    return [written, f"`{key}`", f"{kept:,}", f"{memory:,}", f"{memory / kept:.0f}", encoding]


@contextmanager
def without_record() -> Iterator[None]:
    """The sweep's script with the record's two functions made no-ops, in this process only."""
    name = "move_stalled_jobs_to_wait"
    real = scripts.load
    source = real(name).source
    # redefined right after the last of the two (a script keeps only the library it uses)
    last = source.index("\nlocal function record_minute(")
    after = source.index("\nend\n", last) + len("\nend\n")
    variant = scripts.LuaScript(name, source[:after] + NO_RECORD + source[after:])

    def load(wanted: str) -> scripts.LuaScript:
        return variant if wanted == name else real(wanted)

    scripts.load = load  # type: ignore[assignment]
    try:
        yield
    finally:
        scripts.load = real


def sweep_cost(r: redis.Redis, stalled: int, record: bool) -> tuple[Spent, int, dict[str, int]]:
    """One sweep (a marking and a recovering round) of ``stalled`` jobs: what Redis spent,
    the script calls, and the XADDs' calls and own time (µs)."""
    queue = "swept"
    stall(r, queue, stalled)
    sweeper = Sweeper(r, [queue], SWEEP, name="rq-emq-sweeper:bench")
    with contextlib.nullcontext() if record else without_record(), spending(r) as spent:
        calls = sweep_twice(sweeper, queue)
    xadd = r.info("commandstats").get("cmdstat_xadd", {"calls": 0, "usec": 0})
    assert r.zcard(QueueKeys(queue).leases) == 0
    r.delete(QueueKeys(queue).rq_queue)  # the recovered jobs out of the next round's way
    return spent, calls, xadd


def record_table(r: redis.Redis, sizes: list[int], rounds: int) -> str:
    """Per recovered job, each variant's best round (the one a busy host disturbed least:
    Redis times its commands by the wall clock) and its median round. The sweep's own
    commands vary a little with how a round splits into script calls; the record's XADDs
    do not."""
    rows = []
    for stalled in sizes:
        r.flushdb()
        # the stream at its cap first: each XADD of the measured sweeps also trims
        history(r, "swept", HISTORY)
        r.delete(QueueKeys("swept").rq_queue)
        blocks: dict[bool, list[Spent]] = {True: [], False: []}
        xadds: dict[bool, list[dict[str, int]]] = {True: [], False: []}
        calls: dict[bool, int] = {}
        for round_ in range(rounds):
            for record in (True, False) if round_ % 2 else (False, True):
                spent, calls[record], xadd = sweep_cost(r, stalled, record)
                blocks[record].append(spent)
                xadds[record].append(xadd)
        best = {
            record: (
                min(b.unit_usec for b in blocks[record]) / stalled,
                min(b.cpu_usec for b in blocks[record]) / stalled,
            )
            for record in (False, True)
        }
        base = per_unit(blocks[False], stalled)
        for record in (False, True):
            spent, (usec, cpu) = per_unit(blocks[record], stalled), best[record]
            xadd_usec = [x["usec"] / stalled for x in xadds[record]]
            rows.append(
                [
                    f"{stalled:,}",
                    "with the record" if record else "record made no-ops",
                    calls[record],
                    f"{spent.commands:.2f}",
                    f"{sum(x['calls'] for x in xadds[record]) / (stalled * rounds):.2f}",
                    f"{usec:.1f} / {spent.unit_usec:.1f}",
                    f"{min(xadd_usec):.1f} / {median(xadd_usec):.1f}" if record else "",
                    f"{cpu:.1f} / {spent.cpu_usec:.1f}",
                    ratio(spent.commands, base.commands) if record else "",
                    ratio(usec, best[False][0]) if record else "",
                    ratio(cpu, best[False][1]) if record else "",
                ]
            )
    return table(
        [
            "stalled jobs",
            "sweep script",
            "script calls",
            "Redis cmds/job",
            "XADDs/job",
            "script µs/job, best / median",
            "XADD µs/job",
            "Redis CPU µs/job, best / median",
            "cmds ratio",
            "script µs ratio (best)",
            "CPU ratio (best)",
        ],
        rows,
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=20, help="GETs per page")
    parser.add_argument("--rounds", type=int, default=12, help="alternating sweeps per variant")
    parser.add_argument("--quick", action="store_true")
    options = parser.parse_args()
    setups = [(1, 0), (1, 100), (1, 1_000), (1, 10_000), (10, 1_000)]
    stalled_runs, sweeps, stalled = [300, 300, 1_400], [100, 1_000], HISTORY
    if options.quick:
        setups, stalled_runs, sweeps, stalled = [(1, 0), (2, 30)], [30, 30], [20], 30
        options.requests, options.rounds = 3, 1
    logging.disable(logging.WARNING)
    with private_redis() as url:
        r = redis.Redis.from_url(url)
        sections: list[tuple[str, Callable[[], str]]] = [
            (
                f"The lease panel's page beside rq-dashboard's (redis-py's reply parser: {PARSER})",
                lambda: page_table(url, setups, options.requests, stalled),
            ),
            ("The record's size", lambda: size_table(r, stalled_runs)),
            (
                "What the record adds to a sweep, per recovered job",
                lambda: record_table(r, sweeps, options.rounds),
            ),
        ]
        print("\n\n".join(f"{title}\n\n{run()}" for title, run in sections))


if __name__ == "__main__":
    main()
