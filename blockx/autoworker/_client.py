"""Where the hub is and who this program is to it: its URL and a credential.

`HubClient` opens the connections an automatic worker runs over and makes the
producers' HTTP requests (submit a task, read one) that examples, benches and
tests need: each on a connection of its own, or, with `keep_alive`, on
connections the hub keeps open between requests. A test may subclass it to
reach a hub some other way (in memory, or through a proxy that injects
faults) by overriding `open_stream`.
"""

from __future__ import annotations

import decimal
import json
import ssl
import urllib.parse
from typing import Any

import attrs
import h11
import trio

from blockx.errors import BlockxError, InvalidValue
from blockx.hubwire import Capability, dumps, queue_tasks_path, task_path

_DEFAULT_PORTS = {"http": 80, "ws": 80, "https": 443, "wss": 443}
MAX_RESPONSE_BYTES = 64 * 1024 * 1024
REUSE_IDLE_S = 5.0
"""A kept connection idle longer than this is not used again: the hub closes its kept
connections after 10 s idle, and a request must not cross that close."""


class HubRequestFailed(BlockxError):
    """The hub answered a producer request with an error status."""

    def __init__(self, *, status: int, body: Any) -> None:
        self.status = status
        self.body = body
        super().__init__(f"the hub answered {status}: {body}")


def _parse(url: str) -> tuple[str, int, bool]:
    parts = urllib.parse.urlsplit(url)
    scheme = parts.scheme.lower()
    InvalidValue.check(
        scheme in _DEFAULT_PORTS and bool(parts.hostname),
        field="url",
        value=url,
        allowed="the hub's address, e.g. http://127.0.0.1:8090 (http, https, ws or wss)",
    )
    assert parts.hostname is not None
    try:
        port = parts.port or _DEFAULT_PORTS[scheme]
    except ValueError as error:
        raise InvalidValue(field="url", value=url, allowed=f"a valid port ({error})") from None
    return parts.hostname, port, scheme in ("https", "wss")


@attrs.frozen(kw_only=True)
class HubClient:
    """The hub at `url`, reached with `credential` (a `bxc_...` token).

    The credential is sent in each connection's hello and each producer request's
    `Authorization` header; it is never logged or shown (`repr` leaves it out).
    """

    url: str
    credential: str = attrs.field(repr=False)
    ssl_context: ssl.SSLContext | None = attrs.field(default=None, repr=False)
    """For https/wss: the context to verify the hub with (default: the system's CAs)."""
    keep_alive: bool = False
    """Producer requests reuse the connections the hub keeps open (HTTP/1.1 keep-alive),
    until `aclose`; else each request has a connection of its own."""
    _idle: list[tuple[float, trio.abc.Stream, h11.Connection]] = attrs.field(
        factory=list, init=False, repr=False, eq=False
    )
    host: str = attrs.field(init=False)
    port: int = attrs.field(init=False)
    tls: bool = attrs.field(init=False)

    def __attrs_post_init__(self) -> None:
        host, port, tls = _parse(self.url)
        object.__setattr__(self, "host", host)
        object.__setattr__(self, "port", port)
        object.__setattr__(self, "tls", tls)

    async def open_stream(self) -> trio.abc.Stream:
        """A fresh byte stream to the hub."""
        if self.tls:
            context = self.ssl_context or ssl.create_default_context()
            return await trio.open_ssl_over_tcp_stream(
                self.host, self.port, ssl_context=context, https_compatible=True
            )
        return await trio.open_tcp_stream(self.host, self.port)

    # ------------------------------------------------------------------ producers' API

    async def submit(
        self, queue_id: str, capability: Capability, payload: Any, **fields: Any
    ) -> dict[str, Any]:
        """Queue a task (`fields`: idempotency, max_attempts, task_id, ...); the task.

        `payload` is any JSON value (`decimal.Decimal`s written exactly), or a `RawJson`
        whose text is the payload exactly as the handler will get it."""
        document = {
            "handler": capability.handler,
            "handler_version": capability.handler_version,
            "payload_version": capability.payload_version,
            "payload": payload,
            **fields,
        }
        task: dict[str, Any] = await self.request("POST", queue_tasks_path(queue_id), document)
        return task

    async def task(
        self, task_id: str, *, wait_ms: int = 0, decimals: bool = False
    ) -> dict[str, Any]:
        """A task as the hub has it now, with its attempts and history; with `wait_ms`
        (at most 30,000), as soon as it has ended, or once that much time has passed.
        With `decimals`, numbers with a fraction or an exponent are `decimal.Decimal`s."""
        query = f"?wait_ms={wait_ms}" if wait_ms else ""
        task: dict[str, Any] = await self.request(
            "GET", task_path(task_id) + query, decimals=decimals
        )
        return task

    async def request(
        self, method: str, target: str, body: Any = None, *, decimals: bool = False
    ) -> Any:
        """One producer request; its JSON answer (with `decimals`, numbers with a fraction
        or an exponent as `decimal.Decimal`s), or `HubRequestFailed`."""
        text = await self.request_text(method, target, body)
        parse_float = decimal.Decimal if decimals else float
        return json.loads(text, parse_float=parse_float) if text else None

    async def request_text(self, method: str, target: str, body: Any = None) -> str:
        """One producer request; its JSON answer's text exactly as the hub sent it (a
        task's payload and result as their producers wrote them), or `HubRequestFailed`.
        `body` is written by `blockx.hubwire.dumps`: `RawJson` and Decimals exactly."""
        data = b"" if body is None else dumps(body).encode()
        headers = [
            ("host", f"{self.host}:{self.port}"),
            ("authorization", f"Bearer {self.credential}"),
            ("content-type", "application/json"),
            ("content-length", str(len(data))),
            *(() if self.keep_alive else (("connection", "close"),)),
        ]
        stream, connection = await self._connection()
        status, content = 0, bytearray()
        try:
            await stream.send_all(
                connection.send(h11.Request(method=method, target=target, headers=headers))
                + connection.send(h11.Data(data=data))
                + connection.send(h11.EndOfMessage())
            )
            while not isinstance(event := connection.next_event(), h11.EndOfMessage):
                if event is h11.NEED_DATA:
                    connection.receive_data(bytes(await stream.receive_some()))
                elif isinstance(event, h11.Response):
                    status = event.status_code
                elif isinstance(event, h11.Data):
                    content += event.data
                    if len(content) > MAX_RESPONSE_BYTES:
                        raise HubRequestFailed(status=status, body="answer too large")
        except BaseException:
            await trio.aclose_forcefully(stream)
            raise
        if self.keep_alive and connection.our_state is connection.their_state is h11.DONE:
            connection.start_next_cycle()
            self._idle.append((trio.current_time(), stream, connection))
        else:
            await stream.aclose()
        text = content.decode()
        if status >= 300:
            raise HubRequestFailed(status=status, body=json.loads(text) if text else None)
        return text

    async def _connection(self) -> tuple[trio.abc.Stream, h11.Connection]:
        while self._idle:
            used_at, stream, connection = self._idle.pop()
            if trio.current_time() - used_at < REUSE_IDLE_S:
                return stream, connection
            await stream.aclose()
        return await self.open_stream(), h11.Connection(h11.CLIENT)

    async def aclose(self) -> None:
        """Close the connections kept for later requests."""
        while self._idle:
            await self._idle.pop()[1].aclose()
