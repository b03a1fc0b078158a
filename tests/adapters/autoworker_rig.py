"""An automatic worker against the in-process hub (tests/adapters/hub_harness.py).

`rig_client(rig, token)` is a `HubClient` whose connections are the rig's
in-memory streams, so the worker, the hub and their timers all run on the test's
virtual clock. `SQLITE` runs a test on a SQLite hub only (the protocol is tested
on both databases elsewhere). A `TappedLine` notes when each message left a
worker and can cut its connection or refuse new ones (`tapped_worker`).
"""

from __future__ import annotations

import random
from typing import Any, Final

import attrs
import pytest
import trio
import trio.testing

from blockx.autoworker import (
    HubClient,
    Worker,
    WorkerExecution,
    WorkerHandler,
    WorkerOptions,
)
from blockx.hubwire import Capability, Message
from blockx.process.clock import EpochClock
from tests.adapters.hub_harness import CAPABILITY, EPOCH_MS, QUEUE, HubEndpoint, HubRig
from tests.adapters.ws_wire import WireReader

SQLITE: Final = pytest.mark.parametrize("hub_url", ["sqlite"], indirect=True)


@attrs.frozen(kw_only=True)
class RigClient(HubClient):
    """A `HubClient` that reaches the hub through `endpoint` (memory streams, a proxy)."""

    endpoint: HubEndpoint = attrs.field(repr=False)

    async def open_stream(self) -> trio.abc.Stream:
        return await self.endpoint.open_stream()


def rig_client(endpoint: HubEndpoint, token: str) -> RigClient:
    return RigClient(url="http://hub.test:80", credential=token, endpoint=endpoint)


async def echo(execution: WorkerExecution) -> Any:
    return execution.payload


def options(
    handle: Any = echo, *, capability: Capability = CAPABILITY, **fields: Any
) -> WorkerOptions:
    return WorkerOptions(
        queue_id=QUEUE,
        handlers=[WorkerHandler(capability=capability, handle=handle)],
        **fields,
    )


def worker(endpoint: HubEndpoint, token: str, opts: WorkerOptions | None = None) -> Worker:
    return Worker(
        rig_client(endpoint, token), opts or options(), clock=EpochClock(epoch_ms=EPOCH_MS)
    )


async def state_of(endpoint: HubEndpoint, token: str, task_id: str, *states: str) -> dict[str, Any]:
    """The task once it is in one of `states` (polled on the virtual clock)."""
    while True:
        task = await endpoint.task(token, task_id)
        if task["state"] in states:
            return task
        await trio.sleep(0.05)


def ms(seconds: float) -> int:
    return round(seconds * 1000)


@attrs.define(eq=False)
class Tap(trio.abc.Stream):
    """The worker's end of one connection: notes each message the worker sends, with the
    virtual time it left."""

    inner: trio.abc.Stream
    heard: list[tuple[float, Message]]
    closed: bool = False
    silent: bool = False
    """From now on nothing reaches the worker (a line that black-holes traffic)."""
    _reader: WireReader = attrs.Factory(WireReader)

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        for piece in self._reader.feed(bytes(data)):
            self.heard.extend((trio.current_time(), message) for message in piece.messages)
        await self.inner.send_all(data)

    async def wait_send_all_might_not_block(self) -> None:
        await self.inner.wait_send_all_might_not_block()

    async def receive_some(self, max_bytes: int | None = None) -> bytes | bytearray:
        data = await self.inner.receive_some(max_bytes)
        while self.silent and data:
            data = await self.inner.receive_some(max_bytes)  # swallowed
        return data

    async def aclose(self) -> None:
        self.closed = True
        await self.inner.aclose()


@attrs.define(eq=False)
class TappedLine:
    """Connections from a worker to `rig`'s hub, tapped; `down` refuses new ones."""

    rig: HubRig
    heard: list[tuple[float, Message]] = attrs.Factory(list)
    tries: list[float] = attrs.Factory(list)
    """When the worker tried to connect, refused tries included."""
    taps: list[Tap] = attrs.Factory(list)
    down: bool = False
    closing: bool = False
    """While `down`, connections are taken and closed at once (as by a proxy with no hub
    behind it), not refused."""
    _hub_ends: list[trio.abc.Stream] = attrs.Factory(list)
    _tried: trio.Event = attrs.Factory(trio.Event)

    async def open_stream(self) -> trio.abc.Stream:
        self.tries.append(trio.current_time())
        self._tried.set()
        self._tried = trio.Event()
        worker_end, hub_end = trio.testing.memory_stream_pair()
        if self.down and self.closing:
            await hub_end.aclose()
            return worker_end
        if self.down:
            raise OSError("connection refused (the test's hub is down)")
        self.rig.nursery.start_soon(self.rig.hub.serve_connection, hub_end)
        self._hub_ends.append(hub_end)
        line = Tap(inner=worker_end, heard=self.heard)
        self.taps.append(line)
        return line

    async def cut(self) -> None:
        """The hub's end of the open connection goes away."""
        await self._hub_ends[-1].aclose()

    async def wait_for_tries(self, count: int) -> None:
        while len(self.tries) < count:
            await self._tried.wait()

    def sent(self, kind: type[Message]) -> list[int]:
        """When each `kind` message was sent (virtual ms)."""
        return [ms(at) for at, message in self.heard if isinstance(message, kind)]


@attrs.frozen(kw_only=True)
class TappedClient(HubClient):
    """A `HubClient` whose connections are made by `line`."""

    line: TappedLine = attrs.field(repr=False)

    async def open_stream(self) -> trio.abc.Stream:
        return await self.line.open_stream()


def tapped_worker(
    line: TappedLine, token: str, opts: WorkerOptions, rng: random.Random | None = None
) -> Worker:
    client = TappedClient(url="http://hub.test:80", credential=token, line=line)
    return Worker(client, opts, clock=EpochClock(epoch_ms=EPOCH_MS), rng=rng)
