"""The ``rq-emq`` commands' shared options: where Redis is (``--url``, ``-c``), which queues,
the workers' job and queue classes, ``--watch``, the outbox drain's, and a Redis failure
mid-command turned into a message (exit 1), not a traceback."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import click
from redis.exceptions import RedisError
from rq.job import Job
from rq.queue import Queue

from ..keys import QueueKeys
from . import inspection
from .cli_connect import load_class

#: The workers' job and queue classes, which say where their jobs and queues live.
Classes = tuple[type[Job], type[Queue]]


def load_classes(job_class: str | None, queue_class: str | None) -> Classes:
    return load_class(job_class, "--job-class", Job), load_class(queue_class, "--queue-class", Queue)


def redis_errors(command: Callable[..., None]) -> Callable[..., None]:
    """Turn a Redis failure mid-command into a clear message and exit 1, not a traceback."""

    @functools.wraps(command)
    def wrapper(*args: Any, **kwargs: Any) -> None:
        try:
            command(*args, **kwargs)
        except RedisError as error:
            raise click.ClickException(f"Redis error: {error}") from None

    return wrapper


def common(command: Callable[..., None]) -> Callable[..., None]:
    """Options every inspecting command shares."""
    for option in reversed(
        [
            click.option(
                "--url", "-u", envvar="RQ_REDIS_URL", help="Redis URL (default: REDIS_URL, else localhost)."
            ),
            click.option("--config", "-c", help="Module holding RQ settings (REDIS_URL, ..., RQ_EMQ_*)."),
            click.option(
                "--queues",
                "-q",
                "queue_options",
                multiple=True,
                help="Queues, split on commas or spaces (default: all in rq:queues).",
            ),
            click.argument("queue_args", nargs=-1, metavar="[QUEUE]..."),
            click.option("--json", "as_json", is_flag=True, help="Print JSON for machines."),
        ]
    ):
        command = option(command)
    return redis_errors(command)


def class_options(command: Callable[..., None]) -> Callable[..., None]:
    """``--job-class`` and ``--queue-class``, as the workers were given them (RQ's CLI
    options): they say where the workers' jobs and queues live."""
    command = click.option(
        "--queue-class", help="The workers' --queue-class (import path): where their queues live."
    )(command)
    return click.option("--job-class", help="The workers' --job-class (import path): where their jobs live.")(
        command
    )


def layout_of(classes: Classes) -> inspection.Layout:
    return functools.partial(QueueKeys.named, queue_class=classes[1], job_class=classes[0])


def watch_option(command: Callable[..., None]) -> Callable[..., None]:
    return click.option(
        "--watch",
        type=click.FloatRange(min=0.1),
        is_flag=False,
        flag_value=2.0,
        default=None,
        metavar="[SECONDS]",
        help="Refresh every SECONDS (default 2) until Ctrl-C; put it after the queue names.",
    )(command)


def drain_options(command: Callable[..., None]) -> Callable[..., None]:
    """``--serializer`` and ``--no-drain``, for the commands that drain the outbox."""
    for option in reversed(
        [
            click.option(
                "--serializer",
                "-S",
                help="The jobs' serializer, as RQ's CLI takes it: an import path "
                "(e.g. rq.serializers.JSONSerializer; RQ 3 also takes json, pickle). Default: RQ's.",
            ),
            click.option(
                "--no-drain",
                is_flag=True,
                help="Leave the outbox drain (the Result and on_failure of jobs failed at max "
                "attempts) to the workers: for a process without the app's code.",
            ),
        ]
    ):
        command = option(command)
    return command
