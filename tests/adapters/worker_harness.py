"""An in-process worker for front-end tests: real actors and gRPC, fake executors.

`running_worker()` starts `blockx.app.serve` on 127.0.0.1 port 0 with
in-memory function code and `FakeCalls` in place of executor processes, and
yields a `Harness` whose `call` runs a stub method from Trio.
"""

from __future__ import annotations

import functools
import json
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from typing import Any, TypeVar

import attrs
import trio
import trio_asyncio
from grpclib.client import Channel
from opentelemetry.trace import Tracer

from blockx._proto.blockx.worker import v1 as pb
from blockx.app import BLOCK, Serving, serve
from blockx.config import WorkerConfig, load_config
from blockx.executors import decode_args, encode_value
from blockx.functions import MemorySource
from blockx.phases import CallPhaseOutcome, CallPhaseStats, CallPolicy, CallSpec

T = TypeVar("T")


class FakeCalls:
    """Runs calls in-process: `demo.add(a, b)`, `demo.fail()` raises, `demo.hang()` never ends."""

    def __init__(self) -> None:
        self.started: list[str] = []
        self.cancelled: list[str] = []
        self.hanging = trio.Event()

    async def __aenter__(self) -> FakeCalls:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        return None

    async def run_calls(
        self, task_id: str, epoch: str, calls: Sequence[CallSpec], policy: CallPolicy
    ) -> CallPhaseOutcome:
        self.started.append(task_id)
        outputs = []
        for call in calls:
            args, _ = decode_args(call.args)
            if call.function == "demo.add":
                outputs.append(encode_value(sum(args)))
            elif call.function == "demo.fail":
                return CallPhaseOutcome(
                    ok=False,
                    failure_code="CALL_RAISED",
                    message=f"{call.call_id}: ValueError('boom')",
                    stats=CallPhaseStats(calls_total=len(calls), calls_failed=1),
                )
            elif call.function == "demo.hang":
                self.hanging.set()
                try:
                    await trio.sleep_forever()
                finally:
                    self.cancelled.append(task_id)
            else:
                raise AssertionError(f"unexpected function {call.function}")
        return CallPhaseOutcome(
            ok=True,
            outputs=tuple(outputs),
            stats=CallPhaseStats(calls_total=len(calls), calls_succeeded=len(calls)),
        )


@attrs.define
class Harness:
    serving: Serving
    stub: pb.WorkerServiceStub
    channel: Channel
    calls: FakeCalls
    stop: trio.Event

    async def call(self, method: Callable[..., Awaitable[T]], *args: Any) -> T:
        result: T = await trio_asyncio.aio_as_trio(method)(*args)
        return result


def worker_config(**overrides: object) -> WorkerConfig:
    values: dict[str, object] = {
        "listenAddr": "127.0.0.1:0",
        "metricsListenAddr": "127.0.0.1:0",  # many workers per test run: never the fixed :9464
        "etcdEndpoints": "none",  # no registration unless a test asks for it
        "worker.taskSlots": 4,
    }
    values.update(overrides)
    return load_config(env={}, overrides=values)


@asynccontextmanager
async def running_worker(
    config: WorkerConfig | None = None, *, tracer: Tracer | None = None
) -> AsyncIterator[Harness]:
    source = MemorySource()
    source.publish({"demo": "def add(a, b):\n    return a + b\n"})
    calls = FakeCalls()
    stop = trio.Event()
    async with trio_asyncio.open_loop(), trio.open_nursery() as nursery:
        serving: Serving = await nursery.start(
            functools.partial(
                serve,
                config or worker_config(),
                BLOCK,
                stop=stop,
                source=source,
                executors=calls,
                tracer=tracer,
            )
        )
        channel = await trio_asyncio.aio_as_trio(_channel)(serving.port)
        try:
            yield Harness(
                serving=serving,
                stub=pb.WorkerServiceStub(channel),
                channel=channel,
                calls=calls,
                stop=stop,
            )
        finally:
            channel.close()
            stop.set()


async def _channel(port: int) -> Channel:
    return Channel("127.0.0.1", port)


def call_list_task(task_id: str, *calls: tuple[str, list[object]], **fields: Any) -> pb.TaskSpec:
    payload = {"calls": [{"function": function, "args": args} for function, args in calls]}
    return pb.TaskSpec(
        task_id=task_id,
        function_call=pb.FunctionCallConfig(type="call_list"),
        payload=json.dumps(payload).encode(),
        **fields,
    )
