"""A Trio-facing client of etcd's v3 API: grpclib on trio-asyncio's loop.

Owns the grpclib channels to the etcd endpoints and the few calls blockx
needs: put/range/delete, lease grant/revoke/keep-alive and a prefix watch.
Must never let a grpclib or OS exception escape untranslated (every failure
is an `EtcdError`), and never retry on its own beyond trying each endpoint
once per call: retry policy belongs to the caller.

Theory of operation:

* The caller must be inside `async with trio_asyncio.open_loop():`; channels
  are made on that loop (grpclib binds its objects to the running loop) and
  every call goes through `aio_as_trio` bound to it.
* A unary call tries the endpoint that answered last, then the others; an
  endpoint that refuses, drops the connection, answers UNAVAILABLE or does
  not answer within the call timeout counts as down. When none answers the
  call raises `EtcdUnavailable`. grpclib reconnects a channel lazily, so an
  etcd that comes back is used again by the next call.
* Bidirectional streams (keep-alive, watch) are driven with
  `Channel.request` directly; each stream is closed by cancelling it (an RST
  for the server) under a shielded scope with a short deadline, so a
  cancelled caller never leaks a stream.
"""

from __future__ import annotations

import contextlib
from collections.abc import (
    AsyncGenerator,
    AsyncIterator,
    Awaitable,
    Callable,
    Iterator,
    Sequence,
)
from typing import Any, Generic, TypeVar

import attrs
import trio
import trio_asyncio
from grpclib.client import Channel, Stream
from grpclib.const import Cardinality, Status
from grpclib.exceptions import GRPCError, ProtocolError, StreamTerminatedError

from blockx._proto import etcdserverpb as rpc
from blockx._proto import mvccpb
from blockx.discovery._directory import KeyEvent, KeyEventKind
from blockx.errors import BlockxError, InvalidValue
from blockx.net.channels import asyncio_loop, open_channels, split_host_port

CALL_TIMEOUT_S = 5.0
"""How long one unary call may take on one endpoint before the next is tried."""
STREAM_CLOSE_GRACE_S = 2.0
"""How long closing a stream may take before it is abandoned."""

_KEEP_ALIVE_ROUTE = "/etcdserverpb.Lease/LeaseKeepAlive"
_WATCH_ROUTE = "/etcdserverpb.Watch/Watch"
_LEASE_NOT_FOUND = "lease not found"

_R = TypeVar("_R")
_Send = TypeVar("_Send")
_Recv = TypeVar("_Recv")


# --- errors --------------------------------------------------------------------------------


class EtcdError(BlockxError):
    """Base of the etcd client's errors."""


class InvalidEtcdEndpoint(EtcdError, InvalidValue):
    """`value` is not HOST:PORT (or http://HOST:PORT)."""

    def __init__(self, *, endpoint: str, allowed: str) -> None:
        super().__init__(field="etcd endpoint", value=endpoint, allowed=allowed)

    def describe(self) -> str:
        return f"etcd endpoint {self.value!r}: {self.allowed}"


class EtcdUnavailable(EtcdError):
    """No endpoint of `endpoints` answered `rpc`; `reason` is the last failure."""

    def __init__(self, *, rpc: str, endpoints: tuple[str, ...], reason: str) -> None:
        self.rpc = rpc
        self.endpoints = endpoints
        self.reason = reason
        super().__init__(f"etcd {rpc}: no endpoint answered: {reason}")


class EtcdCallError(EtcdError):
    """etcd answered `rpc` with a gRPC status other than OK (and not UNAVAILABLE)."""

    def __init__(self, *, rpc: str, status: Status, message: str) -> None:
        self.rpc = rpc
        self.status = status
        self.message = message
        super().__init__(f"etcd {rpc} failed: {status.name}: {message}")


class LeaseNotFound(EtcdCallError):
    """The lease named in `rpc` has expired or was revoked."""


class WatchCanceled(EtcdError):
    """etcd ended a watch; `compact_revision` > 0 when its start revision was compacted."""

    def __init__(self, *, reason: str, compact_revision: int) -> None:
        self.reason = reason
        self.compact_revision = compact_revision
        detail = f" (compacted up to revision {compact_revision})" if compact_revision else ""
        super().__init__(f"etcd canceled the watch: {reason or 'no reason given'}{detail}")


# --- values --------------------------------------------------------------------------------


@attrs.frozen(kw_only=True)
class Lease:
    lease_id: int
    ttl_s: int
    """The TTL etcd granted (it raises very short requests to its minimum)."""


@attrs.frozen(kw_only=True)
class RangeSnapshot:
    """The keys of a range at `revision`: (key, value, mod_revision) each."""

    revision: int
    entries: tuple[tuple[str, bytes, int], ...]


def parse_endpoint(endpoint: str) -> tuple[str, int]:
    """(host, port) of "host:port", "[v6]:port" or "http://host:port"."""
    text = endpoint.strip()
    if text.startswith("https://"):
        raise InvalidEtcdEndpoint(
            endpoint=endpoint, allowed="TLS is not supported: use http://HOST:PORT or HOST:PORT"
        )
    try:
        return split_host_port(text.removeprefix("http://").rstrip("/"))
    except ValueError as error:
        raise InvalidEtcdEndpoint(endpoint=endpoint, allowed=str(error)) from None


def prefix_range_end(prefix: bytes) -> bytes:
    """The `range_end` that makes a range cover every key starting with `prefix`."""
    end = bytearray(prefix)
    while end:
        if end[-1] < 0xFF:
            end[-1] += 1
            return bytes(end)
        end.pop()
    return b"\0"  # every key


# --- the client ----------------------------------------------------------------------------


class EtcdClient:
    """Channels to an etcd cluster. Make it with `async with EtcdClient.connect(endpoints)`."""

    def __init__(
        self,
        *,
        endpoints: tuple[str, ...],
        channels: tuple[Channel, ...],
        loop: object,
        call_timeout_s: float,
    ) -> None:
        self.endpoints = endpoints
        self._channels = channels
        self._loop = loop
        self._call_timeout_s = call_timeout_s
        self._current = 0

    @classmethod
    @contextlib.asynccontextmanager
    async def connect(
        cls, endpoints: Sequence[str], *, call_timeout_s: float = CALL_TIMEOUT_S
    ) -> AsyncIterator[EtcdClient]:
        """A client of the etcd members at `endpoints`; channels close on exit.

        Must be entered inside `async with trio_asyncio.open_loop():`. Connecting
        is lazy: an unreachable etcd fails the first call, not this.
        """
        if not endpoints:
            raise InvalidEtcdEndpoint(endpoint="", allowed="give at least one HOST:PORT")
        addresses = [parse_endpoint(endpoint) for endpoint in endpoints]
        loop = asyncio_loop("EtcdClient.connect")
        async with open_channels(loop, addresses) as channels:
            yield cls(
                endpoints=tuple(endpoints),
                channels=channels,
                loop=loop,
                call_timeout_s=call_timeout_s,
            )

    # --- key-value -------------------------------------------------------------------------

    async def put(self, key: str, value: bytes, *, lease_id: int = 0) -> int:
        """Write `key`, attached to `lease_id` (0: no lease); returns the new revision.

        LeaseNotFound when the lease has expired or was revoked.
        """
        request = rpc.PutRequest(key=key.encode(), value=value, lease=lease_id)
        response = await self._unary("Put", lambda channel: rpc.KvStub(channel).put(request))
        return _revision(response.header)

    async def get_prefix(self, prefix: str) -> RangeSnapshot:
        """Every key under `prefix`, and the revision they were read at."""
        key = prefix.encode()
        request = rpc.RangeRequest(key=key, range_end=prefix_range_end(key))
        response = await self._unary("Range", lambda channel: rpc.KvStub(channel).range(request))
        return RangeSnapshot(
            revision=_revision(response.header),
            entries=tuple(
                (kv.key.decode(errors="replace"), kv.value, kv.mod_revision) for kv in response.kvs
            ),
        )

    async def get(self, key: str) -> bytes | None:
        """The value of `key`, or None when it does not exist."""
        request = rpc.RangeRequest(key=key.encode())
        response = await self._unary("Range", lambda channel: rpc.KvStub(channel).range(request))
        return response.kvs[0].value if response.kvs else None

    async def delete(self, key: str) -> int:
        """Delete `key`; returns how many keys were deleted (0 or 1)."""
        request = rpc.DeleteRangeRequest(key=key.encode())
        response = await self._unary(
            "DeleteRange", lambda channel: rpc.KvStub(channel).delete_range(request)
        )
        return response.deleted

    # --- leases ----------------------------------------------------------------------------

    async def grant_lease(self, ttl_s: int) -> Lease:
        request = rpc.LeaseGrantRequest(ttl=ttl_s)
        response = await self._unary(
            "LeaseGrant", lambda channel: rpc.LeaseStub(channel).lease_grant(request)
        )
        if response.error:
            raise EtcdCallError(rpc="LeaseGrant", status=Status.UNKNOWN, message=response.error)
        return Lease(lease_id=response.id, ttl_s=response.ttl)

    async def revoke_lease(self, lease_id: int) -> None:
        """Revoke the lease; its keys are deleted. LeaseNotFound if it is already gone."""
        request = rpc.LeaseRevokeRequest(id=lease_id)
        await self._unary(
            "LeaseRevoke", lambda channel: rpc.LeaseStub(channel).lease_revoke(request)
        )

    async def lease_ttl_s(self, lease_id: int) -> int:
        """Seconds the lease has left; -1 when it has expired or never existed."""
        request = rpc.LeaseTimeToLiveRequest(id=lease_id)
        response = await self._unary(
            "LeaseTimeToLive", lambda channel: rpc.LeaseStub(channel).lease_time_to_live(request)
        )
        return response.ttl

    @contextlib.asynccontextmanager
    async def keep_alive(self) -> AsyncIterator[KeepAlive]:
        """A keep-alive stream: `await keep_alive.renew(lease_id)` renews one lease."""
        async with self._stream(
            "LeaseKeepAlive",
            _KEEP_ALIVE_ROUTE,
            rpc.LeaseKeepAliveRequest,
            rpc.LeaseKeepAliveResponse,
        ) as stream:
            yield KeepAlive(stream)

    # --- watch -----------------------------------------------------------------------------

    async def watch_prefix(
        self, prefix: str, *, start_revision: int
    ) -> AsyncGenerator[list[KeyEvent], None]:
        """Each batch of changes under `prefix` from `start_revision` on.

        Raises EtcdUnavailable when the stream breaks and WatchCanceled when
        etcd ends the watch. Close it with `contextlib.aclosing`.
        """
        key = prefix.encode()
        create = rpc.WatchRequest(
            create_request=rpc.WatchCreateRequest(
                key=key, range_end=prefix_range_end(key), start_revision=start_revision
            )
        )
        async with self._stream("Watch", _WATCH_ROUTE, rpc.WatchRequest, rpc.WatchResponse) as (
            stream
        ):
            await stream.send(create)
            while True:
                response = await stream.receive()
                if response.canceled:
                    raise WatchCanceled(
                        reason=response.cancel_reason, compact_revision=response.compact_revision
                    )
                if response.events:
                    yield [_key_event(event) for event in response.events]

    # --- the bridge ------------------------------------------------------------------------

    async def _unary(self, name: str, call: Callable[[Channel], Awaitable[_R]]) -> _R:
        reason = "no endpoint"
        for attempt in range(len(self._channels)):
            index = (self._current + attempt) % len(self._channels)
            try:
                with trio.fail_after(self._call_timeout_s):
                    result: _R = await trio_asyncio.aio_as_trio(call, loop=self._loop)(
                        self._channels[index]
                    )
            except GRPCError as error:
                if error.status is not Status.UNAVAILABLE:
                    raise _call_error(name, error) from error
                reason = f"{self.endpoints[index]}: UNAVAILABLE: {error.message or ''}"
            except trio.TooSlowError:
                reason = f"{self.endpoints[index]}: no answer within {self._call_timeout_s} s"
            except (OSError, StreamTerminatedError, ProtocolError) as error:
                reason = f"{self.endpoints[index]}: {error or type(error).__name__}"
            else:
                self._current = index
                return result
        raise EtcdUnavailable(rpc=name, endpoints=self.endpoints, reason=reason)

    @contextlib.asynccontextmanager
    async def _stream(
        self, name: str, route: str, send_type: type[_Send], recv_type: type[_Recv]
    ) -> AsyncIterator[BidiStream[_Send, _Recv]]:
        """An open bidirectional stream on the first endpoint that accepts one."""
        reason = "no endpoint"
        opened: _AioStream[_Send, _Recv] | None = None
        for attempt in range(len(self._channels)):
            index = (self._current + attempt) % len(self._channels)
            candidate = _AioStream(self._channels[index], route, send_type, recv_type)
            try:
                with trio.fail_after(self._call_timeout_s):
                    await trio_asyncio.aio_as_trio(candidate.open, loop=self._loop)()
            except trio.TooSlowError:
                reason = f"{self.endpoints[index]}: no answer within {self._call_timeout_s} s"
            except (OSError, StreamTerminatedError, ProtocolError, GRPCError) as error:
                reason = f"{self.endpoints[index]}: {error or type(error).__name__}"
            else:
                self._current = index
                opened = candidate
                break
            await self._close(candidate)
        if opened is None:
            raise EtcdUnavailable(rpc=name, endpoints=self.endpoints, reason=reason)
        try:
            yield BidiStream(
                name=name, endpoint=self.endpoints[self._current], stream=opened, client=self
            )
        finally:
            await self._close(opened)

    async def _close(self, stream: _AioStream[Any, Any]) -> None:
        with trio.move_on_after(STREAM_CLOSE_GRACE_S, shield=True):
            await trio_asyncio.aio_as_trio(stream.close, loop=self._loop)()

    async def _aio(self, function: Callable[[], Awaitable[_R]]) -> _R:
        result: _R = await trio_asyncio.aio_as_trio(function, loop=self._loop)()
        return result


class BidiStream(Generic[_Send, _Recv]):
    """The Trio side of one open bidirectional stream."""

    def __init__(
        self, *, name: str, endpoint: str, stream: _AioStream[_Send, _Recv], client: EtcdClient
    ) -> None:
        self._name = name
        self._endpoint = endpoint
        self._stream = stream
        self._client = client

    async def send(self, message: _Send) -> None:
        with self._translate():
            await self._client._aio(lambda: self._stream.send(message))

    async def receive(self) -> _Recv:
        """The next message; EtcdUnavailable when the stream ends or breaks."""
        with self._translate():
            message = await self._client._aio(self._stream.receive)
        if message is None:
            raise self._unavailable("the stream ended")
        return message

    @contextlib.contextmanager
    def _translate(self) -> Iterator[None]:
        try:
            yield
        except GRPCError as error:
            if error.status is Status.UNAVAILABLE:
                raise self._unavailable(f"UNAVAILABLE: {error.message or ''}") from error
            raise _call_error(self._name, error) from error
        except (OSError, StreamTerminatedError, ProtocolError) as error:
            raise self._unavailable(str(error) or type(error).__name__) from error

    def _unavailable(self, reason: str) -> EtcdUnavailable:
        return EtcdUnavailable(rpc=self._name, endpoints=(self._endpoint,), reason=reason)


class KeepAlive:
    """Renews leases over one LeaseKeepAlive stream."""

    def __init__(self, stream: BidiStream[rpc.LeaseKeepAliveRequest, rpc.LeaseKeepAliveResponse]):
        self._stream = stream

    async def renew(self, lease_id: int) -> int:
        """Renew the lease; returns its TTL in seconds, 0 when it had already expired."""
        await self._stream.send(rpc.LeaseKeepAliveRequest(id=lease_id))
        while True:
            response = await self._stream.receive()
            if response.id == lease_id:
                return response.ttl


class _AioStream(Generic[_Send, _Recv]):
    """The asyncio side of a bidirectional stream; every method runs on the loop."""

    def __init__(
        self, channel: Channel, route: str, send_type: type[_Send], recv_type: type[_Recv]
    ) -> None:
        self._channel = channel
        self._route = route
        self._send_type = send_type
        self._recv_type = recv_type
        self._stream: Stream[_Send, _Recv] | None = None

    async def open(self) -> None:
        stream = self._channel.request(
            self._route, Cardinality.STREAM_STREAM, self._send_type, self._recv_type
        )
        self._stream = await stream.__aenter__()
        await stream.send_request()

    async def send(self, message: _Send) -> None:
        assert self._stream is not None
        await self._stream.send_message(message)

    async def receive(self) -> _Recv | None:
        assert self._stream is not None
        return await self._stream.recv_message()

    async def close(self) -> None:
        """Reset the stream (the server sees it cancelled) and release it."""
        stream, self._stream = self._stream, None
        if stream is None:
            return
        # Whatever state the stream is in (broken, ended, cancelled), closing
        # must not fail: the caller is done with it either way.
        with contextlib.suppress(Exception):
            await stream.cancel()
        with contextlib.suppress(Exception):
            await stream.__aexit__(None, None, None)


def _call_error(name: str, error: GRPCError) -> EtcdCallError:
    message = error.message or ""
    if error.status is Status.NOT_FOUND and _LEASE_NOT_FOUND in message:
        return LeaseNotFound(rpc=name, status=error.status, message=message)
    return EtcdCallError(rpc=name, status=error.status, message=message)


def _revision(header: rpc.ResponseHeader | None) -> int:
    return header.revision if header is not None else 0


def _key_event(event: mvccpb.Event) -> KeyEvent:
    kv = event.kv or mvccpb.KeyValue()
    kind = KeyEventKind.DELETE if event.type == mvccpb.EventEventType.DELETE else KeyEventKind.PUT
    return KeyEvent(
        kind=kind, key=kv.key.decode(errors="replace"), mod_revision=kv.mod_revision, value=kv.value
    )
