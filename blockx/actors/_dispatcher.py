"""The dispatcher actor: runs the pure dispatch core against the executors.

It owns a `DispatchCore` (the decisions), a `CallIds` (the ids the core and
the executors use), and the function code of every task whose calls it runs,
which is what it answers executors' code requests from. It takes the slot
table's `RunTaskCalls` and `CancelTaskCalls`, a streamed task's batches from
its task actor (`AddTaskCalls`, `StreamFailed`; it counts their ends in the
task's `CallWindow`) and the executors' events from one inbox; it sends to
executors through an `ExecutorTransport` (the pool manager, or a test's fake)
and reports the end of each task's calls to the slot table as `CallsDone`.
Nothing else touches the core.

Every message becomes one event of the core (stamped with a stimulus id and
the worker clock's time, here and nowhere else), and the commands the core
answers with are carried out before the next message is taken.
"""

from __future__ import annotations

import contextlib
import math
import random
from typing import assert_never

import attrs
import trio

from blockx.actors._call_ids import CallIds
from blockx.actors._call_window import CallWindow
from blockx.actors._inbox import Inbox, take_until
from blockx.actors._messages import (
    AddTaskCalls,
    CallsDone,
    CancelTaskCalls,
    DispatcherMessage,
    RunTaskCalls,
    SlotTableMessage,
    StreamFailed,
)
from blockx.actors._readiness import Readiness
from blockx.calls import CallPhaseOutcome, CallSpec, FailureCode
from blockx.config import DispatcherSection
from blockx.dispatch import (
    CallPolicy,
    CallResultsArrived,
    CallsAdded,
    CancelCalls,
    ClockTicked,
    DeliverSubcallResult,
    DispatchCommand,
    DispatchCore,
    DispatchEvent,
    ExecutorJoined,
    ExecutorLeft,
    FinishCallPhase,
    ReplaceExecutor,
    RevokeCalls,
    RunCalls,
    SubcallRequested,
    TaskCancelled,
    TaskOpened,
)
from blockx.errors import Misuse
from blockx.executors import (
    CallResults,
    CancelCall,
    CodeReply,
    CodeRequest,
    DownReason,
    ExecutorDown,
    ExecutorError,
    ExecutorMessage,
    ExecutorTransport,
    ExecutorUp,
    RevokeCall,
    Subcall,
    SubcallResult,
    ToExecutor,
    encode_run_calls_frame,
)
from blockx.functions import FunctionCodeError, FunctionSnapshot, UnknownModule
from blockx.process.clock import EpochClock
from blockx.steps import StimulusIds

_LEFT_CODE = {DownReason.WEDGED: FailureCode.EXECUTOR_WEDGED}


class DispatcherActor:
    """The actor. Start `run` with `nursery.start`."""

    def __init__(
        self,
        *,
        inbox: Inbox[DispatcherMessage],
        transport: ExecutorTransport,
        slot_table: Inbox[SlotTableMessage],
        settings: DispatcherSection,
        clock: EpochClock,
        stimuli: StimulusIds,
        rng: random.Random | None = None,
        readiness: Readiness | None = None,
    ) -> None:
        self._receive = inbox.receive
        self._transport = transport
        self._slot_table = slot_table
        self._settings = settings
        self._clock = clock
        self._stimuli = stimuli
        self._rng = rng or random.Random()
        self._readiness = readiness or Readiness()
        self._core = DispatchCore(
            cancel_grace_ms=settings.cancel_grace_ms, queue_ms=settings.executor_queue_ms
        )
        self._ids = CallIds()
        self._code: dict[str, FunctionSnapshot] = {}  # task id -> its pinned code
        self._pids: dict[str, int] = {}
        self._streams: dict[str, tuple[str, CallWindow]] = {}
        """Streamed tasks whose calls still come: task id -> (its run's id prefix, window)."""

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        while True:
            due_ms = self._core.next_deadline_ms()
            deadline = math.inf if due_ms is None else self._clock.trio_time(due_ms)
            if not await take_until(self._receive, deadline, self._on_message):
                now_ms, stimulus_id = self._stamp("tick")
                draw = self._rng.random()
                self._apply(ClockTicked(now_ms=now_ms, stimulus_id=stimulus_id, draw=draw))

    # ---------------------------------------------------------------- events

    def _stamp(self, kind: str) -> tuple[int, str]:
        """The time and the stimulus id of an event: the one place they are given."""
        return self._clock.now_ms(), self._stimuli.stamp(kind)

    def _apply(self, event: DispatchEvent) -> None:
        self._execute(self._core.handle(event).commands, event.now_ms)
        for task_id, (_, window) in self._streams.items():
            window.ended_now(self._core.calls_ended(task_id))

    def _on_message(self, message: DispatcherMessage) -> None:
        match message:
            case RunTaskCalls():
                self._open_task(message)
            case AddTaskCalls():
                self._add_calls(message)
            case StreamFailed(task_id=task_id, outcome=outcome):
                if task_id in self._streams:
                    self._fail_stream(task_id, outcome)
            case CancelTaskCalls(task_id=task_id):
                self._end_stream(task_id)
                if self._code.pop(task_id, None) is not None:
                    now_ms, stimulus_id = self._stamp("cancel")
                    self._apply(
                        TaskCancelled(task_id=task_id, now_ms=now_ms, stimulus_id=stimulus_id)
                    )
            case ExecutorUp(executor_id=executor_id, pid=pid):
                self._pids[executor_id] = pid
                now_ms, stimulus_id = self._stamp("up")
                self._apply(
                    ExecutorJoined(
                        executor_id=executor_id,
                        capacity=self._settings.executor_capacity,
                        now_ms=now_ms,
                        stimulus_id=stimulus_id,
                    )
                )
                self._readiness.set(True)
            case ExecutorDown(executor_id=executor_id, reason=reason):
                self._ids.forget_executor(executor_id, self._pids.pop(executor_id, 0))
                now_ms, stimulus_id = self._stamp("down")
                self._apply(
                    ExecutorLeft(
                        executor_id=executor_id,
                        error_code=_LEFT_CODE.get(reason, FailureCode.EXECUTOR_LOST),
                        now_ms=now_ms,
                        stimulus_id=stimulus_id,
                        draw=self._rng.random(),
                    )
                )
                self._readiness.set(bool(self._pids))
            case ExecutorMessage():
                self._on_executor_message(message)

    def _open_task(self, message: RunTaskCalls) -> None:
        task_id = message.task_id
        if task_id in self._code:  # an earlier run the slot table has not cancelled yet
            self._on_message(CancelTaskCalls(task_id=task_id))
        ids = [call.call_id for call in message.calls]
        if len(set(ids)) != len(ids):
            refused = CallPhaseOutcome(
                ok=False,
                failure_code=FailureCode.CALLS_FAILED,
                message="call ids repeat within the task",
            )
            self._slot_table.post(CallsDone(task_id=task_id, outcome=refused))
            return
        self._code[task_id] = message.code
        policy = CallPolicy(
            retry=message.retry,
            failure_policy=message.failure_policy,
            window=self._settings.call_window,
            call_deadline_ms=self._settings.call_deadline_ms,
        )
        now_ms, stimulus_id = self._stamp("run")
        self._apply(
            TaskOpened(task_id=task_id, policy=policy, now_ms=now_ms, stimulus_id=stimulus_id)
        )
        prefix = self._ids.run_prefix(task_id)
        if message.window is not None:
            self._streams[task_id] = (prefix, message.window)
            return
        self._apply(
            CallsAdded(
                task_id=task_id,
                calls=message.calls,
                sealed=True,
                now_ms=now_ms,
                stimulus_id=stimulus_id,
                id_prefix=prefix,
            )
        )

    def _add_calls(self, message: AddTaskCalls) -> None:
        """A batch of a streamed task; ignored once its call phase is over."""
        task_id = message.task_id
        stream = self._streams.get(task_id)
        if stream is None:
            return
        prefix = stream[0]
        if message.sealed:
            self._end_stream(task_id)
        now_ms, stimulus_id = self._stamp("add")
        added = CallsAdded(
            task_id=task_id,
            calls=message.calls,
            sealed=message.sealed,
            now_ms=now_ms,
            stimulus_id=stimulus_id,
            id_prefix=prefix,
        )
        try:
            self._apply(added)
        except Misuse:  # nothing of the batch was queued
            repeated = CallPhaseOutcome(
                ok=False,
                failure_code=FailureCode.CALLS_FAILED,
                message="call ids repeat among the task's calls still running",
            )
            self._fail_stream(task_id, repeated)

    def _fail_stream(self, task_id: str, outcome: CallPhaseOutcome) -> None:
        """End a streamed task's call phase with `outcome`, cancelling what of it runs."""
        self._on_message(CancelTaskCalls(task_id=task_id))
        self._slot_table.post(CallsDone(task_id=task_id, outcome=outcome))

    def _end_stream(self, task_id: str) -> None:
        """No more calls of `task_id` are taken: its stream ended, or its call phase did."""
        stream = self._streams.pop(task_id, None)
        if stream is not None:
            stream[1].close()

    def _on_executor_message(self, event: ExecutorMessage) -> None:
        executor_id, message = event.executor_id, event.message
        match message:
            case CallResults(results=results, succeeded=succeeded):
                now_ms, stimulus_id = self._stamp("results")
                self._apply(
                    CallResultsArrived(
                        executor_id=executor_id,
                        outcomes=results,
                        succeeded=succeeded,
                        now_ms=now_ms,
                        stimulus_id=stimulus_id,
                        draw=self._rng.random(),
                    )
                )
            case Subcall():
                core_id = self._ids.subcall(
                    executor_id, self._pids.get(executor_id, 0), message.subcall_id
                )
                subcall = CallSpec(call_id=core_id, function=message.function, args=message.args)
                now_ms, stimulus_id = self._stamp("subcall")
                self._apply(
                    SubcallRequested(
                        executor_id=executor_id,
                        parent_call_id=message.parent_call_id,
                        parent_attempt=message.parent_attempt,
                        subcall=subcall,
                        now_ms=now_ms,
                        stimulus_id=stimulus_id,
                    )
                )
            case CodeRequest():
                self._send(executor_id, self._code_reply(message))
            case _:
                pass  # heartbeats: the pool manager judges health

    def _code_reply(self, request: CodeRequest) -> CodeReply:
        code = next((c for c in self._code.values() if c.epoch == request.epoch), None)
        if code is None:
            return CodeReply(
                request_id=request.request_id,
                source=None,
                error=f"no running task uses function code epoch {request.epoch!r}",
            )
        try:
            source = code.source_of(request.module)
        except UnknownModule:
            return CodeReply(request_id=request.request_id, source=None)
        except FunctionCodeError as exc:
            return CodeReply(request_id=request.request_id, source=None, error=str(exc))
        return CodeReply(request_id=request.request_id, source=source)

    # -------------------------------------------------------------- commands

    def _execute(self, commands: tuple[DispatchCommand, ...], now_ms: int) -> None:
        for command in commands:
            match command:
                case RunCalls(executor_id=executor_id, calls=calls):
                    frame = encode_run_calls_frame(
                        (
                            call.call_id,
                            call.attempt,
                            call.task_id,
                            self._code[call.task_id].epoch,
                            call.function,
                            call.args,
                            max(call.deadline_ms - now_ms, 1),
                        )
                        for call in calls
                    )
                    # Out now unless more messages wait: then it goes with their frames.
                    at_once = not self._receive.statistics().current_buffer_used
                    with contextlib.suppress(ExecutorError):  # as in _send
                        self._transport.send_frame(executor_id, frame, at_once=at_once)
                case CancelCalls(executor_id=executor_id, attempts=attempts):
                    for call_id, attempt in attempts:
                        self._send(executor_id, CancelCall(call_id=call_id, attempt=attempt))
                case RevokeCalls(executor_id=executor_id, attempts=attempts):
                    for call_id, attempt in attempts:
                        self._send(executor_id, RevokeCall(call_id=call_id, attempt=attempt))
                case DeliverSubcallResult(executor_id=executor_id, outcome=outcome):
                    own_id = self._ids.executor_subcall_id(outcome.call_id)
                    self._send(
                        executor_id, SubcallResult(outcome=attrs.evolve(outcome, call_id=own_id))
                    )
                case ReplaceExecutor(executor_id=executor_id, why=why):
                    self._transport.replace(executor_id, why)
                case FinishCallPhase(task_id=task_id, outcome=outcome):
                    self._end_stream(task_id)
                    self._code.pop(task_id, None)
                    self._slot_table.post(CallsDone(task_id=task_id, outcome=outcome))
                case _:
                    assert_never(command)

    def _send(self, executor_id: str, message: ToExecutor) -> None:
        # A refused send means the executor is going down (its ExecutorDown
        # retries its calls) or its queue is full (the call deadline retries them).
        with contextlib.suppress(ExecutorError):
            self._transport.send(executor_id, message)
