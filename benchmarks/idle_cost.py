"""What idle workers cost Redis: commands per second per idle worker, ours beside stock RQ.

N idle ``rq worker`` processes (N = 1, 10, 50) on 1 and on 3 queues, nothing enqueued.
Once every worker has registered and run its start-up round, ``CONFIG RESETSTAT``, wait,
then ``INFO commandstats`` (which counts the commands run inside our scripts too) gives
Redis commands per second per worker; MONITOR, watched over the same window, splits them
by what they are for (a script's inner commands count with its ``EVALSHA``):

- sweep: the stalled sweep and its fleet-wide election (the sweep script, ``hold_sweeper``,
  the idle sweeper's ``EXISTS``, a standby's ``SET NX`` on the election or the deputy key,
  a line wait's ``BLPOP``);
- wake: how an idle multi-queue worker learns of a push (``pop_job`` retries, ``CLIENT
  TRACKING`` re-arms, its ``PING``s, ``BLMOVE`` timeouts): owned by the wake/wait design;
- other: the rest (RQ's own heartbeats and maintenance).

    python benchmarks/idle_cost.py [--quick] [--seconds 60] [--workers 1 10 50]
"""

from __future__ import annotations

import argparse
import threading
import time
from contextlib import ExitStack

import redis
from common import STOCK, private_redis, table, wait_until, worker

OURS = "rq_emq.LeaseWorker"
IGNORED = ("config", "info", "monitor", "echo")
START, END = "idle-cost-window-start", "idle-cost-window-end"
#: What each of our scripts is for: the sweep (and its election), or the idle wait.
SWEEP_SCRIPTS = ("move_stalled_jobs_to_wait", "hold_sweeper", "claim_outbox")
WAKE_SCRIPTS = ("pop_job", "claim_job")
#: Plain commands of an idle worker's wait for a push (owned by the wake design).
WAKE = ("client", "ping", "blmove", "blpop", "brpoplpush", "lmove", "subscribe", "hello")


def script_names() -> dict[str, str]:
    from rq_emq import scripts

    shas = {}
    for name in (*SWEEP_SCRIPTS, *WAKE_SCRIPTS):
        try:
            shas[scripts.load(name).sha] = name
        except FileNotFoundError:  # an older checkout (measuring the base) lacks it
            continue
    return shas


def kind(command: str, script: str | None) -> str:
    """sweep, wake or other, for one command MONITOR showed (``script``: the script it
    ran inside, or the one an EVALSHA calls)."""
    if script is not None:
        return "sweep" if script in SWEEP_SCRIPTS else "wake" if script in WAKE_SCRIPTS else "other"
    words = command.split()
    name, key = words[0].lower(), (words[1] if len(words) > 1 else "")
    if name in ("set", "blpop") and key.startswith("emq:sweeper:"):
        return "sweep"  # a standby's look at the election, a deputy's recruitment, the line's wait
    if name == "exists" and key.startswith("emq:{"):
        return "sweep"  # an idle sweeper's look for work
    return "wake" if name in WAKE else "other"


def monitored(url: str, seconds: float) -> dict[str, int]:
    """Commands Redis runs over ``seconds`` (MONITOR shows those inside scripts too), by
    kind; ``cmd:<name>`` keys count them by command name. The window is marked in the
    command stream itself (an ``ECHO`` at each end)."""
    shas = script_names()
    r = redis.Redis.from_url(url)
    counts: dict[str, int] = {}
    started = threading.Event()

    def watch() -> None:
        script: str | None = None  # the script whose inner commands MONITOR shows next
        counting = False
        with redis.Redis.from_url(url, socket_timeout=None).monitor() as monitor:
            started.set()
            while True:
                seen = monitor.next_command()
                command = seen["command"]
                name = command.split()[0].lower() if command else ""
                if name == "echo":
                    if command.endswith(END):
                        return
                    counting = counting or command.endswith(START)
                    continue
                if seen["client_type"] != "lua":
                    script = shas.get(command.split()[1], "?") if name == "evalsha" else None
                if not counting or name.startswith(IGNORED):
                    continue
                what = kind(command, script)
                counts[what] = counts.get(what, 0) + 1
                counts["cmd:" + name] = counts.get("cmd:" + name, 0) + 1

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    started.wait(10)
    r.config_resetstat()
    r.echo(START)
    time.sleep(seconds)
    r.echo(END)
    thread.join(30)
    return counts


def measure(url: str, worker_class: str, workers: int, queues: list[str], seconds: float) -> dict[str, float]:
    """Commands per second per idle worker, by kind (sweep, wake, other) and by name."""
    r = redis.Redis.from_url(url)
    r.flushdb()
    with ExitStack() as stack:
        for _ in range(workers):
            stack.enter_context(worker(url, worker_class, queues))
        wait_until(lambda: r.scard("rq:workers") >= workers, timeout=60 + 2 * workers, interval=0.2)
        time.sleep(3)  # every worker's start-up round is over
        counts = monitored(url, seconds)
        stats = r.info("commandstats")
        alive = r.scard("rq:workers")
    assert alive == workers, f"{workers - alive} worker(s) died during the measurement"
    names = {k.removeprefix("cmdstat_"): int(v["calls"]) for k, v in stats.items()}
    counted = sum(v for k, v in names.items() if not k.startswith(IGNORED))
    seen = sum(v for k, v in counts.items() if k in ("sweep", "wake", "other"))
    # MONITOR and INFO commandstats must agree (a few commands at the window's edges aside)
    assert abs(counted - seen) <= max(5, seen // 20), (counted, seen)
    return {name: count / seconds / workers for name, count in counts.items()}


def top(per_name: dict[str, float], n: int = 6) -> str:
    ranked = sorted(((k[4:], v) for k, v in per_name.items() if k.startswith("cmd:")), key=lambda kv: -kv[1])
    return " ".join(f"{k}={v:.3f}" for k, v in ranked[:n] if v > 0) or "-"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="N = 1 and 3, 10 s each: only shows it runs")
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 10, 50])
    parser.add_argument("--queues", type=int, nargs="+", default=[1, 3])
    parser.add_argument("--ours-only", action="store_true", help="skip stock rq.Worker")
    options = parser.parse_args()
    seconds = 10.0 if options.quick else options.seconds
    sizes = [1, 3] if options.quick else options.workers
    classes = [OURS] if options.ours_only else [STOCK, OURS]
    rows = []
    with private_redis() as url:
        for queue_count in options.queues:
            queues = [f"q{i}" for i in range(queue_count)]
            for n in sizes:
                for worker_class in classes:
                    per_name = measure(url, worker_class, n, queues, seconds)
                    sweep, wake, other = (per_name.get(k, 0.0) for k in ("sweep", "wake", "other"))
                    total = sweep + wake + other
                    rows.append(
                        [
                            queue_count,
                            n,
                            "ours" if worker_class == OURS else "stock",
                            f"{total:.3f}",
                            f"{sweep:.3f}",
                            f"{wake:.3f}",
                            f"{other:.3f}",
                            top(per_name),
                        ]
                    )
                    print(" | ".join(map(str, rows[-1])), flush=True)
    print()
    print(
        f"Idle Redis commands per second per worker, over {seconds:.0f} s "
        "(MONITOR, checked against INFO commandstats)"
    )
    print(
        table(
            ["queues", "N", "worker", "total/s", "sweep/s", "wake/s", "other/s", "by command (per worker/s)"],
            rows,
        )
    )


if __name__ == "__main__":
    main()
