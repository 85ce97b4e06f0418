"""The campaign's TCP proxy: between each holder and Postgres, faults on the wire on command.

One asyncio loop, on a thread of the campaign's process, listens on a port per route (one
holder's way to the lease store, or to the sink, or to the payment processor) and forwards every
connection to Postgres (or to the processor).
On command, a route's connections are:

* black-holed: nothing is forwarded either way, the sockets stay open, and connections made
  meanwhile are accepted but not forwarded either (a route that acknowledges and never
  answers: no TCP timeout sees it); when the route heals, what was held back is delivered;
* reset: both sides of each connection closed at once;
* slowed: each chunk waits before it is forwarded;
* armed for an ambiguous commit: the next commit the route forwards reaches the server, and
  the server's answer is dropped for good (the connection stays open): the store (or the
  sink) committed, the client sees no answer, then an error when its own bound ends it.

A commit is, on a sink's connection, the simple query ``COMMIT``; on the store's (autocommit:
every statement commits on its own), the ``Sync`` or simple query that ends a statement. The
client must not ask for TLS or GSS encryption (``sslmode=disable``): the first message is then
the startup message and every later one is typed, so the proxy can frame them.
"""

from __future__ import annotations

import asyncio
import contextlib
import struct
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

CHUNK = 65536


class Framer:
    """Follows the client's side of the Postgres protocol across chunks; finds commits."""

    def __init__(self, autocommit: bool) -> None:
        self.autocommit = autocommit
        self._started = False  # past the (untyped) startup message
        self._head = b""
        self._skip = 0  # body bytes of the current message still to pass
        self._kind = b""
        self._peek = b""

    def feed(self, data: bytes) -> bool:
        """True when ``data`` ends a commit (a whole message seen)."""
        found = False
        view = memoryview(data)
        while view:
            if self._skip:
                take = min(self._skip, len(view))
                if self._kind == b"Q" and len(self._peek) < 8:
                    self._peek += bytes(view[: min(take, 8 - len(self._peek))])
                self._skip -= take
                view = view[take:]
                if not self._skip:
                    found |= self._ended()
                continue
            need = (5 if self._started else 4) - len(self._head)
            self._head += bytes(view[:need])
            view = view[need:]
            if len(self._head) < (5 if self._started else 4):
                continue
            if self._started:
                self._kind = self._head[:1]
                (length,) = struct.unpack("!i", self._head[1:5])
            else:
                self._kind = b""
                (length,) = struct.unpack("!i", self._head[:4])
                self._started = True
            self._head, self._peek = b"", b""
            self._skip = length - 4
            if not self._skip:
                found |= self._ended()
        return found

    def _ended(self) -> bool:
        if self._kind == b"Q":
            return self.autocommit or self._peek.upper().startswith(b"COMMIT")
        return self.autocommit and self._kind == b"S"


@dataclass(eq=False)
class Link:
    """One proxied connection."""

    client: asyncio.StreamWriter
    server: asyncio.StreamWriter
    framer: Framer
    mute_replies: bool = False  # the server's answers are dropped (an ambiguous commit)


@dataclass(eq=False)
class Route:
    """One listening port in front of one upstream server."""

    name: str
    autocommit: bool
    port: int = 0
    links: set[Link] = field(default_factory=set)
    flowing: asyncio.Event = field(default_factory=asyncio.Event)
    delay: float = 0.0
    armed: Callable[[], None] | None = None  # called when an ambiguous commit fires
    heal_at: float = 0.0
    upstream: tuple[str, int] | None = None  # None: the proxy's Postgres


class Proxy:
    """The proxy, run on a thread of its own; its methods are called from the campaign."""

    def __init__(self, upstream_host: str, upstream_port: int) -> None:
        self.upstream = (upstream_host, upstream_port)
        self.routes: dict[str, Route] = {}
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._servers: list[asyncio.Server] = []

    def start(self) -> Proxy:
        """Starts the loop's thread."""
        self._thread.start()
        return self

    def add_route(
        self, name: str, *, autocommit: bool, upstream: tuple[str, int] | None = None
    ) -> int:
        """Listens for ``name``; returns its port. ``upstream``: another server than the
        proxy's Postgres (the payment processor's HTTP), whose route is black-holed, reset and
        slowed the same way but never armed (no commit to find)."""
        return self._call(self._add_route(name, autocommit, upstream))

    def blackhole(self, name: str, seconds: float) -> None:
        """Stops forwarding on ``name`` for ``seconds``."""
        self._soon(self._blackhole, name, seconds)

    def slow(self, name: str, delay: float, seconds: float) -> None:
        """Delays each chunk on ``name`` by ``delay`` for ``seconds``."""
        self._soon(self._slow, name, delay, seconds)

    def reset(self, name: str) -> int:
        """Closes both sides of each connection on ``name``; returns how many."""
        return self._call(self._reset(name))

    def arm_ambiguous(self, name: str, fired: Callable[[], None], seconds: float) -> None:
        """The next commit on ``name`` within ``seconds`` has its answer dropped; ``fired``
        runs (on the proxy's thread) when it happens."""
        self._soon(self._arm, name, fired, seconds)

    def heal_all(self) -> None:
        """Every route forwards again, at full speed, unarmed."""
        self._call(self._heal_all())

    def stop(self) -> None:
        """Closes every connection and listener and ends the loop's thread."""
        with contextlib.suppress(Exception):
            self._call(self._close())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)
        if not self._thread.is_alive():
            self._loop.close()

    # -- on the loop --------------------------------------------------------------------------

    def _call(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(10)

    def _soon(self, fn: Callable[..., None], *args: Any) -> None:
        self._loop.call_soon_threadsafe(fn, *args)

    async def _add_route(
        self, name: str, autocommit: bool, upstream: tuple[str, int] | None
    ) -> int:
        route = Route(name, autocommit, upstream=upstream)
        route.flowing.set()
        server = await asyncio.start_server(
            lambda r, w: self._serve(route, r, w), "127.0.0.1", 0, reuse_address=True
        )
        self._servers.append(server)
        route.port = server.sockets[0].getsockname()[1]
        self.routes[name] = route
        return route.port

    def _blackhole(self, name: str, seconds: float) -> None:
        route = self.routes[name]
        route.flowing.clear()
        route.heal_at = max(route.heal_at, self._loop.time() + seconds)
        self._loop.call_at(route.heal_at, self._heal, route)

    def _heal(self, route: Route) -> None:
        if self._loop.time() >= route.heal_at - 1e-3:
            route.flowing.set()

    def _slow(self, name: str, delay: float, seconds: float) -> None:
        route = self.routes[name]
        route.delay = delay
        self._loop.call_later(seconds, setattr, route, "delay", 0.0)

    async def _reset(self, name: str) -> int:
        links = list(self.routes[name].links)
        for link in links:
            _abort(link)
        return len(links)

    def _arm(self, name: str, fired: Callable[[], None], seconds: float) -> None:
        route = self.routes[name]
        route.armed = fired

        def disarm() -> None:
            if route.armed is fired:
                route.armed = None

        self._loop.call_later(seconds, disarm)

    async def _heal_all(self) -> None:
        for route in self.routes.values():
            route.heal_at = 0.0
            route.flowing.set()
            route.delay = 0.0
            route.armed = None

    async def _close(self) -> None:
        for server in self._servers:
            server.close()
        for route in self.routes.values():
            route.flowing.set()
            for link in list(route.links):
                _abort(link)
        for server in self._servers:
            await server.wait_closed()
        await asyncio.sleep(0.05)  # the pumps see their ends

    async def _serve(
        self, route: Route, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(*(route.upstream or self.upstream))
        except OSError:
            writer.transport.abort()
            return
        link = Link(writer, up_writer, Framer(route.autocommit))
        route.links.add(link)
        try:
            await asyncio.gather(
                self._pump(route, link, reader, up_writer, upstream=True),
                self._pump(route, link, up_reader, writer, upstream=False),
            )
        finally:
            route.links.discard(link)
            _abort(link)

    async def _pump(
        self,
        route: Route,
        link: Link,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        *,
        upstream: bool,
    ) -> None:
        try:
            while True:
                data = await reader.read(CHUNK)
                if not data:
                    break
                if not route.flowing.is_set():
                    await route.flowing.wait()
                if route.delay:
                    await asyncio.sleep(route.delay)
                if not upstream and link.mute_replies:
                    continue
                writer.write(data)
                if upstream and link.framer.feed(data) and route.armed is not None:
                    fired, route.armed = route.armed, None
                    link.mute_replies = True
                    fired()
                await writer.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            # one side ended: the other is ended too (a muted link stays open until then)
            _abort(link)


def _abort(link: Link) -> None:
    for side in (link.client, link.server):
        with contextlib.suppress(Exception):
            side.transport.abort()
