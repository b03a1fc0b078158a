"""The slot-table actor: the one owner of the worker's `SlotMachine` and `FunctionCodeView`.

Every request, report, watch change and code change reaches the machine
through this actor's inbox, one at a time, and it wakes up on its own when
the machine's next timer is due. Each message becomes events of the machine,
stamped here with the worker clock's time and a stimulus id, and the commands
the machine answers with are carried out before the next message is taken.
A task's call phase, an `InlineBuilder`'s build, an `InlinePlugin`'s store and an
absent plugin phase run here (`_start_phase`; executor admission, and scan
admission for a streamed task's call phase, are counted here); a task actor is
started (with the code pinned for the task) in the task nursery for a phase
that must wait, told to run its next phase or cancelled. Calls are cancelled
in the dispatcher, and every change of a task is published to the watch fan-out
and to the task's trace. The actor never waits on anyone it talks to. Others
read its state only through its inbox (`GetStatus`, `GetResult`).
"""

from __future__ import annotations

import collections
import logging
from collections.abc import Callable, Sequence

import attrs
import trio

from blockx.actors._call_window import CallWindow
from blockx.actors._inbox import Inbox, Reply, take_until
from blockx.actors._messages import (
    CallsDone,
    CancelTask,
    CancelTaskCalls,
    CloseAllStreams,
    CodeLoaded,
    DispatcherMessage,
    ForceDrain,
    GetResult,
    GetStatus,
    MarkReady,
    OpenWatch,
    PhaseDone,
    RequestSlot,
    RunFedTask,
    RunTaskCalls,
    SlotTableMessage,
    StartDrain,
    SubmitTask,
    Subscribe,
    Unsubscribe,
    WatchChanged,
    WorkerStatus,
)
from blockx.actors._retained import RetainedSnapshots
from blockx.actors._streams import HubStream
from blockx.actors._task import (
    Activation,
    Refusal,
    TaskRuntime,
    TaskStart,
    activate,
    build_inline,
    run_task,
    store_inline,
)
from blockx.actors._watch import WatchFanout
from blockx.calls import CallSpec, FailureCode
from blockx.errors import Misuse
from blockx.functions import FunctionCodeError, FunctionCodeView, FunctionSnapshot
from blockx.io import IOScopeError, TaskIOScope
from blockx.observability.tracing import TaskTracing
from blockx.process.clock import EpochClock
from blockx.slots import (
    ActivationFailed,
    ActivationPrepared,
    CallsFinished,
    Command,
    ConvergeTask,
    DrainDeadlinePassed,
    DrainStarted,
    Event,
    ForgetReason,
    ForgetTask,
    NoSlot,
    PhaseFinished,
    PhaseOutcome,
    PrepareTaskActivation,
    SlotMachine,
    SlotRequested,
    StartBuilderPhase,
    StartCallPhase,
    StartPhase,
    StartPluginPhase,
    Step,
    TaskCancelled,
    TaskPhase,
    TaskResult,
    TaskSnapshot,
    TaskSpec,
    TaskSubmitted,
    TimerFired,
    WatchAttached,
    WatchDetached,
    WatchDisconnected,
    WorkerError,
    WorkerReady,
)
from blockx.steps import StimulusIds

logger = logging.getLogger("blockx.slots")

TICK_MS = 500
"""The longest the actor sleeps without looking at its timers and purging old code."""
PHASE_BUFFER = 1
"""Phase commands in flight to one task actor: at most one at a time."""
_NOTHING = PhaseOutcome(ok=True)
_RESERVATION_ENDED = frozenset({ForgetReason.LEASE_EXPIRED, ForgetReason.WORKER_SHUTDOWN})
"""Forgets of a task that never ran: streams still on it are told it is not found. A
result purged or evicted had its streams end when it was published."""


@attrs.define(eq=False)
class FreeSlots:
    """Published by the slot table: how many slots a new task could take now (none while it
    admits nothing), and a wake-up for a change."""

    count: int = 0
    _changed: trio.Event = attrs.Factory(trio.Event)

    def update(self, count: int) -> None:
        if count != self.count:
            self.count = count
            self._changed.set()
            self._changed = trio.Event()

    async def changed(self) -> None:
        """Until `count` changes."""
        await self._changed.wait()


@attrs.define(eq=False)
class _TaskActor:
    scope: trio.CancelScope
    phases: trio.MemorySendChannel[StartPhase]


@attrs.define(eq=False)
class _Gate:
    """An admission of call phases the slot table counts: executor admission, or scan
    admission for streamed tasks (their calls run while their scans read)."""

    free: int
    waiting: collections.deque[_LiveTask] = attrs.Factory(collections.deque)
    """Tasks in the call phase waiting for it, oldest first."""


@attrs.define(eq=False)
class _LiveTask:
    """An activated task. Its call phase, its `InlineBuilder`'s build, its `InlinePlugin`'s
    store and an absent plugin phase run here, in this actor's own step; its task actor is
    started for the first phase that must wait (a builder or a plugin doing IO, an inline
    plugin that declined)."""

    command: PrepareTaskActivation
    activation: Activation
    code: FunctionSnapshot
    io: TaskIOScope
    """Opened at activation, closed when the task ends (`_end_task`)."""
    calls: tuple[CallSpec, ...] = ()
    """What its builder phase built, for its call phase."""
    holds: _Gate | None = None
    """The admission its call phase holds, until the task's next phase or its end."""
    actor: _TaskActor | None = None
    window: CallWindow | None = None
    """A streamed task's (`Activation.stream`), shared by its actor and the dispatcher."""
    call_phase: StartCallPhase | None = None
    """A streamed task's command that started its call phase, for its actor once admitted."""

    @property
    def plugin(self) -> str:
        """The type of the task's result handler ("" without one), for its trace."""
        handler = self.command.spec.result_handler
        return handler.type if handler is not None else ""


class SlotTableActor:
    """The actor. Start `run` with `nursery.start`; task actors run in `task_nursery`."""

    def __init__(
        self,
        *,
        machine: SlotMachine,
        code: FunctionCodeView,
        inbox: Inbox[SlotTableMessage],
        fanout: WatchFanout,
        dispatcher: Inbox[DispatcherMessage],
        runtime: TaskRuntime,
        task_nursery: trio.Nursery,
        clock: EpochClock,
        stimuli: StimulusIds,
        tracing: TaskTracing,
        on_finished: Sequence[Callable[[TaskResult], None]] = (),
    ) -> None:
        """`on_finished` hooks see every terminal result (logs, metrics); they must not block."""
        self._machine = machine
        self._code = code
        self._receive = inbox.receive
        self._fanout = fanout
        self._dispatcher = dispatcher
        self._runtime = runtime
        self._task_nursery = task_nursery
        self._clock = clock
        self._stimuli = stimuli
        self._tracing = tracing
        self._on_finished = (tracing.task_finished, *on_finished)
        self._tasks: dict[str, _LiveTask] = {}
        self._held: collections.deque[SubmitTask] = collections.deque()
        """Submits from `RunTasks` streams waiting for a free slot, oldest first."""
        self._slot_freed = False
        self._executor = _Gate(free=runtime.admission.executor)
        self._scan = _Gate(free=runtime.admission.scan)
        self.drained = trio.Event()
        """Published: set once draining started and no task is live any more."""
        self.free_slots = FreeSlots(count=self._admitting())
        """Published: the slots a new task could take, updated after each batch of messages."""
        self.retained = RetainedSnapshots()
        """Published: the terminal snapshots of retained results, changed in the step the
        machine retains or forgets one."""

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        while True:
            due_ms = self._machine.next_deadline_ms()
            wake_ms = self._clock.now_ms() + TICK_MS
            deadline = self._clock.trio_time(wake_ms if due_ms is None else min(due_ms, wake_ms))
            if not await take_until(self._receive, deadline, self._take):
                self._on_timers_due()
            if self._slot_freed:
                self._slot_freed = False
                self._admit_held()
            self.free_slots.update(self._admitting())
            if self._machine.draining and self._machine.active_task_count() == 0:
                self.drained.set()

    def _admitting(self) -> int:
        """The free slots, or none while the worker admits nothing (no executor is up, or
        it is draining)."""
        machine = self._machine
        return machine.free_capacity() if machine.ready and not machine.draining else 0

    def _take(self, message: SlotTableMessage) -> None:
        try:
            self._on_message(message)
        except Misuse:
            # A report the machine cannot accept is a runtime bug; the worker
            # keeps serving and the log keeps the evidence.
            recent = self._machine.recent_stimuli[-5:]
            logger.exception("slot table refused %r; recent: %r", message, recent)

    # ------------------------------------------------------------ messages

    def _stamp(self, kind: str) -> tuple[int, str]:
        """The time and the stimulus id of an event: the one place they are given."""
        return self._clock.now_ms(), self._stimuli.stamp(kind)

    def _on_message(self, message: SlotTableMessage) -> None:
        match message:
            case RunFedTask(spec=spec, stream=fed, reply=reply):
                self._submit_followed(spec, None, reply, fed)
            case RequestSlot() | SubmitTask() | GetResult() | GetStatus() | OpenWatch():
                self._on_request(message)
            case PhaseDone() | CallsDone():
                self._on_report(message)
            case WatchChanged(task_id=task_id, attached=attached, broken=broken):
                now_ms, stimulus_id = self._stamp("watch")
                kind = WatchAttached if attached else WatchDisconnected if broken else WatchDetached
                self._apply(kind(task_id=task_id, now_ms=now_ms, stimulus_id=stimulus_id))
            case CodeLoaded(snapshot=snapshot):
                try:
                    self._code.observe(snapshot, self._clock.now_ms())
                except FunctionCodeError as error:
                    logger.warning("function code epoch %s refused: %s", snapshot.epoch, error)
            case MarkReady(ready=ready):
                now_ms, stimulus_id = self._stamp("ready")
                self._apply(WorkerReady(now_ms=now_ms, stimulus_id=stimulus_id, ready=ready))
            case StartDrain():
                self._slot_freed = True  # held submits are refused now
                now_ms, stimulus_id = self._stamp("drain")
                self._apply(DrainStarted(now_ms=now_ms, stimulus_id=stimulus_id))
            case ForceDrain():
                now_ms, stimulus_id = self._stamp("force")
                self._apply(DrainDeadlinePassed(now_ms=now_ms, stimulus_id=stimulus_id))
            case Subscribe(stream=stream, snapshots=snapshots):
                self._fanout.subscribe(stream, snapshots)
            case Unsubscribe(stream=stream, broken=broken):
                self._fanout.unsubscribe(stream, broken=broken)
            case CloseAllStreams():
                self._fanout.close_all()
            case CancelTask(task_id=task_id, failure_code=code, message=reason):
                now_ms, stimulus_id = self._stamp("cancel")
                self._apply(
                    TaskCancelled(
                        task_id=task_id,
                        failure_code=code,
                        message=reason,
                        now_ms=now_ms,
                        stimulus_id=stimulus_id,
                    )
                )

    def _on_request(
        self, message: RequestSlot | SubmitTask | GetResult | GetStatus | OpenWatch
    ) -> None:
        match message:
            case RequestSlot(task_id=task_id, ttl_ms=ttl_ms, reply=reply):
                now_ms, stimulus_id = self._stamp("reserve")
                event: Event = SlotRequested(
                    task_id=task_id, ttl_ms=ttl_ms, now_ms=now_ms, stimulus_id=stimulus_id
                )
                self._request(event, reply)
            case SubmitTask(stream=stream) if stream is not None:
                if stream.held or not self._submit_streamed(message):
                    stream.held += 1  # behind its stream's earlier ones: order is kept
                    self._held.append(message)
            case SubmitTask(spec=spec, slot_id=slot_id, reply=reply):
                now_ms, stimulus_id = self._stamp("submit")
                event = TaskSubmitted(
                    spec=spec, slot_id=slot_id, now_ms=now_ms, stimulus_id=stimulus_id
                )
                self._request(event, reply)
            case GetResult(task_id=task_id, reply=result_reply):
                try:
                    result_reply(self._machine.get_result(task_id))
                except WorkerError as error:
                    result_reply(error)
            case GetStatus(reply=status_reply):
                status_reply(self._status())
            case OpenWatch(stream=stream):
                try:
                    snapshots = self._machine.get_results(stream.task_ids)
                except WorkerError as error:
                    stream.fail(error)
                    return
                self._fanout.subscribe(stream, snapshots)

    def _on_report(self, message: PhaseDone | CallsDone) -> None:
        now_ms, stimulus_id = self._stamp("report")
        event: Event
        match message:
            case PhaseDone(task_id=task_id, phase=phase, outcome=outcome, calls=calls):
                self._tracing.phase_ended(task_id, outcome)
                if calls and (task := self._tasks.get(task_id)) is not None:
                    task.calls = calls
                event = PhaseFinished(
                    task_id=task_id,
                    phase=phase,
                    outcome=outcome,
                    now_ms=now_ms,
                    stimulus_id=stimulus_id,
                )
            case CallsDone(task_id=task_id, outcome=calls_outcome):
                self._tracing.phase_ended(task_id, calls_outcome)
                event = CallsFinished(
                    task_id=task_id, outcome=calls_outcome, now_ms=now_ms, stimulus_id=stimulus_id
                )
        self._apply(event)

    def _on_timers_due(self) -> None:
        for timer in self._machine.due_timers(self._clock.now_ms()):
            now_ms, stimulus_id = self._stamp("timer")
            self._apply(TimerFired(timer=timer, now_ms=now_ms, stimulus_id=stimulus_id))
        for epoch in self._code.purge(self._clock.now_ms()):
            logger.info("function code epoch %s purged", epoch)

    def _status(self) -> WorkerStatus:
        slots = self._machine.slot_views()
        retained_results, retained_bytes = self._machine.retained()
        return WorkerStatus(
            heartbeat=self._machine.heartbeat(self._clock.now_ms()),
            slots=slots,
            tasks=tuple(
                self._machine.get_result(slot.task_id) for slot in slots if slot.task_id is not None
            ),
            waiting_submits=len(self._held),
            retained_results=retained_results,
            retained_bytes=retained_bytes,
        )

    def _request(self, event: Event, reply: Reply[TaskSnapshot]) -> None:
        try:
            step = self._machine.handle(event)
        except WorkerError as error:
            reply(error)
            return
        assert step.reply is not None
        reply(step.reply)
        self._execute(step)

    def _submit_streamed(self, message: SubmitTask) -> bool:
        """Submit from a stream; False (nothing changed) when it must wait for a free slot."""
        stream = message.stream
        assert stream is not None
        return self._submit_followed(
            message.spec, message.slot_id, message.reply, stream, wait=message.slot_id is None
        )

    def _submit_followed(
        self,
        spec: TaskSpec,
        slot_id: str | None,
        reply: Reply[TaskSnapshot],
        stream: HubStream,
        *,
        wait: bool = False,
    ) -> bool:
        """Submit a task that `stream` follows once accepted; with `wait`, False (nothing
        changed) when it must wait for a free slot."""
        now_ms, stimulus_id = self._stamp("submit")
        event = TaskSubmitted(spec=spec, slot_id=slot_id, now_ms=now_ms, stimulus_id=stimulus_id)
        try:
            step = self._machine.handle(event)
        except WorkerError as error:
            if wait and isinstance(error, NoSlot):
                return False
            reply(error)
            return True
        assert step.reply is not None
        reply(step.reply)
        if not step.reply.is_terminal:
            self._fanout.follow(stream, spec.task_id)
        self._execute(step)
        return True

    def _admit_held(self) -> None:
        """A slot was freed (or admission changed): admit held submits, oldest first."""
        while self._held:
            message = self._held[0]
            stream = message.stream
            assert stream is not None
            if not stream.abandoned and not self._submit_streamed(message):
                return
            self._held.popleft()
            stream.held -= 1

    def _apply(self, event: Event) -> None:
        self._execute(self._machine.handle(event))

    # ------------------------------------------------------------ commands

    def _execute(self, step: Step) -> None:
        for command in step.commands:
            self._carry_out(command)

    def _carry_out(self, command: Command) -> None:
        match command:
            case PrepareTaskActivation():
                self._publish(command.task_id)
                self._start_task(command)
            case StartBuilderPhase() | StartCallPhase() | StartPluginPhase():
                self._start_phase(command)
            case ConvergeTask(task_id=task_id, result=result):
                self._slot_freed = True
                self._end_task(task_id, result)
            case ForgetTask(task_id=task_id, reason=reason):
                self._slot_freed = True
                self.retained.forgotten(task_id)
                if reason in _RESERVATION_ENDED:  # streams still on it are told
                    self._fanout.forget(task_id)

    def _start_phase(self, command: StartPhase) -> None:
        task_id = command.task_id
        task = self._tasks.get(task_id)
        self._publish(task_id)
        if task is None:
            return
        self._tracing.phase_started(task_id, command.phase, task.plugin)
        if task.holds is not None:
            self._release(task)
        match command:
            case StartCallPhase():
                task.call_phase = command
                gate = self._scan if task.window is not None else self._executor
                gate.waiting.append(task)
                self._admit_calls(gate)
            case StartBuilderPhase() if task.activation.build_now is not None:
                outcome, task.calls = build_inline(
                    task.activation.build_now, task.command, task.code.epoch, task.io
                )
                self._on_report(PhaseDone(task_id=task_id, phase=command.phase, outcome=outcome))
            case StartPluginPhase() if not task.plugin:
                # No result handler: the phase has nothing to do and succeeds here.
                self._on_report(PhaseDone(task_id=task_id, phase=command.phase, outcome=_NOTHING))
            case StartPluginPhase(outputs=outputs) if task.activation.store_now is not None:
                stored = store_inline(
                    task.activation.store_now, task.command, task.code.epoch, outputs, task.io
                )
                if stored is None:  # declined: too much for a step
                    self._to_actor(task, command)
                else:
                    self._on_report(PhaseDone(task_id=task_id, phase=command.phase, outcome=stored))
            case _:
                self._to_actor(task, command)

    def _to_actor(self, task: _LiveTask, command: StartPhase) -> None:
        """Have the task's actor (started now if it has none) run the phase `command` starts."""
        if task.actor is None:
            task.actor = self._start_actor(task)
        task.actor.phases.send_nowait(command)

    def _admit_calls(self, gate: _Gate) -> None:
        """Hand the calls of tasks waiting for `gate` to the dispatcher, oldest first, while
        it is free; a streamed task's actor is told to send its calls itself."""
        waiting = gate.waiting
        while gate.free and waiting:
            task = waiting.popleft()
            task_id = task.command.task_id
            if self._tasks.get(task_id) is not task:
                continue  # it ended while it waited
            gate.free -= 1
            task.holds = gate
            calls, task.calls = task.calls, ()
            self._dispatcher.post(
                RunTaskCalls(
                    task_id=task_id,
                    code=task.code,
                    calls=calls,
                    retry=task.command.retry_policy,
                    failure_policy=task.command.spec.call_failure_policy,
                    window=task.window,
                )
            )
            if task.window is not None and task.actor is not None and task.call_phase:
                # Streamed: its builder's actor reads on and sends the calls as it goes.
                task.actor.phases.send_nowait(task.call_phase)

    def _release(self, task: _LiveTask) -> None:
        gate, task.holds = task.holds, None
        assert gate is not None
        gate.free += 1
        self._admit_calls(gate)

    def _start_task(self, command: PrepareTaskActivation) -> None:
        """Activate the task; or fail it at once, before any phase, if it cannot run here."""
        task_id = command.task_id
        self._tracing.task_started(task_id, command.slot_id)
        now_ms, stimulus_id = self._stamp("activate")
        activated = self._activate(command, now_ms)
        if isinstance(activated, Refusal):
            self._apply(
                ActivationFailed(
                    task_id=task_id,
                    failure_code=activated.failure_code,
                    message=activated.message,
                    retryable=activated.retryable,
                    now_ms=now_ms,
                    stimulus_id=stimulus_id,
                )
            )
            return
        self._tasks[task_id] = activated
        self._apply(
            ActivationPrepared(
                task_id=task_id,
                slot_id=command.slot_id,
                task_code_epoch=activated.code.epoch,
                now_ms=now_ms,
                stimulus_id=stimulus_id,
            )
        )

    def _activate(self, command: PrepareTaskActivation, now_ms: int) -> _LiveTask | Refusal:
        """Find the task's builder and plugin, pin its code and open its IO scope; or say
        why it cannot run here."""
        found = activate(self._runtime, command.spec)
        if isinstance(found, Refusal):
            return found
        task_id = command.task_id
        try:
            epoch = self._code.pin(task_id, now_ms)
        except FunctionCodeError as error:
            return Refusal(
                failure_code=FailureCode.ACTIVATION_FAILED,
                message=f"cannot pin function code: {error}",
                retryable=True,
            )
        self._tracing.epoch_pinned(task_id, epoch)
        try:
            io = self._runtime.io.open_scope(task_id)
        except IOScopeError as error:
            self._code.unpin(task_id, now_ms)
            return Refusal(
                failure_code=FailureCode.IO_SCOPE_FAILED,
                message=f"cannot open the task's IO scope: {error.message}",
                retryable=True,
            )
        return _LiveTask(command=command, activation=found, code=self._code.snapshot(epoch), io=io)

    def _start_actor(self, task: _LiveTask) -> _TaskActor:
        phases: tuple[trio.MemorySendChannel[StartPhase], trio.MemoryReceiveChannel[StartPhase]]
        phases = trio.open_memory_channel(PHASE_BUFFER)
        send, receive = phases
        command = task.command
        if task.activation.stream is not None:
            task.window = CallWindow(self._runtime.pending_calls)
        start = TaskStart(
            command=command,
            activation=task.activation,
            code=task.code,
            scope=trio.CancelScope(),
            phases=receive,
            io=task.io,
            window=task.window,
        )
        name = f"task {command.task_id}"
        self._task_nursery.start_soon(run_task, self._runtime, start, name=name)
        return _TaskActor(scope=start.scope, phases=send)

    def _end_task(self, task_id: str, result: TaskResult) -> None:
        task = self._tasks.pop(task_id, None)
        if task is not None:
            if task.actor is not None:
                task.actor.scope.cancel()
                task.actor.phases.close()
            if not task.io.close():  # it holds connections: they close off this actor
                self._task_nursery.start_soon(task.io.aclose, name=f"close IO of {task_id}")
        if result.phase is TaskPhase.CALLS:
            self._dispatcher.post(CancelTaskCalls(task_id=task_id))
        if task is not None and task.holds is not None:
            self._release(task)  # after the cancel: the next calls go in behind it
        if self._code.pinned_epoch(task_id) is not None:
            self._code.unpin(task_id, self._clock.now_ms())
        snapshot = TaskSnapshot.of_result(result)
        self.retained.retained(snapshot)  # ConvergeTask: the machine retains every result
        self._fanout.publish(snapshot)
        for hook in self._on_finished:
            hook(result)

    def _publish(self, task_id: str) -> None:
        """A live task's change, for the streams that want it (a `RunTasks` stream needs only
        the terminal update, which `_end_task` sends)."""
        if self._fanout.wants_changes(task_id):
            self._fanout.publish(self._machine.get_result(task_id))
