"""HTTP/1.1 on Trio with h11, and the hand-over to WebSocket.

What the metrics port and the hub's port share: reading a request head (and a
bounded body), answering with one whole response (`Connection: close`, or,
where the caller allows it, keeping the connection for the client's next
request), closing without a reset, and handing an upgrade request to
trio-websocket with the bytes already read replayed. Must never let one
client's bytes do more than fail that client's request.
"""

from __future__ import annotations

import contextlib
import http
import logging
from collections.abc import Awaitable, Callable
from typing import Final

import h11
import trio
import trio_websocket

RECEIVE_BYTES: Final = 16 * 1024
MAX_REQUEST_HEAD_BYTES: Final = 16 * 1024
LINGER_S: Final = 1.0
LINGER_BYTES: Final = 256 * 1024
REQUEST_HEAD_TIMEOUT_S: Final = 10.0
"""How long a client may take to send its request head (on a kept connection: how long
it may stay idle)."""
RESPONSE_TIMEOUT_S: Final = 30.0
HANDSHAKE_TIMEOUT_S: Final = 10.0
"""How long a WebSocket handshake may take once its upgrade request is read."""
WEBSOCKET_MAX_MESSAGE_BYTES: Final = 1024 * 1024
"""trio-websocket's own default."""
_KNOWN_STATUSES: Final = frozenset(status.value for status in http.HTTPStatus)


class BodyTooLarge(Exception):
    """A request body larger than the caller allows."""


async def serve_guarded(
    stream: trio.abc.HalfCloseableStream,
    serve: Callable[[trio.abc.HalfCloseableStream], Awaitable[None]],
    logger: logging.Logger,
) -> None:
    """`serve(stream)`, then close it. A client that went away ends it quietly; a bug is
    logged and ends this connection only, never the port."""
    async with stream:
        try:
            await serve(stream)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass  # the client went away
        except Exception:
            logger.exception("%s: a connection failed", logger.name)


def new_connection() -> h11.Connection:
    return h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_REQUEST_HEAD_BYTES)


async def read_request(
    stream: trio.abc.HalfCloseableStream, connection: h11.Connection, received: bytearray
) -> h11.Request | None:
    """The request head, or None if the client closed first. Raises h11.RemoteProtocolError."""
    while True:
        event = connection.next_event()
        if event is h11.NEED_DATA:
            data = bytes(await stream.receive_some(RECEIVE_BYTES))
            received += data
            connection.receive_data(data)  # b"" tells h11 the client closed
            continue
        if isinstance(event, h11.Request):
            return event
        return None  # ConnectionClosed (or nothing sensible before a request)


async def read_request_head(
    stream: trio.abc.HalfCloseableStream, connection: h11.Connection, received: bytearray
) -> h11.Request | None:
    """The request head within `REQUEST_HEAD_TIMEOUT_S`, or None: the client closed, was too
    slow, or sent a malformed head (answered with h11's 4xx, naming what is wrong)."""
    try:
        with trio.move_on_after(REQUEST_HEAD_TIMEOUT_S):
            return await read_request(stream, connection, received)
        return None
    except h11.RemoteProtocolError as error:
        with trio.move_on_after(RESPONSE_TIMEOUT_S):
            await respond(stream, connection, error.error_status_hint, f"bad request: {error}\n")
        return None


async def accept_websocket(
    stream: trio.abc.HalfCloseableStream,
    received: bytes,
    serve: Callable[[trio_websocket.WebSocketConnection], Awaitable[None]],
    *,
    max_message_size: int = WEBSOCKET_MAX_MESSAGE_BYTES,
) -> None:
    """Finish the handshake of the upgrade request just read (its bytes, `received`, are
    replayed to trio-websocket) within `HANDSHAKE_TIMEOUT_S`, then `serve` the socket."""
    async with trio.open_nursery() as nursery:
        socket: trio_websocket.WebSocketConnection | None = None
        with trio.move_on_after(HANDSHAKE_TIMEOUT_S):
            handshake = await trio_websocket.wrap_server_stream(
                nursery, ReplayedStream(stream, received), max_message_size=max_message_size
            )
            socket = await handshake.accept()
        if socket is not None:
            await serve(socket)
        nursery.cancel_scope.cancel()


async def respond(
    stream: trio.abc.HalfCloseableStream,
    connection: h11.Connection,
    status: int,
    body: bytes | str,
    content_type: str = "text/plain; charset=utf-8",
    *,
    head: bool = False,
    extra: list[tuple[str, str]] | None = None,
) -> None:
    """Send one whole response (headers only for HEAD); the connection is done after it."""
    if await _send_response(stream, connection, status, body, content_type, head=head, extra=extra):
        await close_gently(stream)


async def respond_keeping(
    stream: trio.abc.HalfCloseableStream,
    connection: h11.Connection,
    status: int,
    body: bytes | str,
    content_type: str,
) -> bool:
    """Send one whole response and keep the connection for the client's next request, if
    HTTP/1.1 lets it (the client did not ask to close, and its request was read to the
    end): True, and `connection` waits for that request. Else close it, as `respond`."""
    if not await _send_response(stream, connection, status, body, content_type, keep=True):
        return False
    with contextlib.suppress(h11.RemoteProtocolError):
        while connection.their_state is h11.SEND_BODY:
            if not isinstance(connection.next_event(), h11.EndOfMessage):
                break  # a body not read, or not here yet: this connection is done
    if connection.our_state is h11.DONE and connection.their_state is h11.DONE:
        connection.start_next_cycle()
        return True
    await close_gently(stream)
    return False


async def _send_response(
    stream: trio.abc.HalfCloseableStream,
    connection: h11.Connection,
    status: int,
    body: bytes | str,
    content_type: str,
    *,
    head: bool = False,
    extra: list[tuple[str, str]] | None = None,
    keep: bool = False,
) -> bool:
    """Send the response; False if h11 could not answer any more."""
    if connection.our_state not in (h11.IDLE, h11.SEND_RESPONSE):
        return False
    data = body.encode() if isinstance(body, str) else body
    headers = [
        ("content-type", content_type),
        ("content-length", str(len(data))),
        ("cache-control", "no-store"),
        *(() if keep else (("connection", "close"),)),
        *(extra or ()),
    ]
    reason = http.HTTPStatus(status).phrase.encode() if status in _KNOWN_STATUSES else b""
    out = connection.send(h11.Response(status_code=status, headers=headers, reason=reason)) or b""
    if data and not head:
        out += connection.send(h11.Data(data=data)) or b""
    out += connection.send(h11.EndOfMessage()) or b""
    await stream.send_all(out)
    return True


async def read_body(
    stream: trio.abc.HalfCloseableStream, connection: h11.Connection, limit: int
) -> bytes:
    """The whole body of the request just read; `BodyTooLarge` above `limit` bytes."""
    body = bytearray()
    while True:
        event = connection.next_event()
        if event is h11.NEED_DATA:
            connection.receive_data(bytes(await stream.receive_some(RECEIVE_BYTES)))
        elif isinstance(event, h11.Data):
            body += event.data
            if len(body) > limit:
                raise BodyTooLarge(f"a request body of more than {limit} bytes")
        else:
            return bytes(body)  # EndOfMessage, or the client closed


async def close_gently(stream: trio.abc.HalfCloseableStream) -> None:
    """Half-close, then read (briefly) what the client still sends before the socket closes.

    Closing a socket that has unread input makes the kernel answer with a
    reset, which can destroy the response before the client reads it (after a
    request head that was too large, or a body that was never read).
    """
    with trio.move_on_after(LINGER_S):
        await stream.send_eof()
        discarded = 0
        while discarded < LINGER_BYTES and (chunk := await stream.receive_some(RECEIVE_BYTES)):
            discarded += len(chunk)


def header(request: h11.Request, name: bytes) -> str:
    values = [value.decode("latin-1") for key, value in request.headers if key == name]
    return ",".join(values)


def is_websocket_upgrade(request: h11.Request) -> bool:
    connection_tokens = {
        token.strip().lower() for token in header(request, b"connection").split(",")
    }
    return (
        request.method == b"GET"
        and "upgrade" in connection_tokens
        and header(request, b"upgrade").strip().lower() == "websocket"
        and bool(header(request, b"sec-websocket-key"))
    )


class ReplayedStream(trio.abc.Stream):
    """`stream`, with `prefix` (the bytes already read from it) returned first."""

    def __init__(self, stream: trio.abc.HalfCloseableStream, prefix: bytes) -> None:
        self._stream = stream
        self._prefix = prefix

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        if self._prefix:
            size = len(self._prefix) if max_bytes is None else max_bytes
            chunk, self._prefix = self._prefix[:size], self._prefix[size:]
            await trio.lowlevel.checkpoint()
            return chunk
        return bytes(await self._stream.receive_some(max_bytes))

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        await self._stream.send_all(data)

    async def wait_send_all_might_not_block(self) -> None:
        await self._stream.wait_send_all_might_not_block()

    async def aclose(self) -> None:
        await self._stream.aclose()
