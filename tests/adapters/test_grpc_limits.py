"""The connection limits of the gRPC port (`blockx.api._grpclib.Http2Protocol`) where
only the protocol itself can be driven: in process, on a plain asyncio loop."""

from __future__ import annotations

import asyncio
import socket

from h2.errors import ErrorCodes

from blockx.api._grpclib import ConnectionLimits, GuardedServer, Http2Protocol

LIMITS = ConnectionLimits(
    max_streams=4, max_connections=4, idle_timeout_s=60, max_resets=4, reset_window_s=10
)


def test_a_connection_grpclib_is_closing_already_is_not_closed_again_for_a_limit() -> None:
    # grpclib closes a connection itself (a GOAWAY received, a keepalive unanswered) and
    # lets go of its transport; a limit met before the loop reports the connection lost
    # (the idle timer, due in the same turn) must then leave it be.
    async def run() -> list[str]:
        closed: list[str] = []
        server = GuardedServer([], max_message_bytes=1024, limits=LIMITS, on_closed=closed.append)
        ours, theirs = socket.socketpair()
        with theirs:
            loop = asyncio.get_running_loop()
            transport, protocol = await loop.connect_accepted_socket(server._protocol_factory, ours)
            assert isinstance(protocol, Http2Protocol)
            protocol.processor.close("closed by grpclib")
            protocol._close_for("idle", ErrorCodes.NO_ERROR, "no open stream")
            transport.abort()
        return closed

    assert asyncio.run(run()) == []
