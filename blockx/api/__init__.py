"""The gRPC front end: grpclib on trio-asyncio, protobuf <-> domain, errors -> statuses.

The only package besides `blockx.discovery` that runs asyncio code.
"""

from blockx.api._convert import STATUS_MESSAGE_CHARS, STATUS_OF, grpc_error
from blockx.api._server import SERVICE_NAME, GrpcFrontEnd, RpcObserver, bind_listener
from blockx.api._service import WorkerService

__all__ = [
    "SERVICE_NAME",
    "STATUS_MESSAGE_CHARS",
    "STATUS_OF",
    "GrpcFrontEnd",
    "RpcObserver",
    "WorkerService",
    "bind_listener",
    "grpc_error",
]
