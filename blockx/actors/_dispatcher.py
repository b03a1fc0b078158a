"""The dispatcher actor: runs the pure dispatch core against real executors.

`ExecutorPool` is the library entry point: it owns an `ExecutorPoolManager`
(the processes) and one actor task that owns a `DispatchCore` (the decisions)
and the function-code lookups executors ask for. Everything reaches the actor
as a message on one bounded inbox; nothing else touches the core.

Wire call ids are `"<call id>/<attempt>"`, so an executor's answer always names
the attempt it belongs to. Subcall ids made by a child are only unique within
that process, so the core knows them as `"<executor>#<pid>:<subcall id>"`.
"""

from __future__ import annotations

import contextlib
import itertools
import math
import random
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager

import attrs
import trio

from blockx.errors import BlockxError
from blockx.executors import (
    CallResults,
    CancelCall,
    CodeReply,
    CodeRequest,
    DownReason,
    ExecutorDown,
    ExecutorError,
    ExecutorMessage,
    ExecutorPoolConfig,
    ExecutorPoolManager,
    ExecutorUp,
    Heartbeat,
    PoolEvent,
    Subcall,
    SubcallResult,
    ToExecutor,
    encode_run_calls_frame,
)
from blockx.functions import FunctionCodeError, FunctionCodeView, UnknownModule
from blockx.phases import (
    CallErrorCode,
    CallOutcome,
    CallPhaseOutcome,
    CallPolicy,
    CallResultsArrived,
    CallsAdded,
    CallSpec,
    CancelCalls,
    ClockTicked,
    DeliverSubcallResult,
    DispatchCommand,
    DispatchCore,
    DispatchEvent,
    ExecutorJoined,
    ExecutorLeft,
    FinishCallPhase,
    RunCalls,
    SubcallRequested,
    TaskCancelled,
    TaskOpened,
)

INBOX_SIZE = 8_192
# Messages handled per wake-up before the actor re-checks its timers.
BATCH = 256


class CallsRefused(BlockxError):
    """`run_calls` was asked for something it cannot run; nothing of it ran."""

    def __init__(self, *, task_id: str, reason: str) -> None:
        self.task_id = task_id
        self.reason = reason
        super().__init__(f"calls of task {task_id!r} refused: {reason}")


@attrs.define(eq=False)
class _Waiter:
    done: trio.Event = attrs.Factory(trio.Event)
    outcome: CallPhaseOutcome | None = None


@attrs.frozen
class _RunTask:
    task_id: str
    epoch: str
    calls: tuple[CallSpec, ...]
    policy: CallPolicy


@attrs.frozen
class _CancelTask:
    task_id: str


_Inbox = _RunTask | _CancelTask | PoolEvent


def wire_call_id(call_id: str, attempt: int) -> str:
    return f"{call_id}/{attempt}"


def split_wire_call_id(wire_id: str) -> tuple[str, int]:
    call_id, _, attempt = wire_id.rpartition("/")
    return call_id, int(attempt)


class ExecutorPool:
    """Executor processes plus the dispatcher that runs tasks' calls on them.

    ```
    async with ExecutorPool(pool_config=..., code_view=view) as pool:
        outcome = await pool.run_calls("task-1", epoch, calls, CallPolicy())
    ```
    """

    def __init__(
        self,
        *,
        pool_config: ExecutorPoolConfig,
        code_view: FunctionCodeView,
        executor_capacity: int = 64,
        rng: random.Random | None = None,
    ) -> None:
        self.manager = ExecutorPoolManager(pool_config)
        self._code_view = code_view
        self._capacity = executor_capacity
        self._rng = rng or random.Random()
        self._core = DispatchCore()
        self._inbox_send, self._inbox = trio.open_memory_channel[_Inbox](INBOX_SIZE)
        self._waiters: dict[str, _Waiter] = {}
        self._epochs: dict[str, str] = {}
        self._pids: dict[str, int] = {}
        self._child_subcall_ids: dict[str, str] = {}
        # Cancellations that found the inbox full; the actor takes them next.
        self._late_cancels: set[str] = set()
        self._runs = itertools.count()

    # ------------------------------------------------------------------ API

    @asynccontextmanager
    async def _running(self) -> AsyncIterator[ExecutorPool]:
        async with trio.open_nursery() as nursery:
            await nursery.start(self.manager.run)
            nursery.start_soon(self._forward_pool_events)
            nursery.start_soon(self._actor)
            try:
                yield self
            finally:
                with trio.CancelScope(shield=True):
                    await self.manager.stop()
                nursery.cancel_scope.cancel()

    async def __aenter__(self) -> ExecutorPool:
        self._cm = self._running()
        return await self._cm.__aenter__()

    async def __aexit__(self, *exc_info: object) -> bool | None:
        return await self._cm.__aexit__(*exc_info)  # type: ignore[arg-type]

    async def wait_ready(self) -> None:
        """Until the first executor is healthy."""
        await self.manager.first_healthy.wait()

    async def run_calls(
        self, task_id: str, epoch: str, calls: Sequence[CallSpec], policy: CallPolicy
    ) -> CallPhaseOutcome:
        """Run every call of one task against function-code `epoch`; see `CallPhaseOutcome`.

        Cancelling the caller cancels the task's calls on the executors. Call ids
        must be unique within the task; one task id runs once at a time.
        """
        ids = [call.call_id for call in calls]
        if len(set(ids)) != len(ids):
            raise CallsRefused(task_id=task_id, reason="call ids repeat within the task")
        if task_id in self._waiters:
            raise CallsRefused(task_id=task_id, reason="the task is already running calls")
        # Executors answer by call id, so ids must be unique across tasks and
        # across runs of one task id (a cancelled run's late answers included).
        prefix = f"{task_id}#{next(self._runs)}:"
        calls = [
            CallSpec(call_id=prefix + call.call_id, function=call.function, args=call.args)
            for call in calls
        ]
        waiter = self._waiters[task_id] = _Waiter()
        posted = False
        try:
            await self._inbox_send.send(
                _RunTask(task_id=task_id, epoch=epoch, calls=tuple(calls), policy=policy)
            )
            posted = True
            await waiter.done.wait()
        finally:
            if waiter.outcome is None:  # the caller was cancelled
                self._waiters.pop(task_id, None)
                if posted:
                    try:
                        self._inbox_send.send_nowait(_CancelTask(task_id=task_id))
                    except trio.WouldBlock:
                        self._late_cancels.add(task_id)  # the actor is busy: it looks here
        assert waiter.outcome is not None
        return waiter.outcome

    # ----------------------------------------------------------------- actor

    async def _forward_pool_events(self) -> None:
        async for event in self.manager.events:
            await self._inbox_send.send(event)

    async def _actor(self) -> None:
        while True:
            while self._late_cancels:
                self._on_message(_CancelTask(task_id=self._late_cancels.pop()))
            due_ms = self._core.next_deadline_ms()
            deadline = math.inf if due_ms is None else due_ms / 1000
            with trio.move_on_at(deadline):
                message = await self._inbox.receive()
                self._on_message(message)
                for _ in range(BATCH):
                    try:
                        message = self._inbox.receive_nowait()
                    except trio.WouldBlock:
                        break
                    self._on_message(message)
                continue
            self._apply(ClockTicked(now_ms=self._now_ms(), draw=self._rng.random()))

    def _now_ms(self) -> int:
        return math.ceil(trio.current_time() * 1000)

    def _apply(self, event: DispatchEvent) -> None:
        self._execute(self._core.handle(event))

    def _on_message(self, message: _Inbox) -> None:
        now_ms = self._now_ms()
        match message:
            case _RunTask():
                if message.task_id in self._late_cancels:  # an earlier run of this id
                    self._late_cancels.discard(message.task_id)
                    self._on_message(_CancelTask(task_id=message.task_id))
                self._epochs[message.task_id] = message.epoch
                self._apply(
                    TaskOpened(task_id=message.task_id, policy=message.policy, now_ms=now_ms)
                )
                self._apply(
                    CallsAdded(
                        task_id=message.task_id, calls=message.calls, sealed=True, now_ms=now_ms
                    )
                )
            case _CancelTask():
                if self._epochs.pop(message.task_id, None) is not None:
                    self._apply(TaskCancelled(task_id=message.task_id, now_ms=now_ms))
            case ExecutorUp():
                self._pids[message.executor_id] = message.pid
                self._apply(
                    ExecutorJoined(
                        executor_id=message.executor_id, capacity=self._capacity, now_ms=now_ms
                    )
                )
            case ExecutorDown():
                stale = f"{message.executor_id}#{self._pids.pop(message.executor_id, 0)}:"
                for core_id in [i for i in self._child_subcall_ids if i.startswith(stale)]:
                    del self._child_subcall_ids[core_id]
                code = (
                    CallErrorCode.EXECUTOR_WEDGED
                    if message.reason is DownReason.WEDGED
                    else CallErrorCode.EXECUTOR_LOST
                )
                self._apply(
                    ExecutorLeft(
                        executor_id=message.executor_id,
                        error_code=code,
                        now_ms=now_ms,
                        draw=self._rng.random(),
                    )
                )
            case ExecutorMessage():
                self._on_executor_message(message, now_ms)

    def _on_executor_message(self, event: ExecutorMessage, now_ms: int) -> None:
        executor_id, message = event.executor_id, event.message
        match message:
            case CallResults():
                outcomes = []
                for result in message.results:
                    call_id, attempt = split_wire_call_id(result.call_id)
                    outcomes.append(
                        CallOutcome(
                            call_id=call_id,
                            attempt=attempt,
                            ok=result.ok,
                            value=result.value or b"",
                            error_code=result.error_code or "",
                            error_message=result.error_message or "",
                            retryable=result.retryable,
                        )
                    )
                self._apply(
                    CallResultsArrived(
                        executor_id=executor_id,
                        outcomes=tuple(outcomes),
                        now_ms=now_ms,
                        draw=self._rng.random(),
                    )
                )
            case Subcall():
                parent_id, parent_attempt = split_wire_call_id(message.parent_call_id)
                core_id = f"{executor_id}#{self._pids.get(executor_id, 0)}:{message.subcall_id}"
                self._child_subcall_ids[core_id] = message.subcall_id
                self._apply(
                    SubcallRequested(
                        executor_id=executor_id,
                        parent_call_id=parent_id,
                        parent_attempt=parent_attempt,
                        subcall=CallSpec(
                            call_id=core_id, function=message.function, args=message.args
                        ),
                        now_ms=now_ms,
                    )
                )
            case CodeRequest():
                self._send(executor_id, self._code_reply(message))
            case Heartbeat():
                pass  # the pool manager judges health
            case _:
                pass

    def _code_reply(self, request: CodeRequest) -> CodeReply:
        try:
            source = self._code_view.module_source(request.epoch, request.module)
        except UnknownModule:
            return CodeReply(request_id=request.request_id, source=None)
        except FunctionCodeError as exc:
            return CodeReply(request_id=request.request_id, source=None, error=str(exc))
        return CodeReply(request_id=request.request_id, source=source)

    def _execute(self, commands: list[DispatchCommand]) -> None:
        now_ms = self._now_ms()
        for command in commands:
            match command:
                case RunCalls():
                    frame = encode_run_calls_frame(
                        (
                            wire_call_id(call.call_id, call.attempt),
                            call.task_id,
                            self._epochs[call.task_id],
                            call.function,
                            call.args,
                            max(call.deadline_ms - now_ms, 1),
                        )
                        for call in command.calls
                    )
                    with contextlib.suppress(ExecutorError):  # as in _send
                        self.manager.send_frame(command.executor_id, frame)
                case CancelCalls():
                    for call_id, attempt in command.attempts:
                        self._send(
                            command.executor_id, CancelCall(call_id=wire_call_id(call_id, attempt))
                        )
                case DeliverSubcallResult():
                    outcome = command.outcome
                    child_id = self._child_subcall_ids.pop(outcome.call_id, outcome.call_id)
                    self._send(
                        command.executor_id,
                        SubcallResult(
                            subcall_id=child_id,
                            ok=outcome.ok,
                            value=outcome.value if outcome.ok else None,
                            error_code=None if outcome.ok else outcome.error_code,
                            error_message=None if outcome.ok else outcome.error_message,
                            retryable=outcome.retryable,
                        ),
                    )
                case FinishCallPhase():
                    self._epochs.pop(command.task_id, None)
                    waiter = self._waiters.pop(command.task_id, None)
                    if waiter is not None:
                        waiter.outcome = command.outcome
                        waiter.done.set()

    def _send(self, executor_id: str, message: ToExecutor) -> None:
        # A refused send means the executor is going down (its ExecutorDown
        # retries its calls) or its queue is full (the call deadline retries them).
        with contextlib.suppress(ExecutorError):
            self.manager.send(executor_id, message)
