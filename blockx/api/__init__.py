"""The gRPC front end: grpclib on trio-asyncio, protobuf <-> domain, errors -> statuses.

The only package besides `blockx.discovery` that runs asyncio code.
"""

from blockx.api._convert import STATUS_OF, grpc_error, spec_from_pb
from blockx.api._server import SERVICE_NAME, GrpcFrontEnd, RpcObserver
from blockx.api._service import WorkerIdentity, WorkerService

__all__ = [
    "SERVICE_NAME",
    "STATUS_OF",
    "GrpcFrontEnd",
    "RpcObserver",
    "WorkerIdentity",
    "WorkerService",
    "grpc_error",
    "spec_from_pb",
]
