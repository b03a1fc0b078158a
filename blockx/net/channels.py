"""grpclib channels opened from Trio: what the worker client and the etcd client share.

Both call gRPC servers with grpclib on trio-asyncio's loop. grpclib binds its
objects to the loop that runs when they are made, so a channel is made and
closed on that loop, through `aio_as_trio`; closing is shielded, so a
cancelled caller never leaks a channel. A channel speaks TLS when given an
`ssl.SSLContext` (see `blockx.net.tls.ClientTls`), and notes whether its server
has sent anything yet (`closed_unheard`): a gRPC server starts each connection
with its HTTP/2 settings, so a connection closed before that was refused,
most often for speaking plain text to TLS or lacking an accepted client
certificate.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from collections.abc import AsyncIterator, Sequence

import trio
import trio_asyncio
from grpclib.client import Channel
from grpclib.config import Configuration
from grpclib.protocol import H2Protocol

from blockx.errors import Misuse

MAX_PORT = 65_535


class NoAsyncioLoop(Misuse):
    """A gRPC client was opened outside `trio_asyncio.open_loop()`."""

    def __init__(self, *, user: str) -> None:
        super().__init__(what=f"{user} must run inside `async with trio_asyncio.open_loop():`")


def asyncio_loop(user: str) -> object:
    """trio-asyncio's running loop; `NoAsyncioLoop` naming `user` when there is none."""
    loop = trio_asyncio.current_loop.get()
    if loop is None:
        raise NoAsyncioLoop(user=user)
    return loop


def split_host_port(address: str) -> tuple[str, int]:
    """(host, port) of "host:port" or "[v6 address]:port".

    Raises ValueError whose text says what is allowed, for the caller's own error.
    """
    host, colon, port_text = address.rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if not colon or not host or not port_text.isdigit():
        raise ValueError("must be HOST:PORT")
    port = int(port_text)
    if not 1 <= port <= MAX_PORT:
        raise ValueError(f"the port must be 1-{MAX_PORT}")
    return host, port


class _Channel(Channel):
    """grpclib's channel, noting whether its current connection has heard the server, and
    its transport."""

    heard = False
    transport: asyncio.Transport | None = None

    def _protocol_factory(self) -> H2Protocol:
        protocol = super()._protocol_factory()
        self.heard = False
        made, received = protocol.connection_made, protocol.data_received

        def connection_made(transport: asyncio.BaseTransport) -> None:
            if isinstance(transport, asyncio.Transport):
                self.transport = transport
            made(transport)

        def data_received(data: bytes) -> None:
            self.heard = True
            received(data)

        protocol.connection_made = connection_made  # type: ignore[method-assign]
        protocol.data_received = data_received  # type: ignore[method-assign]
        return protocol


def closed_unheard(channel: Channel) -> bool:
    """Whether `channel`'s last connection ended before its server sent a byte (see the
    module docstring)."""
    return isinstance(channel, _Channel) and not channel.heard


async def _open(host: str, port: int, tls: ssl.SSLContext | None, server_name: str) -> Channel:
    if tls is None:
        return _Channel(host, port)
    config = Configuration(ssl_target_name_override=server_name or None)
    return _Channel(host, port, ssl=tls, config=config)


async def _close(channel: Channel) -> None:
    channel.close()
    if isinstance(channel, _Channel) and channel.transport is not None:
        # At once: a TLS transport's close waits for the server's close_notify, which a
        # loop closing next would never see, leaving its socket open.
        channel.transport.abort()


@contextlib.asynccontextmanager
async def open_channels(
    loop: object,
    addresses: Sequence[tuple[str, int]],
    *,
    tls: ssl.SSLContext | None = None,
    server_name: str = "",
) -> AsyncIterator[tuple[Channel, ...]]:
    """A channel per (host, port) on the asyncio `loop`, closed on exit. Connecting is lazy.

    With `tls`, over TLS; the server's certificate must name `server_name`, or ("") the
    host dialled."""
    channels: list[Channel] = []
    try:
        for host, port in addresses:
            opened = await trio_asyncio.aio_as_trio(_open, loop=loop)(host, port, tls, server_name)
            channels.append(opened)
        yield tuple(channels)
    finally:
        with trio.CancelScope(shield=True):
            for channel in channels:
                await trio_asyncio.aio_as_trio(_close, loop=loop)(channel)
