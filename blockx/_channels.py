"""grpclib channels opened from Trio: what the worker client and the etcd client share.

Both call gRPC servers with grpclib on trio-asyncio's loop. grpclib binds its
objects to the loop that runs when they are made, so a channel is made and
closed on that loop, through `aio_as_trio`; closing is shielded, so a
cancelled caller never leaks a channel.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Sequence

import trio
import trio_asyncio
from grpclib.client import Channel

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


async def _open(host: str, port: int) -> Channel:
    return Channel(host, port)


async def _close(channel: Channel) -> None:
    channel.close()


@contextlib.asynccontextmanager
async def open_channels(
    loop: object, addresses: Sequence[tuple[str, int]]
) -> AsyncIterator[tuple[Channel, ...]]:
    """A channel per (host, port) on the asyncio `loop`, closed on exit. Connecting is lazy."""
    channels: list[Channel] = []
    try:
        for host, port in addresses:
            channels.append(await trio_asyncio.aio_as_trio(_open, loop=loop)(host, port))
        yield tuple(channels)
    finally:
        with trio.CancelScope(shield=True):
            for channel in channels:
                await trio_asyncio.aio_as_trio(_close, loop=loop)(channel)
