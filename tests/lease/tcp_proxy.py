"""A TCP proxy the test controls, on 127.0.0.1 only: forward, black-hole or refuse.

``blackhole()`` keeps every connection open and forwards nothing either way, as a network
path that silently drops packets would, except that the kernel still acknowledges what the
client sends: only a client-side bound in time (not TCP's own) can end a call there. New
connections are accepted and then ignored. ``refuse()`` accepts each new connection and
closes it at once (a server that is down behind a load balancer). ``accepted`` counts the
connections the proxy has accepted, so a test can count reconnects.
"""

from __future__ import annotations

import contextlib
import select
import socket
import threading
from types import TracebackType
from typing import Literal

import psycopg

Mode = Literal["forward", "blackhole", "refuse"]


class TcpProxy:
    """Proxies 127.0.0.1:<port> to ``target``; ``dsn()`` points a DSN at the proxy.

    Args:
        target_host: where to forward.
        target_port: the port there.
    """

    def __init__(self, target_host: str, target_port: int) -> None:
        self._target = (target_host, target_port)
        self._listener = socket.socket()
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(64)
        self.port: int = self._listener.getsockname()[1]
        self.mode: Mode = "forward"
        self.accepted = 0
        self._lock = threading.Lock()
        self._sockets: list[socket.socket] = []
        self._closed = threading.Event()
        threading.Thread(target=self._accept, daemon=True, name="tcp-proxy").start()

    @classmethod
    def to_dsn(cls, dsn: str) -> tuple[TcpProxy, str]:
        """A proxy to the server of ``dsn``, and ``dsn`` pointed at the proxy."""
        params = psycopg.conninfo.conninfo_to_dict(dsn)
        proxy = cls(str(params.get("host") or "127.0.0.1"), int(params.get("port") or 5432))
        return proxy, psycopg.conninfo.make_conninfo(dsn, host="127.0.0.1", port=proxy.port)

    def forward(self) -> None:
        """Forwards again (connections black-holed meanwhile stay dead)."""
        self.mode = "forward"

    def blackhole(self) -> None:
        """From now on nothing passes, on open connections and on new ones."""
        self.mode = "blackhole"

    def refuse(self) -> None:
        """Closes open connections; accepts and at once closes new ones."""
        self.mode = "refuse"
        self._close_open()

    def close(self) -> None:
        """Stops the proxy and closes every connection (a client stuck on one gets an error)."""
        self._closed.set()
        with contextlib.suppress(OSError):
            self._listener.close()
        self._close_open()

    def __enter__(self) -> TcpProxy:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def _close_open(self) -> None:
        with self._lock:
            sockets, self._sockets = self._sockets, []
        for s in sockets:
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            with contextlib.suppress(OSError):
                s.close()

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            with self._lock:
                self.accepted += 1
            if self.mode == "refuse":
                client.close()
                continue
            if self.mode == "blackhole":
                with self._lock:
                    self._sockets.append(client)  # held open, never answered
                continue
            try:
                upstream = socket.create_connection(self._target, timeout=5)
            except OSError:
                client.close()
                continue
            with self._lock:
                self._sockets += [client, upstream]
            threading.Thread(
                target=self._pipe, args=(client, upstream), daemon=True, name="tcp-proxy-pipe"
            ).start()

    def _pipe(self, a: socket.socket, b: socket.socket) -> None:
        peers = {a: b, b: a}
        try:
            while not self._closed.is_set():
                if self.mode != "forward":
                    # black-holed: read nothing, send nothing (the kernel's buffers just fill)
                    self._closed.wait(0.05)
                    continue
                readable, _, _ = select.select(list(peers), [], [], 0.05)
                for s in readable:
                    data = s.recv(65536)
                    if not data:
                        return
                    peers[s].sendall(data)
        except OSError:
            return
        finally:
            for s in (a, b):
                with contextlib.suppress(OSError):
                    s.close()
