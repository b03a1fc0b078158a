"""A loopback TCP proxy a test steers, to put network faults between a worker and a hub.

    async with tcp_proxy(hub.port) as proxy:
        client = HubClient(url=proxy.url, credential=token)
        proxy.drop()                        # every connection reset at once
        proxy.partition()                   # both ways held, nothing closed ...
        proxy.heal()                        # ... then what was held goes on
        proxy.heal(reset=True)              # ... or every connection is reset
        eaten = proxy.eat(TO_WORKER, Recorded)  # the next frame holding one is lost
        proxy.retarget(new_hub.port)        # the same address, another hub

It forwards bytes as they come. Each direction is read as an HTTP head and
then WebSocket frames (tests/adapters/ws_wire.py), so the proxy can leave out
exactly one frame, whole, and note every message it saw. It never changes a
byte it forwards.

With certificates (`tcp_proxy(port, tls=pki)`) both legs are TLS: the proxy
serves the worker with the hub's certificate and reaches the hub as a client
trusting the same CA, so it still reads, eats and notes frames in between
(no byte of the plain text it forwards is changed either). A reset resets
the TCP connections under the TLS.
"""

from __future__ import annotations

import socket
import struct
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Final, TypeVar

import attrs
import trio

from blockx.hubwire import Message
from tests.adapters.certificates import Pki
from tests.adapters.ws_wire import WireReader

TO_HUB: Final = "to_hub"
TO_WORKER: Final = "to_worker"
RECEIVE_BYTES: Final = 64 * 1024
M = TypeVar("M", bound=Message)


@attrs.frozen(kw_only=True)
class Heard:
    """A message that went through the proxy (or was eaten by it)."""

    direction: str
    message: Message
    connection: int
    """Which connection (1, 2, ... in the order they were accepted)."""
    eaten: bool = False


@attrs.define(eq=False)
class _Meal:
    """Leave out the next frame going `direction` that holds a `kind` message."""

    direction: str
    kind: type[Message]
    eaten: trio.Event = attrs.Factory(trio.Event)


@attrs.define(eq=False)
class _Connection:
    number: int
    scope: trio.CancelScope = attrs.Factory(trio.CancelScope)
    streams: list[trio.SocketStream] = attrs.Factory(list)
    """The TCP connections, both ends (under the TLS, if any)."""

    def reset(self) -> None:
        """Close both ends with RST (SO_LINGER 0), dropping whatever was held."""
        for stream in self.streams:
            stream.socket.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.scope.cancel()


@attrs.define(eq=False)
class TcpProxy:
    """See the module docstring; made by `tcp_proxy`."""

    target_port: int
    tls: Pki | None = None
    port: int = 0
    heard: list[Heard] = attrs.Factory(list)
    accepted: int = 0
    """Connections accepted so far."""
    _open: dict[int, _Connection] = attrs.Factory(dict)
    _flowing: trio.Event = attrs.Factory(trio.Event)
    _meals: list[_Meal] = attrs.Factory(list)
    _changed: trio.Event = attrs.Factory(trio.Event)

    def __attrs_post_init__(self) -> None:
        self._flowing.set()

    @property
    def url(self) -> str:
        """Where a worker connects: ws://, or wss:// when the proxy speaks TLS."""
        return f"{'ws' if self.tls is None else 'wss'}://127.0.0.1:{self.port}"

    @property
    def ca_file(self) -> str:
        """The CA a client of `url` trusts ("" in plain text)."""
        return "" if self.tls is None else self.tls.ca_file

    # ------------------------------------------------------------------ faults

    def drop(self) -> None:
        """Reset every open connection now (new ones are taken as usual)."""
        for connection in list(self._open.values()):
            connection.reset()

    def partition(self) -> None:
        """Hold all traffic, both ways and of new connections too, closing nothing."""
        if self._flowing.is_set():
            self._flowing = trio.Event()

    def heal(self, *, reset: bool = False) -> None:
        """End a partition: what was held goes on, or (`reset`) every connection is reset
        and what was held is lost."""
        if reset:
            self.drop()
        self._flowing.set()

    def eat(self, direction: str, kind: type[Message]) -> trio.Event:
        """Leave out the next frame going `direction` that holds a `kind` message; the
        event is set once it was."""
        meal = _Meal(direction=direction, kind=kind)
        self._meals.append(meal)
        return meal.eaten

    def retarget(self, port: int) -> None:
        """New connections go to `port` (open ones stay where they are)."""
        self.target_port = port

    # ------------------------------------------------------------------ what it saw

    def messages(self, direction: str, kind: type[M]) -> list[M]:
        """The `kind` messages that went `direction` (eaten ones included), in order."""
        return [
            h.message
            for h in self.heard
            if h.direction == direction and isinstance(h.message, kind)
        ]

    async def wait_for(self, direction: str, kind: type[M], count: int = 1, *, since: int = 0) -> M:
        """The `count`-th `kind` message going `direction` that went through, once it did;
        `since` leaves out the first so many of `heard`."""
        while True:
            seen = [
                h.message
                for h in self.heard[since:]
                if h.direction == direction and isinstance(h.message, kind) and not h.eaten
            ]
            if len(seen) >= count:
                return seen[count - 1]
            await self._changed.wait()

    # ------------------------------------------------------------------ forwarding

    async def serve(self, client: trio.SocketStream) -> None:
        self.accepted += 1
        connection = _Connection(number=self.accepted, streams=[client])
        self._open[connection.number] = connection
        try:
            with connection.scope:
                await self._flowing.wait()
                try:
                    upstream = await trio.open_tcp_stream("127.0.0.1", self.target_port)
                except OSError:
                    connection.reset()  # no hub there: the client sees its connection reset
                    return
                connection.streams.append(upstream)
                worker_side, hub_side = self._wrap(client, upstream)
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(self._pump, connection, worker_side, hub_side, TO_HUB)
                    nursery.start_soon(self._pump, connection, hub_side, worker_side, TO_WORKER)
        finally:
            del self._open[connection.number]
            for stream in connection.streams:
                await trio.aclose_forcefully(stream)

    def _wrap(
        self, client: trio.SocketStream, upstream: trio.SocketStream
    ) -> tuple[trio.abc.Stream, trio.abc.Stream]:
        """The two legs as the proxy speaks them: TLS both (each handshake done when first
        read or written), or the TCP connections themselves."""
        if self.tls is None:
            return client, upstream
        return (
            trio.SSLStream(
                client, self.tls.hub_server_context(), server_side=True, https_compatible=True
            ),
            trio.SSLStream(
                upstream,
                self.tls.hub_client_context(),
                server_hostname="127.0.0.1",
                https_compatible=True,
            ),
        )

    async def _pump(
        self,
        connection: _Connection,
        source: trio.abc.Stream,
        sink: trio.abc.Stream,
        direction: str,
    ) -> None:
        """Forward one direction until it ends; then the whole connection ends."""
        reader = WireReader()
        try:
            while data := bytes(await source.receive_some(RECEIVE_BYTES)):
                await self._flowing.wait()
                kept = b"".join(
                    piece.data
                    for piece in reader.feed(data)
                    if self._note(connection, direction, piece.messages)
                )
                if kept:
                    await sink.send_all(kept)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        connection.scope.cancel()

    def _note(self, connection: _Connection, direction: str, messages: tuple[Message, ...]) -> bool:
        """Record a frame's messages; False if the frame is to be eaten."""
        meal = next(
            (
                m
                for m in self._meals
                if m.direction == direction and any(isinstance(x, m.kind) for x in messages)
            ),
            None,
        )
        if meal is not None:
            self._meals.remove(meal)
        self.heard.extend(
            Heard(
                direction=direction,
                message=message,
                connection=connection.number,
                eaten=meal is not None,
            )
            for message in messages
        )
        if meal is not None:
            meal.eaten.set()
        if messages:
            self._changed.set()
            self._changed = trio.Event()
        return meal is None


@asynccontextmanager
async def tcp_proxy(target_port: int, tls: Pki | None = None) -> AsyncIterator[TcpProxy]:
    """A proxy on a free loopback port to `target_port`, speaking TLS with `tls`'s
    certificates on both legs if given; every connection closed on exit."""
    proxy = TcpProxy(target_port=target_port, tls=tls)
    async with trio.open_nursery() as nursery:
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        proxy.port = int(listeners[0].socket.getsockname()[1])
        nursery.start_soon(trio.serve_listeners, proxy.serve, listeners)
        try:
            yield proxy
        finally:
            nursery.cancel_scope.cancel()
