"""An in-process worker for front-end tests: real actors and gRPC, fake executors.

`running_worker()` starts `blockx.app.serve` on 127.0.0.1 port 0 with
in-memory function code and `FakeExecutors` in place of executor processes,
and yields a `Harness` whose `call` runs a stub method from Trio. A test on
the virtual clock passes `virtual_clock_config(...)`; the others get the
production arrangement of the gRPC loop (`grpcLoop` "thread").
"""

from __future__ import annotations

import functools
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any, TypeVar

import attrs
import trio
import trio_asyncio
from grpclib.client import Channel
from opentelemetry.trace import Tracer

from blockx._proto.blockx.worker import v1 as pb
from blockx.app import Serving, serve
from blockx.calls import CallOutcome, FailureCode, decode_args, encode_value
from blockx.client import ClientSettings
from blockx.config import WorkerConfig, load_config
from blockx.executors import (
    CallRequest,
    CallResults,
    CancelCall,
    ExecutorMessage,
    ExecutorPoolConfig,
    ExecutorState,
    ExecutorUp,
    ExecutorView,
    PoolEvent,
    RunCalls,
    ToExecutor,
    decode_payload,
)
from blockx.functions import MemorySource
from blockx.process.clock import EpochClock
from blockx.profiles import BLOCK

T = TypeVar("T")

EXECUTOR_ID = "fake-0"


class FakeExecutors:
    """One executor that runs calls in-process, implementing `ExecutorTransport`.

    `demo.add(a, b)` returns the sum, `demo.fail()` raises, `demo.hang()` never
    answers until it is cancelled (then it answers CALL_CANCELLED, as an interrupted
    call does). `started` lists the task id of each run of a task's calls,
    `cancelled` the task ids whose hanging call was cancelled, `replaced` why each
    replacement was asked for.
    Made with `healthy=False`, it comes up only when `become_healthy` is called.
    """

    def __init__(
        self,
        config: ExecutorPoolConfig,
        events: trio.MemorySendChannel[PoolEvent],
        clock: object,
        *,
        healthy: bool = True,
    ) -> None:
        self._events = events
        self._healthy_at_start = healthy
        self.first_healthy = trio.Event()
        self.started: list[str] = []
        self.cancelled: list[str] = []
        self.replaced: list[str] = []
        self.hanging = trio.Event()
        self._runs: set[str] = set()
        self._hung: dict[tuple[str, int], str] = {}  # (call id, attempt) -> task id
        self._run_started: dict[str, trio.Event] = {}

    def run_started(self, task_id: str) -> trio.Event:
        """Set once a run of the task's calls has started here."""
        return self._run_started.setdefault(task_id, trio.Event())

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        if self._healthy_at_start:
            self.become_healthy()
        task_status.started()
        await trio.sleep_forever()

    def become_healthy(self) -> None:
        self._events.send_nowait(ExecutorUp(executor_id=EXECUTOR_ID, pid=1))
        self.first_healthy.set()

    async def stop(self) -> None:
        return None

    def snapshot(self) -> tuple[ExecutorView, ...]:
        return (
            ExecutorView(
                executor_id=EXECUTOR_ID,
                state=ExecutorState.READY,
                pid=1,
                rss_bytes=0,
                calls_served=0,
                restarts=0,
                running_call_id=None,
            ),
        )

    def replace(self, executor_id: str, why: str) -> None:
        self.replaced.append(why)

    def send_frame(self, executor_id: str, frame: bytes, *, at_once: bool = False) -> None:
        message = decode_payload(frame[4:])
        assert isinstance(message, RunCalls)
        outcomes = [outcome for call in message.calls if (outcome := self._run(call)) is not None]
        if outcomes:
            self._answer(tuple(outcomes))

    def send(self, executor_id: str, message: ToExecutor) -> None:
        if isinstance(message, CancelCall):
            task_id = self._hung.pop((message.call_id, message.attempt), None)
            if task_id is not None:  # interrupted, as a real executor interrupts it
                self.cancelled.append(task_id)
                stopped = CallOutcome.failure(
                    call_id=message.call_id,
                    attempt=message.attempt,
                    error_code=FailureCode.CALL_CANCELLED,
                    error_message="cancelled by the worker while it ran",
                    retryable=False,
                )
                self._answer((stopped,))

    def _run(self, call: CallRequest) -> CallOutcome | None:
        run = call.call_id.partition(":")[0]
        if run not in self._runs:
            self._runs.add(run)
            self.started.append(call.task_id)
            self.run_started(call.task_id).set()
        args, _ = decode_args(call.args)
        match call.function:
            case "demo.add":
                return CallOutcome.success(
                    call_id=call.call_id, attempt=call.attempt, value=encode_value(sum(args))
                )
            case "demo.fail":
                return CallOutcome.failure(
                    call_id=call.call_id,
                    attempt=call.attempt,
                    error_code=FailureCode.CALL_RAISED,
                    error_message="ValueError('boom')",
                    retryable=False,
                )
            case "demo.hang":
                self._hung[(call.call_id, call.attempt)] = call.task_id
                self.hanging.set()
                return None
            case _:
                raise AssertionError(f"unexpected function {call.function}")

    def _answer(self, outcomes: tuple[CallOutcome, ...]) -> None:
        results = CallResults(results=outcomes)
        self._events.send_nowait(ExecutorMessage(executor_id=EXECUTOR_ID, message=results))


@attrs.define
class Harness:
    serving: Serving
    stub: pb.WorkerServiceStub
    channel: Channel
    calls: FakeExecutors
    stop: trio.Event

    async def call(self, method: Callable[..., Awaitable[T]], *args: Any) -> T:
        result: T = await trio_asyncio.aio_as_trio(method)(*args)
        return result

    async def watch(self, *task_ids: str) -> list[pb.TaskUpdate]:
        """Every update of a watch on `task_ids`, until all of them ended."""
        stream = self.stub.watch_tasks(pb.WatchTasksRequest(task_ids=list(task_ids)))
        return [update async for update in trio_asyncio.aio_as_trio(stream)]


def worker_config(**overrides: object) -> WorkerConfig:
    values: dict[str, object] = {
        "listenAddr": "127.0.0.1:0",
        "metricsListenAddr": "127.0.0.1:0",  # many workers per test run: never the fixed :9464
        "etcdEndpoints": "none",  # no registration unless a test asks for it
        "worker.taskSlots": 4,
    }
    values.update(overrides)
    return load_config(env={}, overrides=values)


def virtual_clock_config(**overrides: object) -> WorkerConfig:
    """`worker_config` for a test on Trio's virtual clock (`autojump_clock`, `mock_clock`)."""
    # Work on another thread is invisible to the virtual clock: serve on Trio's own thread.
    return worker_config(grpcLoop="trio-asyncio", **overrides)


@asynccontextmanager
async def running_worker(
    config: WorkerConfig | None = None,
    *,
    tracer: Tracer | None = None,
    healthy: bool = True,
    client: ClientSettings | None = None,
) -> AsyncIterator[Harness]:
    source = MemorySource()
    source.publish({"demo": "def add(a, b):\n    return a + b\n"})
    made: list[FakeExecutors] = []

    def executors(
        config: ExecutorPoolConfig, events: trio.MemorySendChannel[PoolEvent], clock: EpochClock
    ) -> FakeExecutors:
        made.append(FakeExecutors(config, events, clock, healthy=healthy))
        return made[0]

    stop = trio.Event()
    async with trio_asyncio.open_loop(), trio.open_nursery() as nursery:
        serving: Serving = await nursery.start(
            functools.partial(
                serve,
                config or worker_config(),
                BLOCK,
                stop=stop,
                source=source,
                executors=executors,
                tracer=tracer,
                client=client,
            )
        )
        channel = await trio_asyncio.aio_as_trio(_channel)(serving.port)
        try:
            yield Harness(
                serving=serving,
                stub=pb.WorkerServiceStub(channel),
                channel=channel,
                calls=made[0],
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
