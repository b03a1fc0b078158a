"""The gRPC front end: grpclib on trio-asyncio or its own loop thread (`grpcLoop`),
protobuf <-> domain, errors -> statuses.

The server side of the asyncio code (the clients' side is `blockx.net.channels`,
`blockx.client` and `blockx.discovery`). grpclib's server internals are touched in
`_grpclib` alone (the fence).
"""

from blockx.api._bridge import ThreadLoopUnderVirtualClock
from blockx.api._convert import (
    STATUS_MESSAGE_CHARS,
    STATUS_OF,
    grpc_error,
    result_message,
    spec_from_message,
)
from blockx.api._server import SERVICE_NAME, GrpcFrontEnd, RpcObserver, bind_listener
from blockx.api._service import WorkerService

__all__ = [
    "SERVICE_NAME",
    "STATUS_MESSAGE_CHARS",
    "STATUS_OF",
    "GrpcFrontEnd",
    "RpcObserver",
    "ThreadLoopUnderVirtualClock",
    "WorkerService",
    "bind_listener",
    "grpc_error",
    "result_message",
    "spec_from_message",
]
