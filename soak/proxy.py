"""A small TCP proxy the soak puts between one worker and Redis, to cut that worker off.

``cut("reset")`` closes every live connection and refuses new ones (accepted, then closed
at once): the worker sees connection errors until ``heal()``. ``cut("blackhole")`` is a
network partition: bytes stop flowing both ways, new connections are accepted but carry
nothing, and nobody is told; on ``heal()`` what was held is delivered, as TCP would after a
partition heals. ``cut("hang")`` holds only Redis's replies: commands still reach Redis
and run, the client waits for an answer until its socket timeout (a half-open connection,
a stuck middlebox). Threads, one pair of pumps per connection: the soak needs a handful.
"""

from __future__ import annotations

import socket
import threading
from dataclasses import dataclass, field

CHUNK = 65536


@dataclass(eq=False)
class _Link:
    client: socket.socket
    upstream: socket.socket
    closed: bool = field(default=False)

    def close(self) -> None:
        self.closed = True
        for sock in (self.client, self.upstream):
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            sock.close()


class TcpProxy:
    """Forwards 127.0.0.1:<port> to an upstream port until told to cut."""

    def __init__(self, upstream_port: int, host: str = "127.0.0.1") -> None:
        self.host = host
        self.upstream_port = upstream_port
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind((host, 0))
        self._listener.listen(128)
        self.port: int = self._listener.getsockname()[1]
        self._links: set[_Link] = set()
        self._guard = threading.Lock()
        self._flowing = threading.Event()  # cleared during a blackhole
        self._flowing.set()
        self._replying = threading.Event()  # cleared during a hang: replies held, requests pass
        self._replying.set()
        self._refusing = False
        self._stopped = False
        self._thread = threading.Thread(target=self._accept_loop, name=f"soak-proxy:{self.port}", daemon=True)

    @property
    def url(self) -> str:
        return f"redis://{self.host}:{self.port}/0"

    @property
    def is_cut(self) -> bool:
        return self._refusing or not (self._flowing.is_set() and self._replying.is_set())

    def start(self) -> TcpProxy:
        self._thread.start()
        return self

    def cut(self, mode: str = "reset") -> None:
        """``reset``: drop live connections, refuse new ones; ``blackhole``: a partition;
        ``hang``: Redis's replies held, nothing closed (requests still get through);
        ``new``: refuse new connections only (a forked horse's, say) and keep live ones."""
        if mode not in ("reset", "blackhole", "hang", "new"):
            raise ValueError(f"cut mode must be reset, blackhole, hang or new, got {mode!r}")
        if mode == "hang":
            self._replying.clear()
            return
        if mode == "blackhole":
            self._flowing.clear()
            return
        with self._guard:
            self._refusing = True
            if mode == "new":
                return
            links, self._links = list(self._links), set()
        for link in links:
            link.close()

    def heal(self) -> None:
        with self._guard:
            self._refusing = False
        self._flowing.set()
        self._replying.set()

    def drop(self, client_addresses: set[str]) -> int:
        """Close the live connections whose client end is one of ``ip:port`` (one process's,
        say); returns how many."""
        with self._guard:
            chosen = [link for link in self._links if _peer(link.client) in client_addresses]
            for link in chosen:
                self._links.discard(link)
        for link in chosen:
            link.close()
        return len(chosen)

    def upstream_addresses(self) -> list[str]:
        """``ip:port`` of each upstream connection, as Redis's ``CLIENT LIST`` names it."""
        with self._guard:
            links = list(self._links)
        out = []
        for link in links:
            try:
                host, port = link.upstream.getsockname()[:2]
            except OSError:
                continue
            out.append(f"{host}:{port}")
        return out

    def close(self) -> None:
        self._stopped = True
        self._flowing.set()
        self._replying.set()
        try:
            self._listener.close()
        except OSError:
            pass
        with self._guard:
            links, self._links = list(self._links), set()
        for link in links:
            link.close()

    # -- internals -------------------------------------------------------------------------
    def _accept_loop(self) -> None:
        while not self._stopped:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            if self._refusing:
                client.close()
                continue
            try:
                upstream = socket.create_connection((self.host, self.upstream_port), timeout=5)
                upstream.settimeout(None)
            except OSError:  # Redis down (a restart): the client sees its connection dropped
                client.close()
                continue
            link = _Link(client, upstream)
            with self._guard:
                self._links.add(link)
            for src, dst, reply in ((client, upstream, False), (upstream, client, True)):
                threading.Thread(target=self._pump, args=(link, src, dst, reply), daemon=True).start()

    def _pump(self, link: _Link, src: socket.socket, dst: socket.socket, reply: bool) -> None:
        try:
            while True:
                data = src.recv(CHUNK)
                if not data:
                    break
                self._flowing.wait()  # a blackhole holds the bytes until heal
                if reply:
                    self._replying.wait()  # a hang holds the replies until heal
                if link.closed:
                    break
                dst.sendall(data)
        except OSError:
            pass
        finally:
            with self._guard:
                self._links.discard(link)
            link.close()


def _peer(sock: socket.socket) -> str:
    try:
        host, port = sock.getpeername()[:2]
    except OSError:
        return ""
    return f"{host}:{port}"
