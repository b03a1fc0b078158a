"""The call engine: executor processes and the dispatcher as a library, without the service.

`CallEngine.open` starts the executors (`ExecutorPoolManager` unless told
otherwise) and a `DispatcherActor`, and stands in for the slot table the
dispatcher reports to: `run_calls` hands it one task's calls and waits for
that task's `CallsDone`. Cancelling the caller cancels the task's calls.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Sequence

import trio

from blockx.actors._assembly import TransportFactory
from blockx.actors._dispatcher import DispatcherActor
from blockx.actors._inbox import Inbox
from blockx.actors._messages import (
    CallsDone,
    CancelTaskCalls,
    DispatcherMessage,
    RunTaskCalls,
    SlotTableMessage,
)
from blockx.calls import CallFailurePolicy, CallPhaseOutcome, CallSpec, RetryPolicy
from blockx.config import DispatcherSection, default_config
from blockx.errors import Misuse
from blockx.executors import ExecutorPoolConfig, ExecutorPoolManager, ExecutorTransport
from blockx.functions import FunctionSnapshot
from blockx.process.clock import EpochClock
from blockx.steps import StimulusIds

DEFAULT_RETRY = default_config().worker.slot_config().default_retry_policy
"""The worker's default retry policy."""


class CallEngine:
    """Runs tasks' calls on executor processes. Make it with `async with CallEngine.open(...)`."""

    def __init__(self, *, inbox: Inbox[DispatcherMessage], transport: ExecutorTransport) -> None:
        self._inbox = inbox
        self.transport = transport
        self._waiting: dict[str, trio.MemorySendChannel[CallPhaseOutcome]] = {}

    @classmethod
    @contextlib.asynccontextmanager
    async def open(
        cls,
        pool_config: ExecutorPoolConfig,
        *,
        settings: DispatcherSection | None = None,
        executors: TransportFactory = ExecutorPoolManager,
    ) -> AsyncIterator[CallEngine]:
        """Start the executors and the dispatcher; stop both on exit."""
        clock = EpochClock()
        inbox = Inbox[DispatcherMessage]()
        reports = Inbox[SlotTableMessage]()
        transport = executors(pool_config, inbox.sender, clock)
        engine = cls(inbox=inbox, transport=transport)
        dispatcher = DispatcherActor(
            inbox=inbox,
            transport=transport,
            slot_table=reports,
            settings=settings or default_config().dispatcher,
            clock=clock,
            stimuli=StimulusIds(),
        )
        async with trio.open_nursery() as nursery:
            await nursery.start(transport.run)
            await nursery.start(dispatcher.run)
            nursery.start_soon(engine._take_reports, reports)
            try:
                yield engine
            finally:
                with trio.CancelScope(shield=True):
                    await transport.stop()
                nursery.cancel_scope.cancel()

    async def wait_ready(self) -> None:
        """Until the first executor is healthy."""
        await self.transport.first_healthy.wait()

    async def run_calls(
        self,
        task_id: str,
        code: FunctionSnapshot,
        calls: Sequence[CallSpec],
        *,
        retry: RetryPolicy = DEFAULT_RETRY,
        failure_policy: CallFailurePolicy = CallFailurePolicy.FAIL_FAST,
    ) -> CallPhaseOutcome:
        """Run every call of `task_id` against `code`; its calls ids must be unique."""
        if task_id in self._waiting:
            raise Misuse(what=f"task {task_id!r} is already running calls")
        send, receive = trio.open_memory_channel[CallPhaseOutcome](1)
        self._waiting[task_id] = send
        run = RunTaskCalls(
            task_id=task_id,
            code=code,
            calls=tuple(calls),
            retry=retry,
            failure_policy=failure_policy,
        )
        self._inbox.post(run)
        try:
            return await receive.receive()
        finally:
            if self._waiting.pop(task_id, None) is not None:  # the caller was cancelled
                self._inbox.post(CancelTaskCalls(task_id=task_id))

    async def _take_reports(self, reports: Inbox[SlotTableMessage]) -> None:
        async for report in reports.receive:
            if isinstance(report, CallsDone):
                waiter = self._waiting.pop(report.task_id, None)
                if waiter is not None:
                    waiter.send_nowait(report.outcome)
