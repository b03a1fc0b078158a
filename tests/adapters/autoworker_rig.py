"""An automatic worker against the in-process hub (tests/adapters/hub_harness.py).

`rig_client(rig, token)` is a `HubClient` whose connections are the rig's
in-memory streams, so the worker, the hub and their timers all run on the test's
virtual clock. `SQLITE` runs a test on a SQLite hub only (the protocol is tested
on both databases elsewhere).
"""

from __future__ import annotations

from typing import Any, Final

import attrs
import pytest
import trio

from blockx.autoworker import (
    HubClient,
    Worker,
    WorkerExecution,
    WorkerHandler,
    WorkerOptions,
)
from blockx.hubwire import Capability
from blockx.process.clock import EpochClock
from tests.adapters.hub_harness import CAPABILITY, EPOCH_MS, QUEUE, HubEndpoint

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
