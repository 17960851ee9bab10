"""A private redis-server for tests, demos, benchmarks and the soak: a free port, no
persistence unless asked (AOF, fsync on every write), and the fault controls (pause,
resume, kill, restart) that crash tests need."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import redis


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class RedisServer:
    """One ``redis-server`` process owned by the caller."""

    controllable = True

    def __init__(
        self, port: int | None = None, extra_args: tuple[str, ...] = (), appendonly: bool = False
    ) -> None:
        self.port = port or free_port()
        self.extra_args = extra_args
        #: AOF with ``appendfsync always``: a write Redis acknowledged survives kill + restart.
        self.appendonly = appendonly
        self.dir = Path(tempfile.mkdtemp(prefix="rq-emq-redis-"))
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> RedisServer:
        binary = shutil.which("redis-server")
        if binary is None:
            raise FileNotFoundError("redis-server is not installed")
        args = [
            binary,
            "--port",
            str(self.port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "yes" if self.appendonly else "no",
            *(("--appendfsync", "always") if self.appendonly else ()),
            "--dir",
            str(self.dir),
            "--logfile",
            str(self.dir / "redis.log"),
            *self.extra_args,
        ]
        self.process = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.wait_ready()
        return self

    def wait_ready(self, timeout: float = 10.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                redis.Redis.from_url(self.url, socket_timeout=0.5).ping()
                return
            except redis.exceptions.ConnectionError:
                if self.process is not None and self.process.poll() is not None:
                    raise RuntimeError(
                        f"redis-server exited: {(self.dir / 'redis.log').read_text()}"
                    ) from None
                time.sleep(0.02)
        raise TimeoutError(f"redis-server on port {self.port} did not start")

    def pause(self) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGCONT)

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGCONT)
            self.process.kill()
            self.process.wait()

    def restart(self) -> None:
        self.kill()
        self.start()

    def stop(self) -> None:
        self.kill()
        shutil.rmtree(self.dir, ignore_errors=True)


@contextmanager
def private_redis() -> Iterator[str]:
    """The URL of REDIS_URL when set, else of a redis-server started for this block."""
    if os.environ.get("REDIS_URL"):
        yield os.environ["REDIS_URL"]
        return
    server = RedisServer().start()
    try:
        yield server.url
    finally:
        server.stop()
