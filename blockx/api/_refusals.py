"""Which gRPC requests the port refuses before serving them, and how each refusal reads.

grpclib's server checks few of a request's headers, and trusts what it does not
check. `refusal_of` makes grpclib's checks, in its order, and then the ones it leaves
out: a request without `:method` or `:path` (grpclib: a KeyError and no answer), a
`grpc-timeout` that is not 1 to 8 digits and a unit (UNKNOWN), a `grpc-encoding`
other than identity (UNKNOWN at the first compressed message), a `-bin` metadata
value that is not base64 (a traceback and no answer). Each refusal is a precise
status with a message, never UNKNOWN, a traceback, or no answer at all.

Pure: reads headers, returns a `Refusal`. Answering it, and everything else that
runs inside grpclib, is `_grpclib`'s; this module never touches grpclib's internals.
"""

from __future__ import annotations

import binascii
import re
from collections.abc import Mapping
from typing import Final

import attrs
from grpclib.const import Handler as MethodHandler
from grpclib.const import Status
from grpclib.encoding.base import GRPC_CONTENT_TYPE
from grpclib.metadata import decode_bin_value

from blockx.errors import shown

_TIMEOUT: Final = re.compile(r"[0-9]{1,8}[HMSmun]")
"""A `grpc-timeout` value as the gRPC HTTP/2 protocol defines it."""
_CONTENT_TYPE: Final = re.compile(re.escape(GRPC_CONTENT_TYPE) + r"(\+proto)?")

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
