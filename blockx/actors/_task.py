"""The task actor: one per task whose builder or plugin must wait on IO.

The slot-table actor activates a task itself: it finds the task's builder and
plugin (`activate`; a task naming a builder or plugin this worker lacks is
refused there, before any phase runs, so no call is wasted on a task that
could never store its outputs) and pins its code. It runs the call phase of
every task (its calls go to the dispatcher under executor admission, and the
dispatcher's `CallsDone` comes back to it), an `InlineBuilder`'s build
(`build_inline`), an `InlinePlugin`'s store (`store_inline`) and an absent
plugin phase in its own step. A task actor is started for the first phase
that must wait: a builder doing IO, a plugin doing IO (or an inline plugin
that declined). It runs that phase when the slot table says so and reports
the outcome (with the builder's calls); the plugin gets the outputs from the
command that starts its phase. It decides nothing about the task's state: an outcome is a report,
and what happens next is the slot table's answer. The slot-table actor ends it
by cancelling its scope (task deadline, drain, any terminal result).

Every failure inside a phase becomes that phase's failed outcome, so the task
always converges to a terminal result and nothing escapes into the worker's
task nursery.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import TypeVar

import attrs
import trio

from blockx.actors._call_window import CallWindow
from blockx.actors._inbox import Inbox
from blockx.actors._messages import (
    AddTaskCalls,
    DispatcherMessage,
    PhaseDone,
    SlotTableMessage,
    StreamFailed,
)
from blockx.calls import CallPhaseOutcome, CallSpec, FailureCode
from blockx.functions import FunctionSnapshot
from blockx.io import IOSystem, TaskIOScope
from blockx.observability.logs import TaskLog
from blockx.phases import PhaseFailed, UnknownName
from blockx.phases.builders import Builder, BuilderRegistry, BuildRequest
from blockx.phases.plugins import Plugin, PluginRegistry, PluginRequest
from blockx.slots import (
    PhaseOutcome,
    PluginResult,
    PrepareTaskActivation,
    StartBuilderPhase,
    StartCallPhase,
    StartPhase,
    StartPluginPhase,
    TaskPhase,
    TaskSpec,
)

logger = logging.getLogger("blockx.task")

T = TypeVar("T")


@attrs.frozen(kw_only=True)
class Admission:
    """How many tasks may be in each phase at once, worker-wide."""

    builder: trio.Semaphore
    executor: int
    """Tasks in the call phase: the slot-table actor counts them itself."""
    plugin: trio.Semaphore
    scan: int
    """Streamed tasks in the call phase (their scans read meanwhile): counted likewise."""

    @classmethod
    def of(cls, *, builder: int, executor: int, plugin: int, scan: int) -> Admission:
        return cls(
            builder=trio.Semaphore(builder),
            executor=executor,
            plugin=trio.Semaphore(plugin),
            scan=scan,
        )


@attrs.frozen(kw_only=True)
class TaskRuntime:
    """What every task actor shares: registries, limits and the inboxes it reports to."""

    builders: BuilderRegistry
    plugins: PluginRegistry
    admission: Admission
    phase_io_timeout_ms: int
    slot_table: Inbox[SlotTableMessage]
    dispatcher: Inbox[DispatcherMessage]
    """Where a streamed task's actor sends its calls."""
    io: IOSystem
    stream_build: bool = False
    """`streamBuild.enabled`: a `StreamingBuilder`'s calls run while it reads."""
    pending_calls: int = 128
    """`streamBuild.pendingCalls`."""


@attrs.frozen(kw_only=True)
class Activation:
    """What a task runs with, found before its actor starts."""

    builder: Builder
    plugin: Plugin | None
    """None if the task has no result handler."""
    build_now: Callable[[BuildRequest], list[CallSpec]] | None = None
    """The builder's `InlineBuilder.build_now`, if it has one."""
    store_now: Callable[[PluginRequest], PluginResult | None] | None = None
    """The plugin's `InlinePlugin.run_now`, if it has one."""
    stream: Callable[[BuildRequest], AsyncIterator[Sequence[CallSpec]]] | None = None
    """The builder's `StreamingBuilder.stream`, if it has one and `streamBuild.enabled`."""


@attrs.frozen(kw_only=True)
class Refusal:
    """Why a task cannot be activated here."""

    failure_code: FailureCode
    message: str
    retryable: bool = False
    """BUILDER_NOT_FOUND and PLUGIN_NOT_FOUND are not: a worker's builders and plugins are
    fixed when it starts."""


def activate(runtime: TaskRuntime, spec: TaskSpec) -> Activation | Refusal:
    """Find the task's builder and plugin, or refuse the task naming what it lacks."""
    try:
        builder = runtime.builders.require(spec.function_call.type)
    except UnknownName as error:
        return Refusal(failure_code=FailureCode.BUILDER_NOT_FOUND, message=str(error))
    handler = spec.result_handler
    try:
        plugin = None if handler is None else runtime.plugins.require(handler.type)
    except UnknownName as error:
        return Refusal(failure_code=FailureCode.PLUGIN_NOT_FOUND, message=str(error))
    stream = getattr(builder, "stream", None) if runtime.stream_build else None
    return Activation(
        builder=builder,
        plugin=plugin,
        build_now=None if stream is not None else getattr(builder, "build_now", None),
        store_now=getattr(plugin, "run_now", None),
        stream=stream,
    )


def build_inline(
    build_now: Callable[[BuildRequest], list[CallSpec]],
    command: PrepareTaskActivation,
    epoch: str,
    io: TaskIOScope | None = None,
) -> tuple[PhaseOutcome, tuple[CallSpec, ...]]:
    """Run an `InlineBuilder` in the caller's step: the builder phase's outcome, and its
    calls, as a task actor would have reported them."""
    try:
        calls = build_now(_build_request(command, epoch, io))
    except PhaseFailed as error:
        return _failed(error), ()
    except Exception as error:
        log = TaskLog(logger, task_id=command.task_id, slot_id=command.slot_id)
        phase = TaskPhase.BUILDER.value
        log.set_phase(phase)
        log.set_epoch(epoch)
        log.exception("task %s: %s phase raised", command.task_id, phase)
        return _raised(TaskPhase.BUILDER, error), ()
    return PhaseOutcome(ok=True, call_count=len(calls)), tuple(calls)


def store_inline(
    store_now: Callable[[PluginRequest], PluginResult | None],
    command: PrepareTaskActivation,
    epoch: str,
    outputs: tuple[bytes, ...],
    io: TaskIOScope | None = None,
) -> PhaseOutcome | None:
    """Run an `InlinePlugin` in the caller's step: the plugin phase's outcome, as a task
    actor would have reported it; None if the plugin declined (its task actor runs it)."""
    request = _plugin_request(command, epoch, outputs, io)
    log = TaskLog(logger, task_id=command.task_id, slot_id=command.slot_id)
    log.set_phase(TaskPhase.PLUGIN.value)
    log.set_epoch(epoch)
    with log.bound():  # what the plugin logs carries the task's fields
        try:
            result = store_now(request)
        except PhaseFailed as error:
            return _failed(error)
        except Exception as error:
            log.exception("task %s: %s phase raised", command.task_id, TaskPhase.PLUGIN.value)
            return _raised(TaskPhase.PLUGIN, error)
    if result is None:
        return None
    return PhaseOutcome(ok=result.ok, plugin_results=(result,))


def _plugin_request(
    command: PrepareTaskActivation, epoch: str, outputs: tuple[bytes, ...], io: TaskIOScope | None
) -> PluginRequest:
    """What the task's plugin is given, inline or in the task actor."""
    handler = command.spec.result_handler
    assert handler is not None  # a task with a plugin has a result handler
    return PluginRequest(
        task_id=command.task_id,
        handler=handler,
        outputs=outputs,
        task_code_epoch=epoch,
        io=io,
    )


def _build_request(
    command: PrepareTaskActivation, epoch: str, io: TaskIOScope | None
) -> BuildRequest:
    """What the task's builder is given, inline or in the task actor."""
    spec = command.spec
    return BuildRequest(
        task_id=command.task_id,
        function_call=spec.function_call,
        payload=spec.payload,
        task_code_epoch=epoch,
        labels=spec.labels,
        io=io,
    )


def _raised(phase: TaskPhase, error: Exception) -> PhaseOutcome:
    return PhaseOutcome(ok=False, message=f"{phase.value.lower()} raised {error!r}")


def _failed(error: PhaseFailed) -> PhaseOutcome:
    return PhaseOutcome(
        ok=False, failure_code=error.code, message=error.message, retryable=error.retryable
    )


@attrs.frozen(kw_only=True)
class TaskStart:
    """What the slot-table actor hands a new task actor."""

    command: PrepareTaskActivation
    activation: Activation
    code: FunctionSnapshot
    """The function code pinned for the task."""
    scope: trio.CancelScope
    phases: trio.MemoryReceiveChannel[StartPhase]
    """The commands that start its phases, in order."""
    io: TaskIOScope
    """The task's IO scope, which the slot-table actor opened and will close."""
    window: CallWindow | None = None
    """A streamed task's: shared with the dispatcher, which counts its calls' ends."""


async def run_task(runtime: TaskRuntime, start: TaskStart) -> None:
    """The task actor's whole life; returns once its last report is posted or it is cancelled."""
    task = _TaskRun(runtime, start)
    with start.scope, task.log.bound():
        try:
            await task.run()
        finally:
            await task.close_stream()


class _TaskRun:
    def __init__(self, runtime: TaskRuntime, start: TaskStart) -> None:
        self._rt = runtime
        self._start = start
        self._spec = start.command.spec
        self._task_id = start.command.task_id
        self.log = TaskLog(logger, task_id=self._task_id, slot_id=start.command.slot_id)
        self.log.set_phase(TaskPhase.PREPARING.value)
        self.log.set_epoch(start.code.epoch)
        self._calls: tuple[CallSpec, ...] = ()
        self._builder = start.activation.builder
        self._plugin = start.activation.plugin
        self._batches: AsyncIterator[Sequence[CallSpec]] | None = None
        """A streamed task's calls still to read; `_first` is the batch already read."""
        self._first: Sequence[CallSpec] | None = None

    async def run(self) -> None:
        phase = await self._next()
        while phase is not None:
            self.log.set_phase(phase.phase.value)
            match phase:
                case StartBuilderPhase():
                    await self._run_phase(phase, self._build)
                case StartCallPhase():
                    await self._produce()
                case StartPluginPhase(outputs=outputs):
                    await self._run_phase(phase, lambda: self._store(outputs))
                    return
            if self._plugin is None and self._batches is None:
                return  # nothing else for the actor to run
            phase = await self._next()

    async def close_stream(self) -> None:
        """Close a streamed task's reads (they may hold a cursor), even when cancelled."""
        batches, self._batches = self._batches, None
        aclose = getattr(batches, "aclose", None)
        if aclose is not None:
            with trio.move_on_after(self._rt.phase_io_timeout_ms / 1000, shield=True):
                try:
                    await aclose()
                except Exception:
                    self.log.exception(
                        "task %s: closing the builder's stream raised", self._task_id
                    )

    async def _next(self) -> StartPhase | None:
        """The next phase command; one already waiting is taken without a trip through the
        scheduler (the next checkpoint still sees a cancellation)."""
        phases = self._start.phases
        try:
            return phases.receive_nowait()
        except trio.WouldBlock:
            pass
        except trio.EndOfChannel:
            return None
        try:
            return await phases.receive()
        except trio.EndOfChannel:
            return None

    async def _run_phase(
        self, command: StartPhase, body: Callable[[], Awaitable[PhaseOutcome]]
    ) -> None:
        """Run the phase `command` started and report how it ended. A bug in a builder or
        plugin fails its phase, never the worker."""
        phase = command.phase
        try:
            outcome = await body()
        except Exception as error:
            self.log.exception("task %s: %s phase raised", self._task_id, phase.value)
            outcome = _raised(phase, error)
        calls, self._calls = self._calls, ()
        report = PhaseDone(task_id=self._task_id, phase=phase, outcome=outcome, calls=calls)
        self._rt.slot_table.post(report)

    async def _build(self) -> PhaseOutcome:
        builder = self._builder
        request = _build_request(self._start.command, self._start.code.epoch, self._start.io)
        stream = self._start.activation.stream
        if stream is not None:
            return await self._prepare_stream(stream(request))
        calls = await self._bounded(
            f"builder {self._spec.function_call.type!r}",
            self._rt.admission.builder,
            lambda: builder.build(request),
        )
        if isinstance(calls, PhaseOutcome):
            return calls
        self._calls = tuple(calls)
        return PhaseOutcome(ok=True, call_count=len(calls))

    async def _prepare_stream(self, batches: AsyncIterator[Sequence[CallSpec]]) -> PhaseOutcome:
        """A streamed task's builder phase: open its stream and read the first batch (a
        builder refusing its config fails here, before the call phase)."""
        self._batches = batches
        first = await self._bounded(
            f"builder {self._spec.function_call.type!r}",
            self._rt.admission.builder,
            lambda: anext(batches, None),
        )
        if isinstance(first, PhaseOutcome):
            return first
        self._first = first
        return PhaseOutcome(ok=True, call_count=len(first or ()), streaming=True)

    async def _produce(self) -> None:
        """A streamed task's call phase: send its calls to the dispatcher as they are read,
        while its window has room; the end of the stream seals them. A failed read ends the
        call phase (`StreamFailed`) with the builder's failure."""
        window, batches = self._start.window, self._batches
        assert window is not None
        assert batches is not None
        post = self._rt.dispatcher.post
        batch, self._first = self._first, None
        what = f"builder {self._spec.function_call.type!r}"
        timeout_ms = self._rt.phase_io_timeout_ms
        outcome: CallPhaseOutcome | None = None
        try:
            while batch is not None:
                window.add(len(batch))
                post(AddTaskCalls(task_id=self._task_id, calls=tuple(batch), sealed=False))
                await window.wait_for_room()
                if window.closed:
                    return  # the call phase is over: what is still unread is not wanted
                with trio.fail_after(timeout_ms / 1000):
                    batch = await anext(batches, None)
            post(AddTaskCalls(task_id=self._task_id, calls=(), sealed=True))
            self.log.info("task %s: %s streamed %d calls", self._task_id, what, window.sent)
        except PhaseFailed as error:
            outcome = CallPhaseOutcome(
                ok=False, failure_code=error.code, message=error.message, retryable=error.retryable
            )
        except trio.TooSlowError:
            outcome = CallPhaseOutcome(
                ok=False,
                failure_code=FailureCode.PHASE_IO_TIMEOUT,
                message=f"{what} took longer than phaseIoTimeoutMs ({timeout_ms}) to read "
                "its next calls",
                retryable=True,
            )
        except Exception as error:
            self.log.exception("task %s: %s raised while streaming", self._task_id, what)
            outcome = CallPhaseOutcome(
                ok=False,
                failure_code=FailureCode.BUILDER_FAILED,
                message=f"{what} raised {error!r} while streaming",
            )
        finally:
            await self.close_stream()
        if outcome is not None:
            post(StreamFailed(task_id=self._task_id, outcome=outcome))

    async def _store(self, outputs: tuple[bytes, ...]) -> PhaseOutcome:
        handler = self._spec.result_handler
        plugin = self._plugin
        if handler is None or plugin is None:
            return PhaseOutcome(ok=True)
        start = self._start
        request = _plugin_request(start.command, start.code.epoch, outputs, start.io)
        result = await self._bounded(
            f"plugin {handler.type!r}", self._rt.admission.plugin, lambda: plugin.run(request)
        )
        if isinstance(result, PhaseOutcome):
            return result
        return PhaseOutcome(ok=result.ok, plugin_results=(result,))

    async def _bounded(
        self, what: str, admission: trio.Semaphore, work: Callable[[], Awaitable[T]]
    ) -> T | PhaseOutcome:
        """`work` under its phase's admission and the phase IO timeout; a refusal as an outcome."""
        timeout_ms = self._rt.phase_io_timeout_ms
        await _acquire(admission)
        try:
            with trio.fail_after(timeout_ms / 1000):
                return await work()
        except PhaseFailed as error:
            return _failed(error)
        except trio.TooSlowError:
            return PhaseOutcome(
                ok=False,
                failure_code=FailureCode.PHASE_IO_TIMEOUT,
                message=f"{what} took longer than phaseIoTimeoutMs ({timeout_ms})",
                retryable=True,
            )
        finally:
            admission.release()


async def _acquire(admission: trio.Semaphore) -> None:
    """Take `admission` (release it in a `finally`); a free one is taken without a trip
    through the scheduler."""
    try:
        admission.acquire_nowait()
    except trio.WouldBlock:
        await admission.acquire()
