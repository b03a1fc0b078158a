"""The gRPC server: grpclib on trio-asyncio's loop inside the worker's `trio.run`.

One TCP port serves `WorkerService`, the standard health service and server
reflection. Health answers SERVING for the worker's service (and for "")
only while the worker is ready (an executor is healthy) and not draining.
The maximum message size is enforced by the codec, both ways, with
RESOURCE_EXHAUSTED naming the size and the limit.
"""

from __future__ import annotations

import asyncio
from typing import Any, cast

import trio
import trio_asyncio
from grpclib.config import Configuration
from grpclib.const import Status
from grpclib.encoding.proto import ProtoCodec
from grpclib.exceptions import GRPCError
from grpclib.health.check import ServiceStatus
from grpclib.health.service import Health
from grpclib.reflection.service import ServerReflection
from grpclib.server import Server

from blockx._proto.google_proto_descriptor_pool import default_google_proto_descriptor_pool
from blockx.api._service import Encoded, WorkerService

SERVICE_NAME = "blockx.worker.v1.WorkerService"


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
        return super().decode(data, message_type)


class GrpcFrontEnd:
    """Owns the grpclib `Server` and the health status; Trio-facing methods."""

    def __init__(
        self,
        service: WorkerService,
        *,
        max_message_bytes: int,
        keepalive_time_ms: int,
        keepalive_timeout_ms: int,
    ) -> None:
        self.service = service
        self.health_status = ServiceStatus()
        self.health_status.set(False)
        self._max_message_bytes = max_message_bytes
        self._config = Configuration(
            _keepalive_time=keepalive_time_ms / 1000,
            _keepalive_timeout=keepalive_timeout_ms / 1000,
            _keepalive_permit_without_calls=True,
            _http2_max_pings_without_data=0,
        )
        self._server: Server | None = None
        self.port = 0

    async def start(self, host: str, port: int) -> int:
        """Listen on (host, port); returns the bound port (for port 0)."""
        self.port = await trio_asyncio.aio_as_trio(self._start)(host, port)
        return self.port

    async def _start(self, host: str, port: int) -> int:
        # grpclib objects must be made inside the running asyncio loop.
        health = Health({self.service: [self.health_status]})
        services: list[Any] = [self.service, health]
        names = [SERVICE_NAME, "grpc.health.v1.Health", "grpc.reflection.v1.ServerReflection"]
        reflection = ServerReflection(
            _service_names=names, _pool=default_google_proto_descriptor_pool
        )
        self._server = Server(
            [*services, reflection],
            codec=SizeLimitedCodec(self._max_message_bytes),
            config=self._config,
        )
        await self._server.start(host, port)
        listener = cast("asyncio.Server | None", self._server._server)
        sockets = listener.sockets if listener is not None else ()
        return int(sockets[0].getsockname()[1]) if sockets else port

    def set_serving(self, serving: bool) -> None:
        self.health_status.set(serving)

    async def stop(self, grace_s: float) -> None:
        """Refuse new requests, stop listening, wait up to `grace_s` for open calls."""
        self.service.closing = True
        self.set_serving(False)
        if self._server is None:
            return
        server = self._server
        server.close()
        with trio.move_on_after(grace_s):
            await trio_asyncio.aio_as_trio(server.wait_closed)()
