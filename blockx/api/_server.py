"""The gRPC server: grpclib on uvloop in a thread of its own, or on trio-asyncio's loop
inside the worker's `trio.run` (`grpcLoop`; see `_bridge` for both and why).

One TCP port serves `WorkerService`, the standard health service and server
reflection in both its versions (v1, and v1alpha: the official Python
reflection client and many GUI clients speak only v1alpha), in plain text or,
given a context (`blockx.net.tls.server_context`), all of them over TLS. Health answers
SERVING for the worker's service (and for "") only while the worker is ready
(an executor is healthy) and not draining.
The maximum message size is enforced both ways, with RESOURCE_EXHAUSTED naming
the size and the limit: by the codec, and for requests already by the length a
message's prefix announces (see `_grpclib`, which guards every request and
connection against what no gRPC client sends).

Uses grpclib through its public API only: what overrides grpclib, or reaches into
its private names, is `_grpclib`'s (the fence).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import socket
import ssl
import time
from collections.abc import Callable
from typing import Any, Final, TypeAlias

import trio
import trio_asyncio
from grpclib.const import Status
from grpclib.encoding.proto import ProtoCodec
from grpclib.events import RecvRequest, listen
from grpclib.exceptions import GRPCError, StreamTerminatedError
from grpclib.health.check import ServiceStatus
from grpclib.server import Stream

from blockx._proto.google_proto_descriptor_pool import default_google_proto_descriptor_pool
from blockx.api._affinity import choose_cpu, pin_loop_threads
from blockx.api._bridge import LoopThread, ThreadBridge, check_arrangement
from blockx.api._convert import Encoded
from blockx.api._grpclib import (
    ConnectionLimits,
    ConnectionObserver,
    GuardedServer,
    HealthService,
    reflection_services,
    server_configuration,
)
from blockx.api._service import WorkerService
from blockx.config import GrpcSection
from blockx.net.auth import check_bearer

logger = logging.getLogger("blockx.api")

SERVICE_NAME = "blockx.worker.v1.WorkerService"
SERVED_SERVICES = (
    SERVICE_NAME,
    "grpc.health.v1.Health",
    "grpc.reflection.v1.ServerReflection",
    "grpc.reflection.v1alpha.ServerReflection",
)
"""Every service the port serves, as reflection lists them."""

RpcObserver: TypeAlias = Callable[[str, str, float], None]
"""Told of every call's end: (method path "/package.Service/Method", status name, seconds)."""


class SizeLimitedCodec(ProtoCodec):
    """Protobuf codec that refuses messages larger than `max_bytes`.

    A reply given as `Encoded` is sent as it is: its bytes were made once and
    kept (see `WorkerService.get_task_result`).
    """

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes

    def encode(self, message: Any, message_type: Any) -> bytes:
        data = (
            message.data if isinstance(message, Encoded) else super().encode(message, message_type)
        )
        if len(data) > self.max_bytes:
            raise GRPCError(
                Status.RESOURCE_EXHAUSTED,
                f"reply of {len(data)} bytes exceeds grpcMaxMessageBytes ({self.max_bytes})",
            )
        return data

    def decode(self, data: bytes, message_type: Any) -> Any:
        if len(data) > self.max_bytes:
            raise GRPCError(
                Status.RESOURCE_EXHAUSTED,
                f"request of {len(data)} bytes exceeds grpcMaxMessageBytes ({self.max_bytes})",
            )
        problem = wire_problem(data)
        if problem is None:
            try:
                return super().decode(data, message_type)
            except Exception as error:  # the decoder's own complaint, whatever its class
                problem = f"{type(error).__name__}: {error}"
        logger.warning(
            "malformed %s body refused (%d bytes): %s",
            message_type.__name__,
            len(data),
            problem,
        )
        raise GRPCError(Status.INVALID_ARGUMENT, f"malformed request body: {problem}")


def wire_problem(data: bytes) -> str | None:
    """What makes `data` not a protobuf message at its top level (a field running past the
    end, a bad varint, an unknown wire type), or None. The decoder takes a cut-off
    length-delimited field as shorter, so a truncated body is caught here."""
    position, end = 0, len(data)
    try:
        while position < end:
            key, position = _varint(data, position)
            wire_type = key & 7
            if key >> 3 == 0:
                return f"field number 0 at byte {position}"
            if wire_type == 0:
                _, position = _varint(data, position)
            elif wire_type == 1:
                position += 8
            elif wire_type == 2:
                length, position = _varint(data, position)
                position += length
            elif wire_type == 5:
                position += 4
            else:
                return f"wire type {wire_type} of field {key >> 3} is not supported"
            if position > end:
                return f"field {key >> 3} runs past the end of the {end}-byte body"
    except IndexError:
        return f"a varint runs past the end of the {end}-byte body"
    except ValueError as error:
        return str(error)
    return None


def _varint(data: bytes, position: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = data[position]
        position += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, position
        shift += 7
        if shift >= 64:
            raise ValueError(f"a varint longer than 10 bytes at byte {position}")


def bind_listener(host: str, port: int) -> socket.socket:
    """A TCP socket bound to (host, port) for the server (port 0: any free port).

    Bound before the server starts, so the worker knows its address (and with it
    its identity) before anything that names it is made.
    """
    family, kind, protocol, _, address = socket.getaddrinfo(
        host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
    )[0]
    sock = socket.socket(family, kind, protocol)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.setblocking(False)
    except OSError:
        sock.close()
        raise
    return sock


THREAD_STOP_TIMEOUT_S: Final = 5.0


class GrpcFrontEnd:
    """Owns the grpclib `Server` and the health status; Trio-facing methods."""

    def __init__(
        self,
        service: WorkerService,
        settings: GrpcSection,
        *,
        on_rpc: RpcObserver | None = None,
        on_connection_closed: ConnectionObserver | None = None,
        tls: ssl.SSLContext | None = None,
        token: str | None = None,
    ) -> None:
        """`tls`: serve TLS with this context (see `blockx.net.tls`); None, plain text. `token`:
        the bearer token every RPC but health needs (`blockx.net.auth`); None, no token.
        `on_rpc` and `on_connection_closed` are called on the Trio thread."""
        self.service = service
        self._tls = tls
        self._on_rpc = on_rpc
        self._on_connection_closed = on_connection_closed
        self._token = token
        self.health_status = ServiceStatus()
        self.health_status.set(False)
        self.first_serving = trio.Event()
        """Set the first time health turns SERVING: the worker announced it is ready."""
        self._max_message_bytes = settings.max_message_bytes
        self._limits = ConnectionLimits(
            max_streams=settings.max_concurrent_streams,
            max_connections=settings.max_connections,
            idle_timeout_s=settings.idle_timeout_ms / 1000,
            max_resets=settings.max_resets,
            reset_window_s=settings.reset_window_ms / 1000,
        )
        self._config = server_configuration(
            keepalive_time_s=settings.keepalive_time_ms / 1000,
            keepalive_timeout_s=settings.keepalive_timeout_ms / 1000,
        )
        self._server: GuardedServer | None = None
        self._loop_setting = settings.loop
        self._pin_loop_threads = settings.pin_loop_threads
        self._unpin: Callable[[], None] | None = None
        self._thread: LoopThread | None = None

    async def start(self, listener: socket.socket) -> None:
        """Serve on `listener` (see `bind_listener`), which the server owns from now on, in
        the arrangement `grpcLoop` names (`ThreadLoopUnderVirtualClock`: "thread" under a
        virtual clock)."""
        check_arrangement(self._loop_setting)
        if self._loop_setting == "trio-asyncio":
            await trio_asyncio.aio_as_trio(self._start)(listener)
            return
        choice = choose_cpu() if self._pin_loop_threads else None
        if choice is not None:
            self._unpin = pin_loop_threads(*choice)
        try:
            self._thread = LoopThread(cpu=None if choice is None else choice[0])
            loop = await self._thread.start()
            bridge = ThreadBridge(trio.lowlevel.current_trio_token(), loop)
            self.service.bridge = bridge
            on_rpc = self._on_rpc
            if on_rpc is not None:  # metrics are the actors' side
                self._on_rpc = lambda path, status, seconds: bridge.to_trio(
                    on_rpc, path, status, seconds
                )
            on_closed = self._on_connection_closed
            if on_closed is not None:
                self._on_connection_closed = lambda reason: bridge.to_trio(on_closed, reason)
            await self._thread.run(lambda: self._start(listener))
        except BaseException:
            self.unpin()  # the caller never gets a front end to stop
            raise

    async def _start(self, listener: socket.socket) -> None:
        # grpclib objects must be made inside the running asyncio loop.
        services: list[Any] = [
            self.service,
            HealthService({self.service: [self.health_status]}),
            *reflection_services(SERVED_SERVICES, default_google_proto_descriptor_pool),
        ]
        self._server = GuardedServer(
            services,
            codec=SizeLimitedCodec(self._max_message_bytes),
            config=self._config,
            max_message_bytes=self._max_message_bytes,
            limits=self._limits,
            on_closed=self._on_connection_closed or (lambda reason: None),
        )
        if self._token is not None:
            listen(self._server, RecvRequest, check_bearer(self._token))
        if self._on_rpc is not None:
            listen(self._server, RecvRequest, functools.partial(_observe_call, self._on_rpc))
        await self._server.start(sock=listener, ssl=self._tls)

    def set_serving(self, serving: bool) -> None:
        self.service.bridge.to_loop(self.health_status.set, serving)
        if serving:
            self.first_serving.set()

    async def stop(self, grace_s: float) -> None:
        """Refuse new requests, stop listening, wait up to `grace_s` for open calls."""
        self.service.closing = True
        self.set_serving(False)
        server = self._server
        if self._thread is None:
            if server is not None:
                server.close()
                with trio.move_on_after(grace_s):
                    await trio_asyncio.aio_as_trio(server.wait_closed)()
            return

        async def close() -> None:
            if server is not None:
                server.close()
                await server.wait_closed()

        async def abort() -> None:  # what outlived the grace: the loop cannot close with it
            if server is not None:
                server.abort_connections()

        try:
            with trio.move_on_after(grace_s):
                await self._thread.run(close)
            await self._thread.run(abort)
            await self._thread.close()
        finally:
            self.unpin()

    def release(self) -> None:
        """What a worker ended by cancellation (never `stop`ped) must still give back:
        its loop thread, and the CPUs the Trio thread was pinned away from."""
        if self._thread is not None:
            server = self._server

            def close() -> None:  # at once: no grace for the cancelled
                if server is not None:
                    server.close()
                    server.abort_connections()

            self._thread.stop_now(THREAD_STOP_TIMEOUT_S, first=close)
        self.unpin()

    def unpin(self) -> None:
        """Give the Trio thread back every CPU (see `pinLoopThreads`); once is enough."""
        unpin, self._unpin = self._unpin, None
        if unpin is not None:
            unpin()


async def _observe_call(on_rpc: RpcObserver, event: RecvRequest) -> None:
    """Wrap the call's handler so that `on_rpc` learns how it ended and how long it took."""
    handler = event.method_func
    path = event.method_name
    deadline = event.deadline

    async def observed(stream: Stream[Any, Any]) -> None:
        started_s = time.perf_counter()
        status = Status.UNKNOWN  # what grpclib answers for any other exception
        try:
            await handler(stream)
            status = Status.OK
        except GRPCError as error:
            status = error.status
            raise
        except (asyncio.CancelledError, StreamTerminatedError):
            expired = deadline is not None and deadline.time_remaining() <= 0
            status = Status.DEADLINE_EXCEEDED if expired else Status.CANCELLED
            raise
        finally:
            on_rpc(path, status.name, time.perf_counter() - started_s)

    event.method_func = observed
