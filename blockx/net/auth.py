"""The optional bearer token of the gRPC port: where it comes from, and its checks.

A worker with a token answers every RPC but health checks with UNAUTHENTICATED
unless the request carries `authorization: Bearer <token>`. The token comes
from the environment variable `WORKER_AUTH_TOKEN` (the secret setting
`grpcAuthToken`) or from the file that `grpcAuthTokenFile`
(`WORKER_AUTH_TOKEN_FILE`) names, never from the JSON configuration itself, so
`serve --print-config` and the logs never show it. The client and the command
line read the same two variables (`blockx.client.ClientSettings`). Reads no
environment itself: the settings arrive as values.
"""

from __future__ import annotations

import hmac
from typing import Any, Final

from grpclib.const import Status
from grpclib.events import RecvRequest, SendRequest
from grpclib.exceptions import GRPCError

from blockx.settings import ConfigError

TOKEN_ENV: Final = "WORKER_AUTH_TOKEN"
TOKEN_FILE_ENV: Final = "WORKER_AUTH_TOKEN_FILE"
OPEN_PREFIX: Final = "/grpc.health.v1.Health/"
"""Health checks stay open: load balancers and process managers probe without a token."""


def bearer_token(
    token: str = "", token_file: str = "", *, file_setting: str = "grpcAuthTokenFile"
) -> str | None:
    """The token: `token` as given, or the contents of `token_file` (stripped); None when
    neither is set. ConfigError naming `file_setting` if both are, or the file is
    unreadable or empty."""
    if token and token_file:
        raise ConfigError(
            field=file_setting,
            value=token_file,
            allowed=f"either {TOKEN_ENV} or a token file, not both",
        )
    if token:
        return token
    if not token_file:
        return None
    try:
        with open(token_file, encoding="utf-8") as file:
            read = file.read().strip()
    except (OSError, UnicodeDecodeError) as error:
        raise ConfigError(
            field=file_setting, value=token_file, allowed=f"a readable file ({error})"
        ) from error
    if not read:
        raise ConfigError(field=file_setting, value=token_file, allowed="a non-empty file")
    return read


def check_bearer(token: str) -> Any:
    """A `RecvRequest` listener refusing a call without `token` (health checks excepted)."""
    expected = f"Bearer {token}".encode()

    async def check(event: RecvRequest) -> None:
        if event.method_name.startswith(OPEN_PREFIX):
            return
        given = event.metadata.get("authorization", "")
        if not isinstance(given, str) or not hmac.compare_digest(given.encode(), expected):
            raise GRPCError(Status.UNAUTHENTICATED, "a valid bearer token is required")

    return check


def send_bearer(token: str) -> Any:
    """A `SendRequest` listener adding `token` to every call of a channel."""
    header = f"Bearer {token}"

    async def add(event: SendRequest) -> None:
        event.metadata["authorization"] = header

    return add
