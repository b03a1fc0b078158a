"""The HTTP/2 side of the gRPC port: what grpclib leaves to chance when a peer sends
what no gRPC client would.

grpclib's server trusts its peer in a few places. Each is guarded here, and each
refusal is a precise status with a message (and a WARNING line when the peer broke
the protocol), never UNKNOWN, a traceback, or no answer at all:

* `serve_request` takes the place of grpclib's `request_handler` (and keeps its
  structure) for every request, and checks the headers before using them: a
  request without `:method` or `:path` (grpclib: a KeyError and no answer), a
  `grpc-timeout` that is not 1 to 8 digits and a unit (UNKNOWN), a `grpc-encoding`
  other than identity (UNKNOWN at the first compressed message), a `-bin` metadata
  value that is not base64 (a traceback and no answer). A deadline that passed
  before the handler started is DEADLINE_EXCEEDED (grpclib: UNKNOWN and a traceback,
  for any deadline shorter than the time from the request's arrival to its task).
* `RequestStream` refuses a call that takes one request and ends without it
  (grpclib handed the method None: its health service asserted on it).
* `MessageFraming` checks the 5-byte prefix of each request message as it is read:
  a compressed flag, a flag that is neither 0 nor 1 and a message cut short are
  INVALID_ARGUMENT, and a length over the size limit is RESOURCE_EXHAUSTED before any
  of its bytes are read (grpclib read whatever length a prefix announced into memory
  before the codec could refuse it).
* `RequestHandler` gives a request's unread bytes back to its connection however its
  task ends (grpclib kept them for good when the client reset the stream before the
  task first ran: a few large uploads abandoned at once stalled the connection).
* `Http2Protocol` closes a connection whose bytes are not HTTP/2 it can read with a
  WARNING naming the peer (a header value that is not ASCII raised out of the
  transport), and ignores frames of a type HTTP/2 does not define, as RFC 9113
  section 4.1 says (grpclib raised NotImplementedError out of the transport).

Asyncio side only (the gRPC loop). Knows nothing of the worker's service.
"""

from __future__ import annotations

import binascii
import contextlib
import logging
import re
from collections.abc import Callable, Mapping
from typing import Any, Final

import attrs
import h2.events
import h2.exceptions
from grpclib.const import Handler as MethodHandler
from grpclib.const import Status
from grpclib.encoding.base import GRPC_CONTENT_TYPE
from grpclib.exceptions import GRPCError, ProtocolError, StreamTerminatedError
from grpclib.metadata import Deadline, decode_bin_value, decode_metadata, encode_grpc_message
from grpclib.protocol import Buffer, H2Protocol
from grpclib.protocol import Stream as H2Stream
from grpclib.server import Handler, Stream
from grpclib.utils import DeadlineWrapper, Wrapper

from blockx.errors import shown

logger = logging.getLogger("blockx.api")

PREFIX_BYTES: Final = 5
"""A gRPC message on the wire: a compressed flag byte and a 4-byte length, then the message."""
_TIMEOUT: Final = re.compile(r"[0-9]{1,8}[HMSmun]")
"""A `grpc-timeout` value as the gRPC HTTP/2 protocol defines it."""
_CONTENT_TYPE: Final = re.compile(re.escape(GRPC_CONTENT_TYPE) + r"(\+proto)?")
_IGNORED_EVENTS: Final = (h2.events.UnknownFrameReceived, h2.events.AlternativeServiceAvailable)
"""What h2 reports that grpclib has no processor for, and that a server may ignore."""

REASON_CHARS: Final = 200
"""How much of h2's complaint about a connection's bytes a log line quotes."""

Headers = list[tuple[str, str]]


@attrs.frozen(kw_only=True)
class Refusal:
    """The answer to a request that is not served: its HTTP and gRPC status and why."""

    http_status: int = 200
    status: Status
    message: str
    headers: tuple[tuple[str, str], ...] = ()
    broke_protocol: bool = True
    """Whether the peer sent what no gRPC client would (logged as a WARNING)."""


def refusal_of(headers: Headers, methods: Mapping[str, MethodHandler]) -> Refusal | None:
    """Why the request with `headers` cannot be served, or None: in grpclib's order of
    checks, then the ones grpclib does not make."""
    head = dict(headers)
    method = head.get(":method")
    if method is None or ":path" not in head:
        missing = ":method" if method is None else ":path"
        return Refusal(
            http_status=400,
            status=Status.INVALID_ARGUMENT,
            message=f"the request has no {missing} header",
        )
    if method != "POST":
        return Refusal(
            http_status=405,
            status=Status.INVALID_ARGUMENT,
            message=f"method {shown(method)} is not POST: this port serves gRPC only",
        )
    content_type = head.get("content-type", "")
    if not _CONTENT_TYPE.fullmatch(content_type):
        return Refusal(
            http_status=415,
            status=Status.INVALID_ARGUMENT,
            message=f"content-type {shown(content_type)} is not {GRPC_CONTENT_TYPE}"
            f" or {GRPC_CONTENT_TYPE}+proto",
        )
    if head.get("te") != "trailers":
        return Refusal(
            http_status=400,
            status=Status.INVALID_ARGUMENT,
            message='the request lacks the header "te: trailers" that gRPC requires',
        )
    path = head[":path"]
    if path not in methods:
        return Refusal(
            status=Status.UNIMPLEMENTED,
            message=f"no method {shown(path)} on this port",
            broke_protocol=False,
        )
    return _header_refusal(headers)


def _header_refusal(headers: Headers) -> Refusal | None:
    """The checks of a gRPC request's own headers that grpclib leaves out."""
    for name, value in headers:
        if name == "grpc-timeout" and not _TIMEOUT.fullmatch(value):
            return Refusal(
                status=Status.INVALID_ARGUMENT,
                message=f"grpc-timeout {shown(value)} is not a gRPC timeout: "
                "1 to 8 digits and a unit (H, M, S, m, u or n)",
            )
        if name == "grpc-encoding" and value != "identity":
            return Refusal(
                status=Status.UNIMPLEMENTED,
                message=f"grpc-encoding {shown(value)} is not supported: "
                "this worker takes uncompressed messages only",
                headers=(("grpc-accept-encoding", "identity"),),
            )
        if name.endswith("-bin"):
            try:
                decode_bin_value(value.encode("ascii"))
            except (binascii.Error, ValueError):
                return Refusal(
                    status=Status.INVALID_ARGUMENT,
                    message=f"metadata {shown(name)} is not base64, as a -bin value must be",
                )
    return None


async def refuse(h2_stream: H2Stream, refusal: Refusal) -> None:
    """Answer the request on `h2_stream` with `refusal` alone (a trailers-only response)."""
    if refusal.broke_protocol:
        peer = h2_stream.connection.get_peer().addr()
        logger.warning(
            "request from %s refused (%s): %s", _address(peer), refusal.status.name, refusal.message
        )
    headers = [(":status", str(refusal.http_status))]
    if refusal.http_status == 200:
        headers.append(("content-type", f"{GRPC_CONTENT_TYPE}+proto"))
    headers += [
        ("grpc-status", str(refusal.status.value)),
        ("grpc-message", encode_grpc_message(refusal.message)),
        *refusal.headers,
    ]
    # The peer may have reset the stream or closed the connection meanwhile: then
    # nobody is left to answer.
    with contextlib.suppress(h2.exceptions.StreamClosedError, ConnectionError):
        await h2_stream.send_headers(headers, end_stream=True)
        if h2_stream.closable:
            h2_stream.reset_nowait()


def _address(peer: tuple[str, int] | None) -> str:
    return "an unknown peer" if peer is None else f"{peer[0]}:{peer[1]}"


class MessageFraming(Buffer):
    """A request stream's buffer that checks each message's prefix as it is read.

    grpclib reads a request message as two reads, its 5-byte prefix and then the
    length that prefix announces; this buffer refuses a bad prefix before the second
    read asks for (and acknowledges to the peer) the bytes it announced.
    """

    def __init__(self, ack: Callable[[int], None], *, max_message_bytes: int) -> None:
        super().__init__(ack)
        self._max_message_bytes = max_message_bytes
        self._prefix_next = True
        self._messages = 0

    async def read(self, size: int) -> bytes:
        try:
            data = await super().read(size)
        except AssertionError:  # grpclib's Buffer: the request ended before `size` bytes
            where = (
                f"prefix of message {self._messages + 1}"
                if self._prefix_next
                else f"body of message {self._messages}"
            )
            raise _malformed(f"the request ends inside the {where}") from None
        if not self._prefix_next:
            self._prefix_next = True
        elif data:  # (none: the request has no more messages)
            self._messages += 1
            self._prefix_next = False
            self._check_prefix(data)
        return data

    def _check_prefix(self, prefix: bytes) -> None:
        flag, length = prefix[0], int.from_bytes(prefix[1:PREFIX_BYTES], "big")
        if flag == 1:
            raise _malformed(
                f"message {self._messages} is marked compressed, "
                "but the request declares no grpc-encoding"
            )
        if flag != 0:
            raise _malformed(f"message {self._messages} has compressed flag {flag}: 0 or 1 only")
        if length > self._max_message_bytes:
            raise GRPCError(
                Status.RESOURCE_EXHAUSTED,
                f"request of {length} bytes exceeds grpcMaxMessageBytes "
                f"({self._max_message_bytes})",
            )


def _malformed(problem: str) -> GRPCError:
    logger.warning("malformed request refused: %s", problem)
    return GRPCError(Status.INVALID_ARGUMENT, f"malformed request: {problem}")


class RequestStream(Stream[Any, Any]):
    """grpclib's stream of one call: one that takes a single request and ends without it
    is INVALID_ARGUMENT at the read that finds it missing."""

    def __init__(self, *args: Any, single_request: bool, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._single_request = single_request
        self._received = False

    async def recv_message(self) -> Any:
        message = await super().recv_message()
        if message is None and self._single_request and not self._received:
            raise GRPCError(Status.INVALID_ARGUMENT, "the call ended without its request message")
        self._received = True
        return message


class RequestHandler(Handler):
    """grpclib's handler of a connection's requests, serving each with `serve_request`."""

    def __init__(self, *args: Any, max_message_bytes: int) -> None:
        super().__init__(*args)
        self.max_message_bytes = max_message_bytes

    def accept(self, stream: H2Stream, headers: Headers, release_stream: Callable[[], Any]) -> None:
        self.__gc_step__()
        # Before any of the request's data arrives (h2 reports it after this event).
        # The acknowledgement is the one grpclib gave the stream's own buffer.
        stream.buffer = MessageFraming(
            stream.buffer._ack_callback, max_message_bytes=self.max_message_bytes
        )
        task = self.loop.create_task(serve_request(self, stream, headers))
        # Released when the task is done, however: grpclib released it in the task's
        # `finally`, which a task cancelled before its first step (its client reset the
        # stream at once) never runs. The request's unread bytes then never went back
        # to the connection's flow-control window, and a few such requests stalled it.
        task.add_done_callback(lambda _: release_stream())
        self._tasks[stream] = task


async def serve_request(handler: Handler, h2_stream: H2Stream, headers: Headers) -> None:
    """Serve one request: refuse it (`refusal_of`) or run its method, as grpclib does."""
    try:
        refusal = refusal_of(headers, handler.mapping)
        if refusal is None:
            await _run_method(handler, h2_stream, headers)
        else:
            await refuse(h2_stream, refusal)
    except ProtocolError:  # grpclib's: a handler broke gRPC's rules (a bug of ours)
        logger.exception("a request's handler broke the gRPC protocol")
    except Exception:
        logger.exception("serving a request failed")


async def _run_method(handler: Handler, h2_stream: H2Stream, headers: Headers) -> None:
    head = dict(headers)
    method_name = head[":path"]
    method = handler.mapping[method_name]
    deadline = Deadline.from_headers(headers)
    user_agent = head.get("user-agent")
    async with RequestStream(
        h2_stream,
        method_name,
        method.cardinality,
        method.request_type,
        method.reply_type,
        single_request=not method.cardinality.client_streaming,
        codec=handler.codec,
        status_details_codec=handler.status_details_codec,
        dispatch=handler.dispatch,
        deadline=deadline,
        user_agent=user_agent,
    ) as stream:
        wrapper: Wrapper
        expiry: contextlib.AbstractContextManager[None]
        if deadline is None:
            wrapper = h2_stream.wrapper = Wrapper()
            expiry = contextlib.nullcontext()
        else:
            wrapper = h2_stream.wrapper = deadline_wrapper = DeadlineWrapper()
            expiry = deadline_wrapper.start(deadline)
        try:
            with expiry, wrapper:
                stream.metadata, method_func = await handler.dispatch.recv_request(
                    decode_metadata(headers),
                    method.func,
                    method_name=method_name,
                    deadline=deadline,
                    content_type=head["content-type"],
                    user_agent=user_agent,
                    peer=stream.peer,
                )
                await method_func(stream)
        except TimeoutError:
            # The deadline passed while the method ran (the wrapper cancelled it), or
            # before it started (`DeadlineWrapper.start` raised).
            expired = deadline is not None and (wrapper.cancelled or not deadline.time_remaining())
            if not expired:
                logger.exception("%s timed out before its deadline", method_name)
                raise
            if wrapper.cancel_failed:
                logger.exception("%s did not stop at its deadline", method_name)
            raise GRPCError(Status.DEADLINE_EXCEEDED, "the call's deadline passed") from None
        except (GRPCError, StreamTerminatedError):  # (the client reset the stream: gone)
            raise
        except Exception:
            logger.exception("%s raised", method_name)
            raise


class Http2Protocol(H2Protocol):
    """grpclib's protocol of one connection, closing it on bytes it cannot read."""

    def data_received(self, data: bytes) -> None:
        try:
            events = self.connection.feed(data)
        except Exception as error:  # h2 parses only what the peer sent: the peer's fault
            self._close(f"{type(error).__name__}: {error}")
            return
        self.connection.flush()
        for event in events:
            if not isinstance(event, _IGNORED_EVENTS):
                self.processor.process(event)
        self.connection.flush()

    def _close(self, reason: str) -> None:
        peer = self.connection.get_peer().addr()
        logger.warning(
            "connection from %s closed: it sent what is not HTTP/2 (%s)",
            _address(peer),
            reason[:REASON_CHARS],
        )
        self.connection.flush()  # what h2 has to say about it (a GOAWAY) goes first
        self.processor.close(reason)
