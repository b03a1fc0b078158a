"""HTTP/1.1 on Trio, parsed by httptools, and the hand-over to WebSocket.

What the metrics port and the hub's port share: reading a request head (and a
bounded body), answering with one whole response (`Connection: close`, or,
where the caller allows it, keeping the connection for the client's next
request), closing without a reset, and handing an upgrade request to
trio-websocket with the bytes already read replayed. Must never let one
client's bytes do more than fail that client's request.

The parser is llhttp's (through httptools): a request costs a few
microseconds to read and answer, where a pure-Python parser took a hundred,
the largest part of what a hub spends on a submission.
"""

from __future__ import annotations

import http
import logging
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Final, TypeVar

import attrs
import httptools
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
S = TypeVar("S", bound=trio.abc.Stream)


@attrs.define(eq=False)
class Request:
    """One request as read: its head, and its body as far as it has arrived."""

    method: bytes
    target: bytes
    headers: list[tuple[bytes, bytes]]
    """Names lower-cased, in the order sent."""
    keep_alive: bool
    """Whether the client lets the connection serve another request after this one."""
    upgrade: bool
    """An upgrade request: nothing after its head is HTTP."""
    body: bytearray = attrs.Factory(bytearray)
    complete: bool = False
    """Its whole body has arrived."""


class BadRequest(Exception):
    """What is wrong with the bytes a client sent, and the status that says so."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class Connection:
    """The server side of one HTTP/1.1 connection: the requests read from it, in order.

    httptools calls back while `feed` runs; the requests it completes wait
    here, so requests a client sends without waiting for answers are taken
    one after another.
    """

    def __init__(self) -> None:
        self._parser = httptools.HttpRequestParser(self)
        self._heads: deque[Request] = deque()
        """Requests whose head is read, not yet taken."""
        self._reading: Request | None = None
        """The request whose body is arriving."""
        self._url = bytearray()
        self._headers: list[tuple[bytes, bytes]] = []
        self._head_bytes = 0
        """Bytes fed while a head arrives, or (once complete) its size."""
        self.closed = False
        """The client closed its side, or sent what cannot be read further."""
        self.error: BadRequest | None = None
        """What could not be read, once the requests before it are taken."""

    def feed(self, data: bytes) -> None:
        """Parse `data` (b"": the client closed); what is not HTTP/1.1 ends the reading,
        with `error` saying why."""
        if self.closed:
            return
        if not data:
            self.closed = True
            return
        if self._reading is None:  # a head is arriving, not a body
            self._head_bytes += len(data)
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self.closed = True  # the rest is another protocol's
        except httptools.HttpParserError as error:
            self._fail(400, str(error) or type(error).__name__)
        self._check_head_size()

    def _check_head_size(self) -> None:
        if self._head_bytes > MAX_REQUEST_HEAD_BYTES:
            self._fail(431, f"a request head of more than {MAX_REQUEST_HEAD_BYTES} bytes")

    def _fail(self, status: int, message: str) -> None:
        self.closed = True
        if self.error is None:
            self.error = BadRequest(status, message)

    def next_head(self) -> Request | None:
        """The next request whose head is read, if one is."""
        return self._heads.popleft() if self._heads else None

    # httptools' callbacks

    def on_message_begin(self) -> None:
        self._url.clear()
        self._headers = []

    def on_url(self, url: bytes) -> None:
        self._url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        self._headers.append((name.lower(), value))

    def on_headers_complete(self) -> None:
        self._head_bytes = len(self._url) + sum(len(n) + len(v) + 4 for n, v in self._headers)
        self._check_head_size()
        if self.closed:
            return  # nothing from here on is taken
        self._head_bytes = 0
        upgrade = self._parser.should_upgrade()
        request = Request(
            method=self._parser.get_method(),
            target=bytes(self._url),
            headers=self._headers,
            keep_alive=self._parser.should_keep_alive() and not upgrade,
            upgrade=upgrade,
            complete=upgrade,
        )
        self._reading = request
        self._heads.append(request)

    def on_body(self, body: bytes) -> None:
        if self._reading is not None:
            self._reading.body += body

    def on_message_complete(self) -> None:
        if self._reading is not None:
            self._reading.complete = True
            self._reading = None


class BodyTooLarge(BadRequest):
    """A request body larger than the caller allows."""

    def __init__(self, limit: int) -> None:
        super().__init__(413, f"a request body of more than {limit} bytes")


async def serve_guarded(
    stream: S, serve: Callable[[S], Awaitable[None]], logger: logging.Logger
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


async def read_request(
    stream: trio.abc.Stream, connection: Connection, received: bytearray
) -> Request | None:
    """The next request head, or None if the client closed first. Raises `BadRequest`."""
    while (request := connection.next_head()) is None:
        if connection.error is not None:
            raise connection.error
        if connection.closed:
            return None
        data = bytes(await stream.receive_some(RECEIVE_BYTES))
        received += data
        connection.feed(data)
    return request


async def read_request_head(
    stream: trio.abc.Stream, connection: Connection, received: bytearray
) -> Request | None:
    """The request head within `REQUEST_HEAD_TIMEOUT_S`, or None: the client closed, was too
    slow, or sent a malformed head (answered with a 4xx naming what is wrong)."""
    try:
        with trio.move_on_after(REQUEST_HEAD_TIMEOUT_S):
            return await read_request(stream, connection, received)
        return None
    except BadRequest as error:
        with trio.move_on_after(RESPONSE_TIMEOUT_S):
            await respond(stream, error.status, f"bad request: {error}\n")
        return None


async def accept_websocket(
    stream: trio.abc.Stream,
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
    stream: trio.abc.Stream,
    status: int,
    body: bytes | str,
    content_type: str = "text/plain; charset=utf-8",
    *,
    head: bool = False,
    extra: list[tuple[str, str]] | None = None,
) -> None:
    """Send one whole response (headers only for HEAD); the connection is done after it.
    `extra`: more headers (a `cache-control` one replaces the default, `no-store`)."""
    await _send_response(stream, status, body, content_type, head=head, extra=extra)
    await close_gently(stream)


async def respond_keeping(
    stream: trio.abc.Stream,
    connection: Connection,
    request: Request,
    status: int,
    body: bytes | str,
    *,
    content_type: str,
    keep: bool = True,
    extra: list[tuple[str, str]] | None = None,
) -> bool:
    """Send one whole response to `request` (headers only for HEAD; `extra` as `respond`'s)
    and keep the connection for the client's next request, if HTTP/1.1 lets it (the client
    did not ask to close, and its request was read to the end) and `keep` (the server's
    wish): True. Else close it, as `respond`."""
    keep = keep and request.keep_alive and request.complete and not connection.closed
    head = request.method == b"HEAD"
    await _send_response(stream, status, body, content_type, head=head, extra=extra, keep=keep)
    if not keep:
        await close_gently(stream)
    return keep


async def _send_response(
    stream: trio.abc.Stream,
    status: int,
    body: bytes | str,
    content_type: str,
    *,
    head: bool = False,
    extra: list[tuple[str, str]] | None = None,
    keep: bool = False,
) -> None:
    data = body.encode() if isinstance(body, str) else body
    reason = http.HTTPStatus(status).phrase if status in _KNOWN_STATUSES else ""
    headers = [("cache-control", "no-store")] if extra is None else extra
    if all(name != "cache-control" for name, _ in headers):
        headers = [("cache-control", "no-store"), *headers]
    lines = [
        f"HTTP/1.1 {status} {reason}",
        f"content-type: {content_type}",
        f"content-length: {len(data)}",
        *(() if keep else ("connection: close",)),
        *(f"{name}: {value}" for name, value in headers),
    ]
    out = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
    await stream.send_all(out if head or not data else out + data)


async def read_body(
    stream: trio.abc.Stream, connection: Connection, request: Request, limit: int
) -> bytes:
    """The whole body of `request`, the request just read (cut short if the client
    closed); `BodyTooLarge` above `limit` bytes, `BadRequest` if its framing is broken."""
    while True:
        if len(request.body) > limit:
            raise BodyTooLarge(limit)
        if request.complete:
            return bytes(request.body)
        if connection.error is not None:
            raise connection.error
        if connection.closed:
            return bytes(request.body)
        connection.feed(bytes(await stream.receive_some(RECEIVE_BYTES)))


async def close_gently(stream: trio.abc.Stream) -> None:
    """Half-close (where the stream can: TLS cannot), then read (briefly) what the client
    still sends before the socket closes.

    Closing a socket that has unread input makes the kernel answer with a
    reset, which can destroy the response before the client reads it (after a
    request head that was too large, or a body that was never read).
    """
    with trio.move_on_after(LINGER_S):
        if isinstance(stream, trio.abc.HalfCloseableStream):
            await stream.send_eof()
        discarded = 0
        while discarded < LINGER_BYTES and (chunk := await stream.receive_some(RECEIVE_BYTES)):
            discarded += len(chunk)


def header(request: Request, name: bytes) -> str:
    values = [value.decode("latin-1") for key, value in request.headers if key == name]
    return ",".join(values)


def is_websocket_upgrade(request: Request) -> bool:
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

    def __init__(self, stream: trio.abc.Stream, prefix: bytes) -> None:
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
