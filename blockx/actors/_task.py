"""The task actor: one per admitted task, running Builder -> Calls -> Plugin.

It pins the task's function-code epoch, reports activation, and then runs
each phase when the slot-table actor says so, reporting every outcome back.
It decides nothing about the task's state: an outcome is a report, and what
happens next is the slot table's answer. The slot-table actor ends it by
cancelling its scope (task deadline, drain, any terminal result); whatever
the task started (calls on executors included) is cancelled with it.

Every failure inside a phase becomes that phase's failed outcome, so the task
always converges to a terminal result and nothing escapes into the worker's
task nursery.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Protocol, TypeVar

import attrs
import trio

from blockx.actors._dispatcher import CallsRefused
from blockx.actors._messages import (
    ActivationDone,
    ActivationRefused,
    PhaseDone,
    SlotTableMessage,
)
from blockx.actors._timer import WorkerClock
from blockx.errors import BlockxError
from blockx.functions import FunctionCodeView
from blockx.observability.logs import TaskLog
from blockx.observability.tracing import NOT_TRACED, TaskTracing
from blockx.phases import CallPhaseOutcome, CallPolicy, CallSpec
from blockx.phases.builders import BuilderRegistry, BuildRequest
from blockx.phases.plugins import PhaseFailed, WriteRequest, WriterRegistry
from blockx.slots import (
    CallFailurePolicy,
    CallStats,
    FailureCode,
    PhaseOutcome,
    PrepareTaskActivation,
    StartBuilderPhase,
    StartCallPhase,
    StartWriterPhase,
    TaskPhase,
)

logger = logging.getLogger("blockx.task")

PHASE_IO_TIMED_OUT = "PHASE_IO_TIMEOUT"
PLUGIN_NOT_FOUND = "PLUGIN_NOT_FOUND"

T = TypeVar("T")

PhaseCommand = StartBuilderPhase | StartCallPhase | StartWriterPhase


class CallRunner(Protocol):
    """Runs one task's calls to the end (`ExecutorPool` in the worker)."""

    async def run_calls(
        self, task_id: str, epoch: str, calls: Sequence[CallSpec], policy: CallPolicy
    ) -> CallPhaseOutcome: ...


@attrs.frozen(kw_only=True)
class Admission:
    """How many tasks may be in each phase at once, worker-wide."""

    builder: trio.Semaphore
    executor: trio.Semaphore
    plugin: trio.Semaphore
    scan: trio.Semaphore

    @classmethod
    def of(cls, *, builder: int, executor: int, plugin: int, scan: int) -> Admission:
        return cls(
            builder=trio.Semaphore(builder),
            executor=trio.Semaphore(executor),
            plugin=trio.Semaphore(plugin),
            scan=trio.Semaphore(scan),
        )


@attrs.frozen(kw_only=True)
class TaskRuntime:
    """What every task actor shares: code, registries, executors and limits."""

    clock: WorkerClock
    code_view: FunctionCodeView
    calls: CallRunner
    builders: BuilderRegistry
    writers: WriterRegistry
    admission: Admission
    phase_io_timeout_ms: int
    call_window: int
    call_deadline_ms: int
    to_slot_table: Callable[[SlotTableMessage], None]
    tracing: TaskTracing = attrs.field(factory=TaskTracing.disabled)
    """Spans of tasks and phases; records nothing unless tracing is configured."""


async def run_task(
    runtime: TaskRuntime,
    command: PrepareTaskActivation,
    scope: trio.CancelScope,
    phases: trio.MemoryReceiveChannel[PhaseCommand],
) -> None:
    """The task actor's whole life; returns once its last report is posted or it is cancelled."""
    # A scope cancelled before the actor ran: the task already has its result
    # (the slot table's hooks have seen it), so no span is opened for it.
    task = _TaskRun(runtime, command, traced=not scope.cancel_called)
    with scope, task.log.bound():
        try:
            await task.run(phases)
        finally:
            task.release()


class _TaskRun:
    def __init__(
        self, runtime: TaskRuntime, command: PrepareTaskActivation, *, traced: bool
    ) -> None:
        self._rt = runtime
        self._command = command
        self._spec = command.spec
        self._task_id = command.task_id
        self.log = TaskLog(logger, task_id=command.task_id, slot_id=command.slot_id)
        self.log.set_phase(TaskPhase.PREPARING.value)
        self._trace = (
            runtime.tracing.task_started(command.task_id, command.slot_id) if traced else NOT_TRACED
        )
        self._epoch: str | None = None
        self._calls: Sequence[CallSpec] = ()
        self._outputs: tuple[bytes, ...] = ()

    async def run(self, phases: trio.MemoryReceiveChannel[PhaseCommand]) -> None:
        if not self._activate():
            return
        async for command in phases:
            phase = _PHASE_OF[type(command)]
            self.log.set_phase(phase.value)
            handler = self._spec.result_handler
            self._trace.phase_started(phase, writer=handler.type if handler is not None else "")
            match command:
                case StartBuilderPhase():
                    outcome = await self._guarded(TaskPhase.BUILDER, self._build)
                case StartCallPhase():
                    outcome = await self._guarded(TaskPhase.CALLS, self._run_calls)
                case StartWriterPhase():
                    outcome = await self._guarded(TaskPhase.PLUGIN, self._write)
            self._trace.phase_ended(outcome)
            self._rt.to_slot_table(PhaseDone(task_id=self._task_id, phase=phase, outcome=outcome))
            if phase is TaskPhase.PLUGIN:
                return

    def release(self) -> None:
        if self._epoch is not None:
            self._rt.code_view.unpin(self._task_id, self._rt.clock.now_ms())
            self._epoch = None

    def _activate(self) -> bool:
        try:
            self._epoch = self._rt.code_view.pin(self._task_id, self._rt.clock.now_ms())
        except BlockxError as error:
            self._rt.to_slot_table(
                ActivationRefused(
                    task_id=self._task_id,
                    failure_code=FailureCode.ACTIVATION_FAILED,
                    message=f"cannot pin function code: {error}",
                    retryable=True,
                )
            )
            return False
        self.log.set_epoch(self._epoch)
        self._trace.epoch_pinned(self._epoch)
        self._rt.to_slot_table(
            ActivationDone(
                task_id=self._task_id, slot_id=self._command.slot_id, task_code_epoch=self._epoch
            )
        )
        return True

    async def _guarded(
        self, phase: TaskPhase, body: Callable[[], Awaitable[PhaseOutcome]]
    ) -> PhaseOutcome:
        try:
            return await body()
        except Exception as error:  # a bug in a builder or writer must not take the worker down
            self.log.exception("task %s: %s phase raised", self._task_id, phase.value)
            return PhaseOutcome(ok=False, message=f"{phase.value.lower()} raised {error!r}")

    async def _build(self) -> PhaseOutcome:
        kind = self._spec.function_call.type
        builder = self._rt.builders.get(kind)
        if builder is None:
            known = ", ".join(self._rt.builders.names()) or "none"
            return PhaseOutcome(
                ok=False,
                failure_code=FailureCode.BUILDER_NOT_FOUND,
                message=f"no builder {kind!r} in this worker (known: {known})",
            )
        request = BuildRequest(
            task_id=self._task_id,
            function_call=self._spec.function_call,
            payload=self._spec.payload,
            task_code_epoch=self._epoch or "",
            labels=self._spec.labels,
        )
        calls = await self._bounded(
            f"builder {kind!r}", self._rt.admission.builder, lambda: builder.build(request)
        )
        if isinstance(calls, PhaseOutcome):
            return calls
        self._calls = calls
        return PhaseOutcome(ok=True, call_count=len(calls))

    async def _run_calls(self) -> PhaseOutcome:
        retry = self._command.retry_policy
        policy = CallPolicy(
            max_attempts=retry.max_attempts,
            base_backoff_ms=retry.base_backoff_ms,
            jitter_percent=retry.jitter_percent,
            fail_fast=self._spec.call_failure_policy is CallFailurePolicy.FAIL_FAST,
            window=self._rt.call_window,
            call_deadline_ms=self._rt.call_deadline_ms,
        )
        calls, self._calls = self._calls, ()
        async with self._rt.admission.executor:
            try:
                outcome = await self._rt.calls.run_calls(
                    self._task_id, self._epoch or "", calls, policy
                )
            except CallsRefused as error:
                return PhaseOutcome(ok=False, message=error.reason)
        self._outputs = outcome.outputs
        return _calls_outcome(outcome)

    async def _write(self) -> PhaseOutcome:
        handler = self._spec.result_handler
        outputs, self._outputs = self._outputs, ()
        if handler is None:
            return PhaseOutcome(ok=True)
        writer = self._rt.writers.get(handler.type)
        if writer is None:
            known = ", ".join(self._rt.writers.names()) or "none"
            return PhaseOutcome(
                ok=False,
                failure_code=PLUGIN_NOT_FOUND,
                message=f"no writer plugin {handler.type!r} in this worker (known: {known})",
            )
        request = WriteRequest(
            task_id=self._task_id,
            handler=handler,
            outputs=outputs,
            task_code_epoch=self._epoch or "",
        )
        result = await self._bounded(
            f"writer plugin {handler.type!r}",
            self._rt.admission.plugin,
            lambda: writer.write(request),
        )
        if isinstance(result, PhaseOutcome):
            return result
        return PhaseOutcome(ok=result.ok, plugin_results=(result,))

    async def _bounded(
        self, what: str, admission: trio.Semaphore, work: Callable[[], Awaitable[T]]
    ) -> T | PhaseOutcome:
        """`work` under its phase's admission and the phase IO timeout; a refusal as an outcome."""
        timeout_ms = self._rt.phase_io_timeout_ms
        async with admission:
            try:
                with trio.fail_after(timeout_ms / 1000):
                    return await work()
            except PhaseFailed as error:
                return PhaseOutcome(
                    ok=False,
                    failure_code=error.code,
                    message=error.message,
                    retryable=error.retryable,
                )
            except trio.TooSlowError:
                return PhaseOutcome(
                    ok=False,
                    failure_code=PHASE_IO_TIMED_OUT,
                    message=f"{what} took longer than phaseIoTimeoutMs ({timeout_ms})",
                    retryable=True,
                )


_PHASE_OF: dict[type, TaskPhase] = {
    StartBuilderPhase: TaskPhase.BUILDER,
    StartCallPhase: TaskPhase.CALLS,
    StartWriterPhase: TaskPhase.PLUGIN,
}


def _calls_outcome(outcome: CallPhaseOutcome) -> PhaseOutcome:
    stats = outcome.stats
    message = outcome.message
    if outcome.ok and outcome.failures:
        first = outcome.failures[0]
        message = (
            f"{len(outcome.failures)} call(s) failed; first: {first.call_id} "
            f"{first.function} {first.error_code}: {first.error_message}"
        )
    return PhaseOutcome(
        ok=outcome.ok,
        failure_code=outcome.failure_code or None,
        message=message,
        retryable=outcome.retryable,
        call_stats=CallStats(
            calls_total=stats.calls_total,
            calls_succeeded=stats.calls_succeeded,
            calls_failed=stats.calls_failed,
            calls_retried=stats.calls_retried,
        ),
        output_count=len(outcome.outputs),
        output_bytes=sum(len(value) for value in outcome.outputs),
    )
