"""The slot-table actor: the one owner of the worker's `SlotMachine`.

Every request, report, watch change and timer scan reaches the machine
through this actor's inbox, one at a time; the commands the machine answers
with are carried out here before the next message is taken: task actors are
started in the worker's task nursery, told to run their next phase or
cancelled, and every change of a task's state or phase is published to the
watch hub. The actor never waits on anyone it talks to.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable, Sequence

import attrs
import trio

from blockx.actors._messages import (
    ActivationDone,
    ActivationRefused,
    ForceDrain,
    Forget,
    GetResult,
    GetStatus,
    OpenWatch,
    PhaseDone,
    Publish,
    RequestSlot,
    SlotTableMessage,
    StartDrain,
    SubmitTask,
    Subscribe,
    TimersDue,
    WatchChanged,
    WatchHubMessage,
    WorkerStatus,
)
from blockx.actors._task import PhaseCommand, TaskRuntime, run_task
from blockx.actors._timer import TimerActor, WorkerClock
from blockx.slots import (
    ActivationFailed,
    ActivationPrepared,
    Command,
    ConvergeTask,
    DrainDeadlinePassed,
    DrainStarted,
    Event,
    FailureCode,
    ForgetReason,
    ForgetTask,
    MachineMisuse,
    NotFound,
    PhaseFinished,
    PrepareTaskActivation,
    SlotMachine,
    SlotRequested,
    StartBuilderPhase,
    StartCallPhase,
    StartWriterPhase,
    Step,
    TaskResult,
    TaskSnapshot,
    TaskSubmitted,
    TimerFired,
    WatchAttached,
    WatchDetached,
    WatchDisconnected,
    WorkerError,
)

logger = logging.getLogger("blockx.slots")

# Client requests waiting in the inbox beyond this are refused at the edge.
MAX_BACKLOG = 4_096
# Phase commands in flight to one task actor: at most one at a time.
PHASE_BUFFER = 1


@attrs.define(eq=False)
class _TaskActor:
    scope: trio.CancelScope
    phases: trio.MemorySendChannel[PhaseCommand]


class SlotTableActor:
    def __init__(
        self,
        machine: SlotMachine,
        *,
        clock: WorkerClock,
        to_hub: Callable[[WatchHubMessage], None],
        on_finished: Sequence[Callable[[TaskResult], None]] = (),
    ) -> None:
        """`on_finished` hooks see every terminal result (logs, metrics); they must not block."""
        self.machine = machine
        self._on_finished = tuple(on_finished)
        self._clock = clock
        self._to_hub = to_hub
        self._send, self._receive = trio.open_memory_channel[SlotTableMessage](float("inf"))
        self._tasks: dict[str, _TaskActor] = {}
        self._stimuli = itertools.count(1)
        self._timer: TimerActor | None = None
        self._runtime: TaskRuntime | None = None
        self._task_nursery: trio.Nursery | None = None
        self.drained = trio.Event()
        """Set once draining started and no task is live any more."""

    # ---------------------------------------------------------------- edge

    def post(self, message: SlotTableMessage) -> None:
        """From other actors: always taken."""
        self._send.send_nowait(message)

    def admit(self, message: SlotTableMessage) -> bool:
        """From clients: False (nothing queued) when the backlog is full."""
        if self._send.statistics().current_buffer_used >= MAX_BACKLOG:
            return False
        self._send.send_nowait(message)
        return True

    # --------------------------------------------------------------- actor

    async def run(
        self, *, runtime: TaskRuntime, timer: TimerActor, task_nursery: trio.Nursery
    ) -> None:
        """Take messages until cancelled. Task actors run in `task_nursery`."""
        self._runtime = runtime
        self._timer = timer
        self._task_nursery = task_nursery
        async for message in self._receive:
            try:
                self._on_message(message)
            except MachineMisuse:
                # A report the machine cannot accept is a runtime bug; the
                # worker keeps serving and the log keeps the evidence.
                logger.exception("slot table refused %r; recent: %r", message, self._recent())
            deadline = self.machine.next_deadline_ms()
            if deadline is not None:
                timer.wake_at(deadline)
            if self.machine.draining and self.machine.active_task_count() == 0:
                self.drained.set()

    def _recent(self) -> tuple[object, ...]:
        return self.machine.recent_stimuli[-5:]

    def _stimulus(self, kind: str) -> str:
        return f"{kind}-{next(self._stimuli)}"

    def _on_message(self, message: SlotTableMessage) -> None:
        now_ms = self._clock.now_ms()
        match message:
            case RequestSlot(task_id=task_id, ttl_ms=ttl_ms, reply=reply):
                event: Event = SlotRequested(
                    task_id=task_id, ttl_ms=ttl_ms, now_ms=now_ms, stimulus_id=self._stimulus("rq")
                )
                self._request(event, reply)
            case SubmitTask(spec=spec, slot_id=slot_id, reply=reply):
                event = TaskSubmitted(
                    spec=spec, slot_id=slot_id, now_ms=now_ms, stimulus_id=self._stimulus("sub")
                )
                self._request(event, reply)
            case GetResult(task_id=task_id, reply=reply):
                try:
                    snapshot = self.machine.get_result(task_id)
                except WorkerError as error:
                    reply(error)
                else:
                    reply(snapshot)
            case GetStatus(reply=reply):
                reply(
                    WorkerStatus(
                        heartbeat=self.machine.heartbeat(now_ms),
                        slots=self.machine.slot_views(),
                    )
                )
            case OpenWatch(stream=stream):
                snapshots = []
                for task_id in stream.task_ids:
                    try:
                        snapshots.append(self.machine.get_result(task_id))
                    except NotFound as error:
                        stream.fail(error)
                        return
                self._to_hub(Subscribe(stream=stream, snapshots=tuple(snapshots)))
            case ActivationDone(task_id=task_id, slot_id=slot_id, task_code_epoch=epoch):
                self._apply(
                    ActivationPrepared(
                        task_id=task_id, slot_id=slot_id, task_code_epoch=epoch, now_ms=now_ms
                    )
                )
            case ActivationRefused():
                self._apply(
                    ActivationFailed(
                        task_id=message.task_id,
                        failure_code=message.failure_code,
                        message=message.message,
                        retryable=message.retryable,
                        now_ms=now_ms,
                    )
                )
            case PhaseDone(task_id=task_id, phase=phase, outcome=outcome):
                self._apply(
                    PhaseFinished(task_id=task_id, phase=phase, outcome=outcome, now_ms=now_ms)
                )
            case WatchChanged(task_id=task_id, attached=attached, broken=broken):
                if attached:
                    self._apply(WatchAttached(task_id=task_id, now_ms=now_ms))
                elif broken:
                    self._apply(WatchDisconnected(task_id=task_id, now_ms=now_ms))
                else:
                    self._apply(WatchDetached(task_id=task_id, now_ms=now_ms))
            case TimersDue():
                for timer in self.machine.due_timers(now_ms):
                    self._apply(TimerFired(timer=timer, now_ms=now_ms))
            case StartDrain():
                self._apply(DrainStarted(now_ms=now_ms, stimulus_id=self._stimulus("drain")))
            case ForceDrain():
                self._apply(DrainDeadlinePassed(now_ms=now_ms, stimulus_id=self._stimulus("force")))

    def _request(self, event: Event, reply: Callable[[TaskSnapshot | WorkerError], None]) -> None:
        try:
            step = self.machine.handle(event)
        except WorkerError as error:
            reply(error)
            return
        assert step.reply is not None
        reply(step.reply)
        self._execute(step)

    def _apply(self, event: Event) -> None:
        self._execute(self.machine.handle(event))

    # ------------------------------------------------------------ commands

    def _execute(self, step: Step) -> None:
        for command in step.commands:
            self._carry_out(command)

    def _carry_out(self, command: Command) -> None:
        match command:
            case PrepareTaskActivation():
                self._start_task(command)
                self._publish(command.task_id)
            case StartBuilderPhase() | StartCallPhase() | StartWriterPhase():
                actor = self._tasks.get(command.task_id)
                if actor is not None:
                    actor.phases.send_nowait(command)
                self._publish(command.task_id)
            case ConvergeTask(task_id=task_id, result=result):
                actor = self._tasks.pop(task_id, None)
                if actor is not None:
                    actor.scope.cancel()
                    actor.phases.close()
                self._to_hub(Publish(snapshot=TaskSnapshot.of_result(result)))
                for hook in self._on_finished:
                    hook(result)
            case ForgetTask(task_id=task_id, reason=reason):
                if reason is not ForgetReason.RESULT_PURGED:  # a reservation ended
                    self._to_hub(Forget(task_id=task_id))

    def _start_task(self, command: PrepareTaskActivation) -> None:
        assert self._runtime is not None
        assert self._task_nursery is not None
        send, receive = trio.open_memory_channel[PhaseCommand](PHASE_BUFFER)
        scope = trio.CancelScope()
        try:
            self._task_nursery.start_soon(
                run_task, self._runtime, command, scope, receive, name=f"task {command.task_id}"
            )
        except RuntimeError:  # the task nursery has closed: the worker is stopping
            self.post(
                ActivationRefused(
                    task_id=command.task_id,
                    failure_code=FailureCode.WORKER_SHUTDOWN,
                    message="the worker is shutting down",
                    retryable=True,
                )
            )
            return
        self._tasks[command.task_id] = _TaskActor(scope=scope, phases=send)

    def _publish(self, task_id: str) -> None:
        self._to_hub(Publish(snapshot=self.machine.get_result(task_id)))

    @property
    def live_task_actors(self) -> int:
        return len(self._tasks)
