"""Every override of grpclib: the one module of blockx that subclasses, restates, patches or
reaches into grpclib's internals. It restates grpclib 0.4.9, the version pyproject.toml pins.

grpclib's server trusts its peer in a few places. Each is guarded here, and each
refusal is a precise status with a message (and a WARNING line when the peer broke
the protocol), never UNKNOWN, a traceback, or no answer at all:

* `serve_request` takes the place of grpclib's `request_handler` (and keeps its
  structure) for every request, and checks the headers before using them
  (`_refusals.refusal_of`, answered by `refuse` in place of grpclib's `_abort`). A
  deadline that passed before the handler started is DEADLINE_EXCEEDED (grpclib:
  UNKNOWN and a traceback, for any deadline shorter than the time from the request's
  arrival to its task).
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
  transport), ignores frames of a type HTTP/2 does not define, as RFC 9113 section
  4.1 says (grpclib raised NotImplementedError out of the transport), and corks its
  writes (`_CorkedTransport`).
* `Http2Protocol` also holds each connection to its `ConnectionLimits` (grpclib had
  none: 20,000 streams opened and reset at once from one connection were all served,
  for 1.4 s of CPU): its streams (advertised in SETTINGS_MAX_CONCURRENT_STREAMS; one
  beyond is refused with RST_STREAM REFUSED_STREAM, a stream error as RFC 9113 section
  5.1.2 has it, where h2's own check ended the connection), the connections open
  (one beyond is closed at once with GOAWAY), idleness (no open stream for the idle
  timeout: GOAWAY NO_ERROR) and rapid resets (more streams reset by the client in a
  window than allowed: GOAWAY ENHANCE_YOUR_CALM, as for CVE-2023-44487). Each check
  is O(1) per event, and each close is told to `on_closed` ("refused", "abuse",
  "idle"). It restates grpclib's `connection_made` to make the h2 connection with
  `_StreamCapSettings`.
* `GuardedServer` serves each connection with these, and can abort the connections
  still open; `HealthService` answers a check of an unknown service in words.

Private names of grpclib touched here (the test tests/core/test_grpclib_fence.py checks
this list against the code, and that no other module of blockx touches one):

* `Server._protocol_factory` (GuardedServer): overridden: connections get our handler, protocol.
* `Server._mapping` (GuardedServer._protocol_factory): read, as grpclib's factory reads it.
* `Server._codec` (GuardedServer._protocol_factory): read, as grpclib's factory reads it.
* `Server._status_details_codec` (GuardedServer._protocol_factory): read, as grpclib's does.
* `Server._handlers` (GuardedServer._protocol_factory): added to, so `close` finds the handler.
* `Server._config` (GuardedServer._protocol_factory): read, as grpclib's factory reads it.
* `Server._h2_config` (GuardedServer._protocol_factory): read, as grpclib's factory reads it.
* `Server.__dispatch__` (GuardedServer._protocol_factory): read, so events reach listeners.
* `_GC.__gc_step__` (GuardedServer, RequestHandler): called, as grpclib's own methods call it.
* `grpclib.protocol._set_nodelay` (Http2Protocol.connection_made): called, as grpclib's is.
* `Handler._tasks` (RequestHandler.accept): written, so `cancel` and `close` find the task.
* `Buffer._ack_callback` (RequestHandler.accept): read, so MessageFraming acks as grpclib's.
* `Health._checks` (HealthService.Check): read, the checks grpclib's `__init__` arranged.
* `CheckBase.__check__` (HealthService.Check): called, as grpclib's `Check` calls it.
* `Configuration._keepalive_time` (server_configuration): set, from grpcKeepaliveTimeMs.
* `Configuration._keepalive_timeout` (server_configuration): set, from grpcKeepaliveTimeoutMs.
* `Configuration._keepalive_permit_without_calls` (server_configuration): set: pings, no calls.
* `Configuration._http2_max_pings_without_data` (server_configuration): set to 0: no limit.
* `grpclib.reflection._deprecated` (reflection_services): imported, for v1alpha reflection.
* `ServerReflection._service_names` (reflection_services): passed, as `extend` passes it.
* `ServerReflection._pool` (reflection_services): passed: the pool our messages are in.

`UPSTREAM_DIGESTS` holds a digest of the source of each upstream function or class
this module restates, overrides or relies on the inside of; the same test fails when
the installed grpclib's differs. Review the override, then update the digest.

One override of grpclib lives outside this module, on the client side:
`blockx.net.channels` overrides `Channel._protocol_factory` to note whether a server
was heard and to abort a closed channel's transport. blockx.net cannot import this
module (blockx.api imports blockx.net), so the same test allows that one name there
and holds it to a digest of its own.

Asyncio side only (the gRPC loop). Knows nothing of the worker's service; must never
be imported from outside `blockx.api`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Collection, Mapping
from typing import Any, Final, cast

import attrs
import h2.connection
import h2.events
import h2.exceptions
import h2.settings
from grpclib.config import Configuration
from grpclib.const import Status
from grpclib.encoding.base import GRPC_CONTENT_TYPE
from grpclib.exceptions import GRPCError, ProtocolError, StreamTerminatedError
from grpclib.health.service import Health
from grpclib.health.v1.health_pb2 import HealthCheckRequest, HealthCheckResponse
from grpclib.metadata import Deadline, decode_metadata, encode_grpc_message
from grpclib.protocol import Buffer, Connection, EventsProcessor, H2Protocol, _set_nodelay
from grpclib.protocol import Stream as H2Stream

# grpclib keeps its v1alpha service here: it is what its own (public)
# `ServerReflection.extend` adds beside v1, but `extend` cannot list reflection.
from grpclib.reflection._deprecated import ServerReflection as ServerReflectionV1Alpha
from grpclib.reflection.service import ServerReflection
from grpclib.server import Handler, Server, Stream
from grpclib.utils import DeadlineWrapper, Wrapper
from h2.errors import ErrorCodes
from h2.settings import SettingCodes

from blockx.api._refusals import Headers, Refusal, refusal_of
from blockx.errors import shown

logger = logging.getLogger("blockx.api")

UPSTREAM_VERSION: Final = "0.4.9"
"""The grpclib this module restates; pyproject.toml pins it with ==."""

UPSTREAM_DIGESTS: Final[Mapping[str, str]] = {
    # Restated here in place of grpclib's own (our version keeps its structure).
    "grpclib.server.request_handler": (
        "2dcc6d45dfbe7d0824381608698e12d65d8db56275500411f3b17e6ac41f1c99"
    ),
    "grpclib.server._abort": "36f61b1460c9dab29abf92b16026994842f5aed6806edcf30ecfb68607be6ca8",
    "grpclib.server.Server._protocol_factory": (
        "a5201649d7236a46429cff2f6e4d4b52d9c7b5f10d08e15a69d708a9ae53429d"
    ),
    "grpclib.server.Handler.accept": (
        "e6124ed435d02f389ee1c2fb092c771b993fd01501aba63cc6b9d867ff9f8d2e"
    ),
    "grpclib.protocol.H2Protocol.data_received": (
        "43a344c83ac60bbf76eb6ecc1458f3ace084a84bae90da9154c917767947bc00"
    ),
    "grpclib.protocol.H2Protocol.connection_made": (
        "349133fc183764e5f50e3af9eb61faddb32a8e5ba484fd4d041b7aefdfc0691d"
    ),
    "grpclib.health.service.Health.Check": (
        "44e0718b580bc204f5af1fa231a7e7df94f2221c3c7ae469cf2844adf4f6bc90"
    ),
    # Overridden, calling grpclib's own.
    "grpclib.server.Stream.recv_message": (
        "fbfe65d02d8e8b713252b20dbe3170d63df3924627c5b936ddc505e03123762f"
    ),
    "grpclib.protocol.Buffer.read": (
        "42f3da197a12e619ec84f4ca6822bff7c996242f75ad92032c148d1a5c6ef2e2"
    ),
    "grpclib.protocol.H2Protocol.connection_lost": (
        "212dcc31cc322c9308861eb98231457ec40b0121e23f4ffba86a9d608ffde173"
    ),
    # Where the private names read or set here are made, and the signatures passed on.
    "grpclib.server._GC": "9c23422b51759361a996fa01549cee24c2265d14233ae883255041de8a6ef95f",
    "grpclib.server.Server.__init__": (
        "2b850678b2378e44b74749fc6eed317e51e9e6ba2189a3371f0618152fc3d740"
    ),
    "grpclib.server.Handler.__init__": (
        "857bd805e85a9ecfd0c0f3bc77e909e7f68ab4317682e3fec660ac774ab850b5"
    ),
    "grpclib.server.Stream.__init__": (
        "78866f62006256a53d9185ca672ae6022dd5d7b24d4e7466935f8cf8ae6b5dcb"
    ),
    "grpclib.protocol.Buffer.__init__": (
        "ddc7bdda4a40c7a1d042d2c4b8116b04dd0a397606c801448852135db57da589"
    ),
    "grpclib.protocol.EventsProcessor.register": (
        "160bb5f3e09c9ef086cde044538e46382989e8c8f011c141d063dfed88b7a8ab"
    ),
    "grpclib.protocol.H2Protocol.__init__": (
        "74f573baf43f5f10ae5c8cde3648800643b96b181b47fc501d37823bbc0edcc3"
    ),
    "grpclib.health.service.Health.__init__": (
        "77720604f85869e448368f3f3dbe47ff26078ad473e8d1f59a99858179aed89d"
    ),
    "grpclib.config.Configuration": (
        "1ef1c8f02e50ed1cb0576fc014ff8215ffe6ea1038a7fecb8e8c39173828d6b9"
    ),
    "grpclib.reflection.service.ServerReflection.__init__": (
        "2f9ba8b45b982c6c78d5c92020c419e4c9d435a4382fad79ab666fda1c184d00"
    ),
    "grpclib.reflection._deprecated.ServerReflection.__init__": (
        "2f9ba8b45b982c6c78d5c92020c419e4c9d435a4382fad79ab666fda1c184d00"
    ),
}
"""sha256 of `inspect.getsource` of each upstream object, as grpclib `UPSTREAM_VERSION` has it."""

PREFIX_BYTES: Final = 5
"""A gRPC message on the wire: a compressed flag byte and a 4-byte length, then the message."""
REASON_CHARS: Final = 200
"""How much of h2's complaint about a connection's bytes a log line quotes."""
_IGNORED_EVENTS: Final = (h2.events.UnknownFrameReceived, h2.events.AlternativeServiceAvailable)
"""What h2 reports that grpclib has no processor for, and that a server may ignore."""


ConnectionObserver = Callable[[str], None]
"""Told of each connection the server closed of its own accord: "refused" (one
connection too many), "abuse" (too many streams reset) or "idle"."""


@attrs.frozen(kw_only=True)
class ConnectionLimits:
    """What one connection may do, and how many may be open (the `grpc*` settings)."""

    max_streams: int
    """Streams open at once on one connection (grpcMaxConcurrentStreams)."""
    max_connections: int
    """Connections open at once (grpcMaxConnections)."""
    idle_timeout_s: float
    """With no open stream for this long, a connection is closed (grpcIdleTimeoutMs)."""
    max_resets: int
    """Streams the client may reset within `reset_window_s` (grpcMaxResets)."""
    reset_window_s: float
    """grpcResetWindowMs."""


def server_configuration(*, keepalive_time_s: float, keepalive_timeout_s: float) -> Configuration:
    """grpclib's server settings: a keepalive ping every `keepalive_time_s`, answered within
    `keepalive_timeout_s`, and clients' pings taken with or without calls open (grpclib
    names these settings as private: experimental)."""
    return Configuration(
        _keepalive_time=keepalive_time_s,
        _keepalive_timeout=keepalive_timeout_s,
        _keepalive_permit_without_calls=True,
        _http2_max_pings_without_data=0,
    )


def reflection_services(service_names: Collection[str], pool: Any) -> list[Any]:
    """Server reflection listing `service_names` from the descriptor `pool`, in both
    versions (v1, and v1alpha: the official Python reflection client and many GUI
    clients speak only v1alpha)."""
    return [
        ServerReflection(_service_names=service_names, _pool=pool),
        ServerReflectionV1Alpha(_service_names=service_names, _pool=pool),
    ]


class HealthService(Health):
    """grpclib's health service; a check of a service it does not know says so in words
    (grpclib's NOT_FOUND came without a message)."""

    async def Check(self, stream: Stream[HealthCheckRequest, HealthCheckResponse]) -> None:
        request = await stream.recv_message()  # never None: see `RequestStream`
        assert request is not None
        checks = self._checks.get(request.service)
        if checks is None:
            known = ", ".join(repr(name) for name in sorted(self._checks))
            raise GRPCError(
                Status.NOT_FOUND,
                f"no health status for service {shown(request.service)}; known: {known}",
            )
        statuses = {await check.__check__() for check in checks}
        if statuses == {True}:
            status = HealthCheckResponse.SERVING
        elif statuses == {None}:  # (grpclib's reading of checks that never ran)
            status = HealthCheckResponse.UNKNOWN
        else:
            status = HealthCheckResponse.NOT_SERVING
        await stream.send_message(HealthCheckResponse(status=status))


class GuardedServer(Server):
    """grpclib's server, serving each connection with `RequestHandler` and `Http2Protocol`."""

    def __init__(
        self,
        *args: Any,
        max_message_bytes: int,
        limits: ConnectionLimits,
        on_closed: ConnectionObserver,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        self._max_message_bytes = max_message_bytes
        self._limits = limits
        self._on_closed = on_closed
        self._transports: set[asyncio.Transport] = set()
        """Connections open now: grpclib's `close` leaves them to their clients."""

    def abort_connections(self) -> None:
        """End every connection still open, so that the loop can close after the grace."""
        for transport in list(self._transports):
            transport.abort()

    def _protocol_factory(self) -> H2Protocol:
        # grpclib's own factory, with our handler and protocol in place of its own.
        self.__gc_step__()
        handler = RequestHandler(
            self._mapping,
            self._codec,
            self._status_details_codec,
            self.__dispatch__,
            max_message_bytes=self._max_message_bytes,
        )
        self._handlers.add(handler)
        return Http2Protocol(
            handler,
            self._config,
            self._h2_config,
            open_transports=self._transports,
            limits=self._limits,
            on_closed=self._on_closed,
        )


class _CorkedTransport:
    """A connection's transport whose writes within one step of the loop go out as one send.

    grpclib writes each HTTP/2 frame batch as soon as it has it: a unary reply
    is three sends (headers, message, trailers), and a stream's replies one
    each. Held until the loop's next step, they leave in one system call.
    """

    def __init__(self, transport: asyncio.Transport) -> None:
        self._transport = transport
        self._held: list[bytes] = []

    def write(self, data: bytes) -> None:
        if not self._held:
            asyncio.get_running_loop().call_soon(self._flush)
        self._held.append(data)

    def _flush(self) -> None:
        if self._held:
            data = b"".join(self._held)
            self._held.clear()
            if not self._transport.is_closing():
                self._transport.write(data)

    def close(self) -> None:
        self._flush()
        self._transport.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


class _StreamCapSettings(h2.settings.Settings):
    """h2's local settings, whose MAX_CONCURRENT_STREAMS h2 itself checks one above the value
    advertised: a stream beyond the value is `Http2Protocol`'s to refuse (REFUSED_STREAM),
    where h2's check ends the whole connection. The protocol counts a stream until its
    handler has stopped, which is seldom before h2 closes it; h2's check stays as a
    backstop."""

    @property
    def max_concurrent_streams(self) -> int:
        return super().max_concurrent_streams + 1

    @max_concurrent_streams.setter
    def max_concurrent_streams(self, value: int) -> None:
        self[SettingCodes.MAX_CONCURRENT_STREAMS] = value


class _ResetWindow:
    """Streams reset by the client in the current window of `window_s` seconds: O(1) a reset."""

    def __init__(self, limit: int, window_s: float) -> None:
        self.limit = limit
        self.window_s = window_s
        self._start = -window_s
        self._count = 0

    def exceeded(self, now: float) -> bool:
        """Count one reset at `now`: is it one more than the window allows?"""
        if now - self._start >= self.window_s:
            self._start, self._count = now, 0
        self._count += 1
        return self._count > self.limit


class Http2Protocol(H2Protocol):
    """grpclib's protocol of one connection: its writes corked, its transport counted in
    `open_transports` while it is open, closed on bytes it cannot read, and held to its
    `limits` (see the module docstring)."""

    def __init__(
        self,
        *args: Any,
        open_transports: set[asyncio.Transport],
        limits: ConnectionLimits,
        on_closed: ConnectionObserver,
    ) -> None:
        super().__init__(*args)
        self._open_transports = open_transports
        self._raw_transport: asyncio.Transport | None = None
        self._limits = limits
        self._on_closed = on_closed
        self._resets = _ResetWindow(limits.max_resets, limits.reset_window_s)
        self._clock: Callable[[], float] = time.monotonic
        """The loop's clock (set once connected): the one its timers keep."""
        self._idle_since: float | None = None
        """When its last stream ended (or it was admitted); None while a stream is open."""
        self._idle_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # grpclib's own, with the h2 connection advertising (and `_StreamCapSettings`
        # leaving to us) the stream limit.
        raw = self._raw_transport = cast(asyncio.Transport, transport)  # (a stream server's)
        sock = raw.get_extra_info("socket")
        if sock is not None:
            _set_nodelay(sock)
        h2_conn = self.h2 = h2.connection.H2Connection(config=self.h2_config)
        h2_conn.local_settings = _StreamCapSettings(
            client=False,
            initial_values={
                SettingCodes.MAX_CONCURRENT_STREAMS: self._limits.max_streams,
                SettingCodes.MAX_HEADER_LIST_SIZE: h2_conn.DEFAULT_MAX_HEADER_LIST_SIZE,
            },
        )
        h2_conn.initiate_connection()
        initial = h2_conn.local_settings.initial_window_size
        conn_delta = self.config.http2_connection_window_size - initial
        stream_delta = self.config.http2_stream_window_size - initial
        if conn_delta:
            h2_conn.increment_flow_control_window(conn_delta)
        if stream_delta:
            h2_conn.update_settings(
                {SettingCodes.INITIAL_WINDOW_SIZE: self.config.http2_stream_window_size}
            )
        self.connection = Connection(h2_conn, _CorkedTransport(raw), config=self.config)  # type: ignore[arg-type]
        self.connection.flush()
        self.connection.initialize()
        self.processor = EventsProcessor(self.handler, self.connection)
        self._admit(raw)

    def _admit(self, raw: asyncio.Transport) -> None:
        """Count the connection in, or close it at once if it is one too many."""
        open_now = len(self._open_transports)
        if open_now >= self._limits.max_connections:
            self._close_for(
                "refused",
                ErrorCodes.NO_ERROR,
                f"{open_now} connections are open already (grpcMaxConnections)",
            )
            return
        self._open_transports.add(raw)
        cast(RequestHandler, self.handler).on_released = self._stream_released
        loop = asyncio.get_running_loop()
        self._clock = loop.time
        self._idle_since = loop.time()
        self._idle_timer = loop.call_later(self._limits.idle_timeout_s, self._check_idle)

    def connection_lost(self, exc: BaseException | None) -> None:
        if self._raw_transport is not None:
            self._open_transports.discard(self._raw_transport)
        if self._idle_timer is not None:
            self._idle_timer.cancel()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        try:
            events = self.connection.feed(data)
        except Exception as error:  # h2 parses only what the peer sent: the peer's fault
            self._close(f"{type(error).__name__}: {error}")
            return
        self.connection.flush()
        for event in events:
            if (
                isinstance(event, h2.events.StreamReset)
                and event.remote_reset
                and self._resets.exceeded(self._clock())
            ):
                self._close_for(
                    "abuse",
                    ErrorCodes.ENHANCE_YOUR_CALM,
                    f"it reset more than {self._limits.max_resets} streams within "
                    f"{self._limits.reset_window_s:g} s (grpcMaxResets)",
                )
                return
            if self._wanted(event):
                self.processor.process(event)
        self.connection.flush()

    def _wanted(self, event: h2.events.Event) -> bool:
        """Whether grpclib is to process `event`: not one it has no processor for, nor
        a request beyond the connection's stream limit (refused here)."""
        if isinstance(event, _IGNORED_EVENTS):
            return False
        if isinstance(event, h2.events.RequestReceived):
            if len(self.processor.streams) >= self._limits.max_streams:
                # (The client may have reset it in the same read: h2 has closed it then.)
                with contextlib.suppress(h2.exceptions.NoSuchStreamError):
                    self.h2.reset_stream(event.stream_id, ErrorCodes.REFUSED_STREAM)
                return False
            self._idle_since = None
        return True

    def _stream_released(self) -> None:
        if not self.processor.streams:
            self._idle_since = self._clock()

    def _check_idle(self) -> None:
        timeout_s = self._limits.idle_timeout_s
        idle_s = 0.0 if self._idle_since is None else self._clock() - self._idle_since
        if idle_s >= timeout_s:
            self._idle_timer = None
            self._close_for("idle", ErrorCodes.NO_ERROR, f"no open stream for {idle_s:.1f} s")
            return
        self._idle_timer = asyncio.get_running_loop().call_later(
            timeout_s - idle_s, self._check_idle
        )

    def _close_for(self, reason: str, code: ErrorCodes, why: str) -> None:
        """Close the connection with a GOAWAY of `code`, for `reason` (see
        `ConnectionObserver`), logging `why`: a WARNING but for an idle connection. Nothing
        if it is being closed already (grpclib has let its transport go)."""
        if self._raw_transport is None or self._raw_transport.is_closing():
            return
        level = logging.DEBUG if reason == "idle" else logging.WARNING
        peer = _address(self.connection.get_peer().addr())
        logger.log(level, "connection from %s closed (%s): %s", peer, reason, why)
        self.h2.close_connection(error_code=code, additional_data=reason.encode())
        self.connection.flush()
        self.processor.close(f"connection closed ({reason}): {why}")
        self._on_closed(reason)

    def _close(self, reason: str) -> None:
        peer = self.connection.get_peer().addr()
        logger.warning(
            "connection from %s closed: it sent what is not HTTP/2 (%s)",
            _address(peer),
            reason[:REASON_CHARS],
        )
        self.connection.flush()  # what h2 has to say about it (a GOAWAY) goes first
        self.processor.close(reason)


class RequestHandler(Handler):
    """grpclib's handler of a connection's requests, serving each with `serve_request`."""

    def __init__(self, *args: Any, max_message_bytes: int) -> None:
        super().__init__(*args)
        self.max_message_bytes = max_message_bytes
        self.on_released: Callable[[], None] = lambda: None
        """Called after each stream is released (`Http2Protocol` times idleness by it)."""

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
        task.add_done_callback(lambda _: self._release(release_stream))
        self._tasks[stream] = task

    def _release(self, release_stream: Callable[[], Any]) -> None:
        release_stream()
        self.on_released()


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
