"""HTTP/2 that no gRPC client sends, written with h2 onto a plain socket.

`exchange` opens one connection to a loopback port, may write raw bytes first
(frames h2 itself would never make), sends one request with exactly the headers
and body it is given, and reads until that request's stream ends or is reset, or
the server closes the connection. `RawConnection` speaks one connection frame by
frame, and `reset_flood` makes a rapid-reset attack with it. Blocking: run them in
a thread from Trio.
"""

from __future__ import annotations

import contextlib
import select
import socket
import time
from collections.abc import Callable

import attrs
import h2.config
import h2.connection
import h2.errors
import h2.events

WORKER_SERVICE = "/blockx.worker.v1.WorkerService/"
STREAM_ID = 1


@attrs.frozen(kw_only=True)
class Answer:
    """What came back for the request: its headers and trailers, data, and how it ended."""

    headers: dict[str, str]
    """Every response header and trailer (a later one of the same name wins)."""
    data: bytes = b""
    reset: bool = False
    """The server reset the stream (after answering it, or instead)."""
    closed: bool = False
    """The connection ended (GOAWAY, or end of file) before the stream did."""

    @property
    def grpc_status(self) -> int | None:
        value = self.headers.get("grpc-status")
        return None if value is None else int(value)


def grpc_headers(method: str, **extra: str) -> list[tuple[str, str]]:
    """The headers of a well-formed gRPC request for WorkerService `method`, plus `extra`
    (`grpc_timeout="1S"` is the header `grpc-timeout: 1S`)."""
    return [
        (":method", "POST"),
        (":scheme", "http"),
        (":path", WORKER_SERVICE + method),
        (":authority", "127.0.0.1"),
        ("content-type", "application/grpc"),
        ("te", "trailers"),
        *((name.replace("_", "-"), value) for name, value in extra.items()),
    ]


def framed(message: bytes, *, flag: int = 0, length: int | None = None) -> bytes:
    """`message` as a gRPC request message: its flag, its length (or `length`), itself."""
    announced = len(message) if length is None else length
    return bytes([flag]) + announced.to_bytes(4, "big") + message


def exchange(
    port: int,
    headers: list[tuple[str, str]] | list[tuple[bytes, bytes]],
    body: bytes = b"",
    *,
    before: bytes = b"",
    end_stream: bool = True,
    cancel_at_data: bool = False,
    timeout_s: float = 10.0,
) -> Answer:
    """Send one request on a new connection to `port`; see the module docstring.

    `before` is written right after the connection preface; with `end_stream` False
    the request stays open after `body`, as a client still sending would leave it.
    `cancel_at_data` resets the stream (CANCEL) once the first reply data arrives,
    as a client that gives up does, and returns.
    """
    config = h2.config.H2Configuration(
        client_side=True,
        header_encoding=None,
        validate_outbound_headers=False,
        normalize_outbound_headers=False,
    )
    connection = h2.connection.H2Connection(config)
    connection.initiate_connection()
    with socket.create_connection(("127.0.0.1", port), timeout=timeout_s) as sock:
        sock.sendall(connection.data_to_send() + before)
        connection.send_headers(STREAM_ID, headers, end_stream=not body and end_stream)
        if body:
            connection.send_data(STREAM_ID, body, end_stream=end_stream)
        sock.sendall(connection.data_to_send())
        return _read_answer(sock, connection, stream_id=STREAM_ID, cancel_at_data=cancel_at_data)


def _read_answer(
    sock: socket.socket,
    connection: h2.connection.H2Connection,
    *,
    stream_id: int,
    cancel_at_data: bool,
) -> Answer:
    headers: dict[str, str] = {}
    data = b""
    while True:
        try:
            received = sock.recv(65536)
        except ConnectionResetError:  # closed with our bytes unread: a reset, not an EOF
            received = b""
        if not received:
            return Answer(headers=headers, data=data, closed=True)
        for event in connection.receive_data(received):
            if getattr(event, "stream_id", stream_id) not in (stream_id, 0):
                continue  # (another stream's)
            match event:
                case h2.events.ResponseReceived() | h2.events.TrailersReceived():
                    headers.update(
                        (bytes(name).decode(), bytes(value).decode())
                        for name, value in event.headers or ()
                    )
                case h2.events.DataReceived():
                    data += event.data or b""
                    if cancel_at_data:
                        connection.reset_stream(stream_id, h2.errors.ErrorCodes.CANCEL)
                        sock.sendall(connection.data_to_send())
                        return Answer(headers=headers, data=data, reset=True)
                    connection.acknowledge_received_data(
                        event.flow_controlled_length or 0, stream_id
                    )
                case h2.events.StreamEnded():
                    return Answer(headers=headers, data=data)
                case h2.events.StreamReset():
                    return Answer(headers=headers, data=data, reset=True)
                case h2.events.ConnectionTerminated():
                    return Answer(headers=headers, data=data, closed=True)
        sock.sendall(connection.data_to_send())


def after_abandoned_uploads(
    port: int,
    headers: list[tuple[str, str]],
    body: bytes,
    *,
    uploads: int,
    upload_bytes: int,
    timeout_s: float = 10.0,
) -> Answer:
    """On one connection, `uploads` requests with `headers` that each send up to
    `upload_bytes` of body and reset their stream in the same write (a client giving up
    on an upload at once); then one request with `body`, and its answer.

    The uploads' bytes count against the connection's flow-control window until the
    server gives them back: one that never does stalls the last request.
    """
    config = h2.config.H2Configuration(client_side=True, header_encoding=None)
    connection = h2.connection.H2Connection(config)
    connection.initiate_connection()
    with socket.create_connection(("127.0.0.1", port), timeout=timeout_s) as sock:
        sock.sendall(connection.data_to_send())
        _read_until(sock, connection, lambda: connection.outbound_flow_control_window > 65_535)
        for _ in range(uploads):
            stream_id = connection.get_next_available_stream_id()
            connection.send_headers(stream_id, headers)
            room = min(upload_bytes, connection.local_flow_control_window(stream_id))
            chunk = connection.max_outbound_frame_size
            for start in range(0, room, chunk):
                connection.send_data(stream_id, b"x" * min(chunk, room - start))
            connection.reset_stream(stream_id, h2.errors.ErrorCodes.CANCEL)
            sock.sendall(connection.data_to_send())
        stream_id = connection.get_next_available_stream_id()
        _read_until(sock, connection, lambda: connection.outbound_flow_control_window >= len(body))
        connection.send_headers(stream_id, headers)
        connection.send_data(stream_id, body, end_stream=True)
        sock.sendall(connection.data_to_send())
        return _read_answer(sock, connection, stream_id=stream_id, cancel_at_data=False)


def _read_until(
    sock: socket.socket, connection: h2.connection.H2Connection, done: Callable[[], bool]
) -> None:
    """Read and answer the server's frames until `done()` (socket.timeout if never)."""
    while not done():
        received = sock.recv(65536)
        assert received, "the server closed the connection"
        connection.receive_data(received)
        sock.sendall(connection.data_to_send())


@attrs.frozen(kw_only=True)
class End:
    """How a connection ended, as its client saw it."""

    goaway: int | None
    """The error code of the GOAWAY the server sent; None: it closed without one."""
    debug: bytes = b""
    """The GOAWAY's additional debug data."""


class RawConnection:
    """One HTTP/2 connection to a loopback port, spoken frame by frame with h2 (blocking:
    run it in a thread from Trio). `with RawConnection(port) as raw:` closes it on exit."""

    def __init__(self, port: int, *, timeout_s: float = 10.0) -> None:
        config = h2.config.H2Configuration(
            client_side=True,
            header_encoding=None,
            validate_outbound_headers=False,
            normalize_outbound_headers=False,
        )
        self.h2 = h2.connection.H2Connection(config)
        self.h2.initiate_connection()
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=timeout_s)
        self.flush()

    def __enter__(self) -> RawConnection:
        return self

    def __exit__(self, *_: object) -> None:
        self.sock.close()

    def flush(self) -> None:
        """Write what h2 has to send; ConnectionError if the server closed the connection."""
        self.sock.sendall(self.h2.data_to_send())

    def open_stream(self, headers: list[tuple[str, str]], *, end_stream: bool = False) -> int:
        """A new stream with `headers` (queued: see `flush`); its id."""
        stream_id: int = self.h2.get_next_available_stream_id()
        self.h2.send_headers(stream_id, headers, end_stream=end_stream)
        return stream_id

    def read_until(self, done: Callable[[h2.events.Event], bool]) -> h2.events.Event | End:
        """Read (answering what h2 answers) until an event `done` holds for, which is
        returned, or until the connection ends: how (socket.timeout if neither comes)."""
        while True:
            events = self._receive()
            if isinstance(events, End):
                return events
            for event in events:
                if done(event):
                    return event
                if isinstance(event, h2.events.ConnectionTerminated):
                    return _ended_by(event)
            with contextlib.suppress(ConnectionError):
                self.flush()

    def end_if_any(self) -> End | None:
        """The connection's end if what the server sent so far holds it, without waiting."""
        while select.select([self.sock], [], [], 0)[0]:
            events = self._receive()
            if isinstance(events, End):
                return events
            for event in events:
                if isinstance(event, h2.events.ConnectionTerminated):
                    return _ended_by(event)
        return None

    def _receive(self) -> list[h2.events.Event] | End:
        """The events of one read, or how the connection ended."""
        try:
            received = self.sock.recv(65536)
        except ConnectionResetError:  # closed with our bytes unread, and what came before read
            received = b""
        if not received:
            return End(goaway=None)
        return self.h2.receive_data(received)

    def settle(self) -> int:
        """Wait for the server's SETTINGS (acknowledging them); its MAX_CONCURRENT_STREAMS."""
        event = self.read_until(lambda e: isinstance(e, h2.events.RemoteSettingsChanged))
        assert isinstance(event, h2.events.RemoteSettingsChanged), event
        self.flush()  # the acknowledgement
        return int(self.h2.remote_settings.max_concurrent_streams)

    def ping(self) -> bool:
        """Whether the connection still answers a PING (False: it ended first)."""
        self.h2.ping(b"blockx!!")
        self.flush()
        return not isinstance(
            self.read_until(lambda e: isinstance(e, h2.events.PingAckReceived)), End
        )

    def end(self) -> End:
        """Read until the server ends the connection (writing first what h2 has queued)."""
        with contextlib.suppress(ConnectionError):
            self.flush()
        ended = self.read_until(lambda e: False)
        assert isinstance(ended, End)
        return ended


@attrs.frozen(kw_only=True)
class Flood:
    """What `reset_flood` saw."""

    sent: int
    """Pairs written before the server's close was seen (all of them if it never was)."""
    end: End | None
    """How the server ended the connection; None: it still held it after `linger_s`."""
    seconds: float
    """From the first pair written to the end seen (or to the end of the lingering)."""


def reset_flood(
    port: int, pairs: int, *, batch: int = 100, linger_s: float = 10.0, timeout_s: float = 10.0
) -> Flood:
    """On one connection, `pairs` times HEADERS of a GetWorkerStatus call then RST_STREAM
    of the same stream, written `batch` pairs at a time as fast as they can be made,
    looking between writes (without waiting) for the server's end of the connection;
    then up to `linger_s` waiting for that end. An HTTP/2 rapid-reset attack."""
    headers = grpc_headers("GetWorkerStatus")
    with RawConnection(port, timeout_s=timeout_s) as raw:
        started = time.perf_counter()
        sent, end = 0, None
        while sent < pairs and end is None:
            count = min(batch, pairs - sent)
            for _ in range(count):
                stream_id = raw.open_stream(headers)
                raw.h2.reset_stream(stream_id, h2.errors.ErrorCodes.CANCEL)
            try:
                raw.flush()
            except ConnectionError:  # reset by the server: what it sent before is still to read
                end = raw.end()
                break
            sent += count
            end = raw.end_if_any()
        if end is None:
            raw.sock.settimeout(linger_s)
            with contextlib.suppress(TimeoutError):
                end = raw.end()
        return Flood(sent=sent, end=end, seconds=time.perf_counter() - started)


def _ended_by(goaway: h2.events.ConnectionTerminated) -> End:
    return End(goaway=goaway.error_code, debug=goaway.additional_data or b"")
