"""Differences between the RQ releases we support (2.0 … 3.x), in one place.

RQ 2.0 is the oldest release supported: it introduced Executions (started-registry
members ``<job_id>:<execution_id>`` with a per-job ``rq:executions:<id>`` index, which the
sweep uses to clean RQ's view of a recovered job) and the intermediate list behind its
single-queue BLMOVE. RQ 1.x has neither.

The horse-crash seams (:mod:`rq_emq.recover.horse_crash`) need nothing here: every supported
release reaps the horse with ``os.wait4`` and calls ``handle_work_horse_killed(job, retpid,
ret_val, rusage)`` just before failing its job; ``monitor_work_horse`` (RQ 3 adds the
execution) and ``kill_horse`` (its default signal) differ only in what is passed through.
"""

from __future__ import annotations

import copy
import logging
from datetime import datetime, timedelta
from typing import Any

from rq.utils import now
from rq.worker import WorkerStatus

try:  # what RQ's warm-stop signal handler raises in an idle worker
    from rq.exceptions import StopRequested
except ImportError:  # RQ 2.0 keeps it in rq.worker
    from rq.worker import StopRequested  # type: ignore[attr-defined,no-redef]


def resp2_callbacks() -> dict[str, Any]:
    """redis-py's reply callbacks for RESP2-shaped replies (what Lua hands back, whatever
    protocol the client speaks), giving the Python shapes RQ's code expects.

    redis-py 8 builds them per protocol; 5 to 7 keep two dicts to merge.
    """
    try:
        from redis._parsers.response_callbacks import get_response_callbacks

        return dict(get_response_callbacks(user_protocol=2, legacy_responses=True))
    except ImportError:
        from redis._parsers.helpers import _RedisCallbacks, _RedisCallbacksRESP2

        return {**_RedisCallbacks, **_RedisCallbacksRESP2}


def run_failure_callback(job: Any, error: BaseException) -> None:
    """Run ``job``'s failure callback for ``error`` under its timeout, from any thread
    (RQ 3 moved this from a Job method to ``rq.callbacks``). A raising callback is logged,
    as RQ does, and does not stop the failure from being recorded."""
    from rq.timeouts import TimerDeathPenalty

    if getattr(job, "failure_callback", None) is None:
        return
    exc_info = (type(error), error, None)
    try:
        try:
            from rq.callbacks import execute_failure_callback
        except ImportError:
            job.execute_failure_callback(TimerDeathPenalty, *exc_info)
        else:
            execute_failure_callback(job, TimerDeathPenalty, *exc_info)
    except Exception:
        logging.getLogger("rq_emq.sweep").exception("job %s: failure callback raised", job.id)


def resolve_driver_info_once(pool: Any) -> None:
    """Make ``pool``'s new connections skip redis-py 8's per-connection version lookup.

    redis-py 8 reads its own version from the package metadata (``importlib.metadata``,
    about 3 ms) every time it opens a connection, and a forked horse opens one per job.
    Resolved here once, in the worker, every horse inherits it; connections still send the
    same name and version with ``CLIENT SETINFO``. Older redis-py resolves it at import,
    and a pool given its own driver info, name or version is left as it is.
    """
    try:
        from redis.connection import AbstractConnection
        from redis.driver_info import resolve_driver_info
    except ImportError:
        return
    kwargs = getattr(pool, "connection_kwargs", None)
    connection_class = getattr(pool, "connection_class", None)
    if not isinstance(kwargs, dict) or not isinstance(connection_class, type):
        return
    if not issubclass(connection_class, AbstractConnection):
        return
    if kwargs.keys() & {"driver_info", "lib_name", "lib_version"}:
        return
    kwargs["driver_info"] = resolve_driver_info()


def resolve_server_version_once(connection: Any) -> None:
    """Cache the Redis server version on ``connection`` as RQ does (``rq.utils.get_version``).

    RQ 2 asks a job's connection for it as the job's result is saved; stock RQ's dequeue
    has asked already, ours has not, so every horse would open a second connection (its
    first is held by the finish's WATCH) to send ``INFO server``. Asked once here, in the
    worker, every horse inherits the answer. A server that will not tell is left to RQ."""
    try:
        from rq.utils import get_version

        get_version(connection)
    except Exception:  # RQ's own call, later, reports what is wrong
        return


def execution_ids(worker: Any) -> set[str]:
    """Ids of the executions ``worker`` keeps (RQ 3: a dict ``executions``; RQ 2: one
    ``execution``)."""
    executions = getattr(worker, "executions", None)
    if isinstance(executions, dict):
        return set(executions)
    execution = getattr(worker, "execution", None)
    return {execution.id} if execution is not None else set()


def execution_state(worker: Any) -> Any:
    """What ``worker`` holds of its executions (RQ 3: the ``executions`` dict; RQ 2: its
    one ``execution``), to hand a horse forked ahead (:mod:`rq_emq.run.fork_ahead`)."""
    executions = getattr(worker, "executions", None)
    if isinstance(executions, dict):
        return dict(executions)
    return getattr(worker, "execution", None)


def restore_execution_state(worker: Any, state: Any) -> None:
    """In a horse forked ahead: its worker's executions as they were at the handover."""
    executions = getattr(worker, "executions", None)
    if isinstance(executions, dict) and isinstance(state, dict):
        executions.clear()
        executions.update(state)
    else:
        worker.execution = state


def forget_executions(worker: Any, keep: set[str]) -> None:
    """Drop the executions ``worker`` registered beyond ``keep`` (a try that failed)."""
    executions = getattr(worker, "executions", None)
    if isinstance(executions, dict):
        for execution_id in set(executions) - keep:
            executions.pop(execution_id, None)
        return
    execution = getattr(worker, "execution", None)
    if execution is not None and execution.id not in keep:
        worker.execution = None


def started_entry_ids(registry: Any, members: list[str]) -> list[str]:
    """What ``StartedJobRegistry.get_expired_job_ids`` returns for these registry members.

    RQ 2.2 and later parse ``<job_id>:<execution_id>`` into the job id; earlier 2.x return
    the member as stored (their ``Job.fetch`` parses it).
    """
    parse = getattr(registry, "parse_job_id", None)
    return [parse(member) for member in members] if parse is not None else list(members)


def is_repeated_stop_signal(worker: Any) -> bool:
    """True when RQ ignores this cold-stop signal as a duplicate (within 1 s of the first).

    Every supported release debounces the pool's echo of Ctrl+C the same way; we must not
    hand a job back for a signal that RQ then ignores.
    """
    requested: datetime | None = getattr(worker, "_shutdown_requested_date", None)
    return requested is not None and (now() - requested) < timedelta(seconds=1)


def spawn_worker_class() -> type[Any] | None:
    """RQ's ``SpawnWorker`` (RQ 3: its horse is a new interpreter); None where RQ lacks it."""
    try:
        from rq.worker import SpawnWorker  # type: ignore[attr-defined,unused-ignore]
    except ImportError:
        return None
    return SpawnWorker  # type: ignore[no-any-return,unused-ignore]


def drop_failure_callback(job: Any) -> None:
    """Keep RQ's failure path from running ``job``'s failure callback in this process
    (RQ 2.0 to 3.x read it through ``Job.failure_callback``, which a set ``_failure_callback``
    short-cuts; the job's hash keeps its callback for a later run)."""
    job._failure_callback = None


__all__ = [
    "StopRequested",
    "drop_failure_callback",
    "WorkerStatus",
    "execution_ids",
    "forget_executions",
    "is_repeated_stop_signal",
    "resolve_driver_info_once",
    "resp2_callbacks",
    "run_failure_callback",
    "spawn_worker_class",
    "started_entry_ids",
]


def record_result(job: Any, ttl: int | None, return_value: Any = None, exc_string: str | None = None) -> None:
    """Write one Result of a run (RQ 2.0 to 3.x: ``Result.create(job, type, ttl, ...)``
    takes these the same way; later ones' execution fields are optional)."""
    from rq.results import Result

    if exc_string is None:
        Result.create(job, Result.Type.SUCCESSFUL, ttl, return_value=return_value)
    else:
        Result.create_failure(job, ttl, exc_string)


def failure_ttl(job: Any) -> int:
    """The job's failure TTL as RQ's failure applies it."""
    from rq.defaults import DEFAULT_FAILURE_TTL

    return int(job.failure_ttl) if job.failure_ttl is not None else int(DEFAULT_FAILURE_TTL)


def _worker_named_in_logs() -> bool:
    import rq.worker

    return hasattr(rq.worker, "__path__")


#: RQ's worker log lines begin with ``Worker <name>:`` from the release that made
#: ``rq.worker`` a package (2.12 has it; 2.0 to 2.6 log ``<queue>: <description> (<id>)``
#: alone): the take's line keeps the layout of the RQ installed, which tools (and RQ's
#: own tests) read by position.
WORKER_NAMED_IN_LOGS: bool = _worker_named_in_logs()


#: RQ's lines (lower case) for a job it takes as finished: "Job OK", then how long its
#: result is kept (RQ 3 names the job in each; 2.0 to 2.6 in the first only). A lease
#: worker drops them for an outcome its fence discarded.
RQ_SUCCESS_LINES = ("job ok", "result is kept", "result discarded immediately", "result will never expire")
#: RQ's line as it fails the job of a horse that died on its own (RQ 3: "job X failed
#: (Work-horse terminated unexpectedly; ...)"; 2.0: "Moving job to FailedJobRegistry (...)").
RQ_HORSE_DIED_LINE = "work-horse terminated unexpectedly"
#: RQ's line, with the traceback, for an exception out of a job (RQ 3: "Worker w: job X:
#: exception raised while executing (f)"; 2.0: "[Job X]: exception raised while executing").
RQ_JOB_RAISED_LINE = "exception raised while executing"


def bootstrap_log_options(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, str, str]:
    """``(logging_level, date_format, log_format)`` as RQ's ``work()`` hands them to
    ``bootstrap`` (every supported release: positionally, in this order)."""
    from rq.defaults import DEFAULT_LOGGING_DATE_FORMAT, DEFAULT_LOGGING_FORMAT

    names = ("logging_level", "date_format", "log_format")
    given = dict(zip(names, args, strict=False)) | {k: v for k, v in kwargs.items() if k in names}
    return (
        given.get("logging_level"),
        given.get("date_format") or DEFAULT_LOGGING_DATE_FORMAT,
        given.get("log_format") or DEFAULT_LOGGING_FORMAT,
    )


def _rq_major() -> int:
    import rq

    return int(str(rq.__version__).split(".")[0])


#: The installed RQ's major release: SpawnWorker's leases need 3 (its spawned horse differs in 2.x).
RQ_MAJOR: int = _rq_major()

#: Whether RQ's success loop may run again after a WatchError and still write the whole
#: outcome: RQ 3 passes the run's execution to each pass; RQ 2.x's ``cleanup_execution``
#: drops ``worker.execution`` in the first pass, so a second pass leaves the started-registry
#: entry behind (stock RQ 2.x too, after a dependent added mid-finish). A watched finish
#: (rq_emq/fence/watched_commit.py) aborts on any write to the job hash since its read (a
#: renewal's heartbeat), so under RQ 2.x the finish keeps the one script call, which no
#: such write aborts.
SUCCESS_LOOP_RETRIES_WHOLE: bool = RQ_MAJOR >= 3


def schedule_in_the_callers_transaction() -> None:
    """Make ``ScheduledJobRegistry.schedule`` queue its ZADD on the pipeline it is given, as
    RQ 3 does. RQ 2.x sends it at once on its own connection, ahead of the transaction that
    holds the rest of a delayed ``Retry`` (the job's save with one retry used): a reader saw
    the job scheduled with no retry used yet, and a horse whose lease was lost put its job
    in the scheduled registry although its fenced outcome was refused, while the sweep
    handed the job on (a second run due later). Installed once in a lease worker's process;
    a call with no pipeline is RQ's own."""
    from rq.registry import ScheduledJobRegistry

    original = ScheduledJobRegistry.schedule
    if RQ_MAJOR >= 3 or getattr(original, "_emq_in_transaction", False):
        return

    def schedule(self: Any, job: Any, scheduled_datetime: Any, pipeline: Any = None) -> Any:
        if pipeline is None:
            return original(self, job, scheduled_datetime)
        on_pipeline = copy.copy(self)  # RQ's own code (its time zone rule) on the pipeline
        on_pipeline.connection = pipeline
        return original(on_pipeline, job, scheduled_datetime)

    schedule._emq_in_transaction = True  # type: ignore[attr-defined]
    ScheduledJobRegistry.schedule = schedule  # type: ignore[method-assign]


def ask_pubsub_thread_to_stop(thread: Any) -> None:
    """Tell redis-py's pubsub thread to leave its loop, without waiting for it.

    redis-py 8.2's ``stop()`` also joins the thread, with no bound by default: told before
    the UNSUBSCRIBE whose reply wakes it, the thread sits out its 60 s read first. Before
    8.2 ``stop()`` took no timeout and never waited."""
    try:
        thread.stop(timeout=0)
    except TypeError:
        thread.stop()
