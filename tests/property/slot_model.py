"""A deliberately simple reference model of the slot table.

It tracks task ids only (not which slot each holds) and predicts, for every
stimulus, either the error class or the reply's (state, phase) and a
normalised list of commands. The state-machine test compares these with what
`SlotMachine` does.
"""

from __future__ import annotations

import attrs

from blockx.calls import FailureCode
from blockx.slots import (
    Command,
    ConvergeTask,
    ForgetReason,
    ForgetTask,
    InvalidArgument,
    InvalidSlot,
    NoSlot,
    PrepareTaskActivation,
    SlotConfig,
    SlotUncertain,
    StartBuilderPhase,
    StartCallPhase,
    StartPluginPhase,
    Step,
    TaskPhase,
    TaskState,
    Unavailable,
    WorkerError,
)

Reply = tuple[TaskState, TaskPhase | None]
Norm = tuple[object, ...]

NEXT_PHASE = {TaskPhase.BUILDER: TaskPhase.CALLS, TaskPhase.CALLS: TaskPhase.PLUGIN}
DEFAULT_CODE = {
    TaskPhase.PREPARING: FailureCode.ACTIVATION_FAILED,
    TaskPhase.BUILDER: FailureCode.BUILDER_FAILED,
    TaskPhase.CALLS: FailureCode.CALLS_FAILED,
    TaskPhase.PLUGIN: FailureCode.PLUGIN_FAILED,
}


@attrs.frozen
class Prediction:
    error: type[WorkerError] | None = None
    reply: Reply | None = None
    commands: tuple[Norm, ...] = ()


def normalise_command(command: Command) -> Norm:
    match command:
        case PrepareTaskActivation():
            return ("prepare", command.task_id, command.deadline_ms)
        case StartBuilderPhase():
            return ("builder", command.task_id)
        case StartCallPhase():
            return ("calls", command.task_id)
        case StartPluginPhase():
            return ("plugin", command.task_id, command.outputs)
        case ConvergeTask():
            result = command.result
            return (
                "converge",
                command.task_id,
                result.state,
                result.failure_code,
                result.retryable,
            )
        case ForgetTask():
            return ("forget", command.task_id, command.reason)
    raise AssertionError(f"unexpected command {command!r}")


def is_eviction(command: Command) -> bool:
    return isinstance(command, ForgetTask) and command.reason is ForgetReason.RESULT_EVICTED


def normalise_step(step: Step) -> Prediction:
    """The step as the model predicts it; evictions are left out: they depend on the
    sizes of results the model learns only from the step (see `SlotModel.retain`)."""
    reply = None if step.reply is None else (step.reply.state, step.reply.phase)
    commands = tuple(normalise_command(c) for c in step.commands if not is_eviction(c))
    return Prediction(reply=reply, commands=commands)


@attrs.define
class ModelTask:
    lease_expires_at: int | None
    lease_seq: int
    phase: TaskPhase | None = None
    deadline: int | None = None
    deadline_seq: int = 0
    attached: bool = False
    lost: bool = False
    grace_deadline: int | None = None
    grace_seq: int = 0

    @property
    def submitted(self) -> bool:
        return self.phase is not None


@attrs.define
class ModelResult:
    state: TaskState
    purge_at: int
    seq: int
    size: int | None = None
    """`TaskResult.retained_bytes`, learned from the step that made the result."""


@attrs.define
class SlotModel:
    config: SlotConfig
    live: dict[str, ModelTask] = attrs.Factory(dict)
    results: dict[str, ModelResult] = attrs.Factory(dict)
    """Oldest first."""
    evicted: dict[str, ModelResult] = attrs.Factory(dict)
    """Results evicted to keep the rest under the byte bound, until their purge time."""
    ready: bool = False
    draining: bool = False
    seq: int = 0

    def _next_seq(self) -> int:
        self.seq += 1
        return self.seq

    def reply_of(self, task_id: str) -> Reply | None:
        task = self.live.get(task_id)
        if task is not None:
            return (TaskState.RUNNING if task.submitted else TaskState.ALLOCATED, task.phase)
        result = self.results.get(task_id)
        if result is not None:
            return (result.state, TaskPhase.TERMINAL)
        return None

    def retained(self) -> tuple[int, int]:
        return len(self.results), sum(result.size or 0 for result in self.results.values())

    def retain(self, task_id: str, size: int) -> tuple[Norm, ...]:
        """The result of `task_id` just made costs `size`: evict the oldest results until
        the sized ones fit `result_retention_bytes`, never the newest. Returns the
        evictions, in order."""
        self.results[task_id].size = size
        evictions: list[Norm] = []
        while True:
            sized = {key: kept.size for key, kept in self.results.items() if kept.size is not None}
            if len(sized) <= 1 or sum(sized.values()) <= self.config.result_retention_bytes:
                return tuple(evictions)
            oldest = next(iter(sized))
            self.evicted[oldest] = self.results.pop(oldest)
            evictions.append(("forget", oldest, ForgetReason.RESULT_EVICTED))

    # -------------------------------------------------------------- stimuli

    def request_slot(self, task_id: str, ttl_ms: int, now: int) -> Prediction:
        if not 0 <= ttl_ms <= self.config.max_task_timeout_ms:
            return Prediction(error=InvalidArgument)
        task = self.live.get(task_id)
        if task is not None and not task.submitted:
            assert task.lease_expires_at is not None
            if now >= task.lease_expires_at:
                return Prediction(error=SlotUncertain)
        known = self.reply_of(task_id)
        if known is not None:
            return Prediction(reply=known)
        if self.draining or not self.ready:
            return Prediction(error=Unavailable)
        if len(self.live) >= self.config.task_slots:
            return Prediction(error=NoSlot)
        self._reserve(task_id, ttl_ms or self.config.default_ttl_ms, now)
        return Prediction(reply=(TaskState.ALLOCATED, None))

    def submit(
        self, task_id: str, *, slot_given: bool, own_slot: bool, timeout_ms: int, now: int
    ) -> Prediction:
        if not 0 <= timeout_ms <= self.config.max_task_timeout_ms:
            return Prediction(error=InvalidArgument)
        foreign_slot = slot_given and not own_slot
        task = self.live.get(task_id)
        if task is not None and task.submitted:
            return Prediction(reply=self.reply_of(task_id))
        if task_id in self.results:
            return Prediction(reply=self.reply_of(task_id))
        if task is not None:
            assert task.lease_expires_at is not None
            if foreign_slot:
                return Prediction(error=InvalidSlot)
            if now >= task.lease_expires_at:
                return Prediction(error=SlotUncertain)
            if self.draining or not self.ready:
                return Prediction(error=Unavailable)
        else:
            if slot_given:
                return Prediction(error=InvalidSlot)
            if self.draining or not self.ready:
                return Prediction(error=Unavailable)
            if len(self.live) >= self.config.task_slots:
                return Prediction(error=NoSlot)
            task = self._reserve(task_id, self.config.default_ttl_ms, now)
        timeout = min(timeout_ms or self.config.task_deadline_ms, self.config.max_task_timeout_ms)
        task.phase = TaskPhase.PREPARING
        task.deadline = now + timeout
        task.deadline_seq = self._next_seq()
        if task.lost:
            self._arm_grace(task, now)
        return Prediction(
            reply=(TaskState.RUNNING, TaskPhase.PREPARING),
            commands=(("prepare", task_id, task.deadline),),
        )

    def activate(self, task_id: str, now: int) -> Prediction:
        task = self.live.get(task_id)
        if task is None or task.phase is not TaskPhase.PREPARING:
            return Prediction()
        assert task.lease_expires_at is not None
        if now >= task.lease_expires_at:
            return self._converge(task_id, TaskState.FAILED, FailureCode.SLOT_LOST, True, now)
        task.lease_expires_at = None
        task.phase = TaskPhase.BUILDER
        return Prediction(
            reply=(TaskState.RUNNING, TaskPhase.BUILDER), commands=(("builder", task_id),)
        )

    def fail_activation(
        self, task_id: str, code: FailureCode | None, retryable: bool, now: int
    ) -> Prediction:
        task = self.live.get(task_id)
        if task is None or task.phase is not TaskPhase.PREPARING:
            return Prediction()
        failure = code or DEFAULT_CODE[TaskPhase.PREPARING]
        return self._converge(task_id, TaskState.FAILED, failure, retryable, now)

    def finish_phase(
        self,
        task_id: str,
        phase: TaskPhase,
        *,
        ok: bool,
        code: FailureCode | None,
        retryable: bool,
        now: int,
        outputs: tuple[bytes, ...] = (),
    ) -> Prediction:
        """The end of `phase`; `outputs` are the call values a calls phase reports."""
        task = self.live.get(task_id)
        if task is None or task.phase is not phase:
            return Prediction()
        if phase is TaskPhase.PLUGIN or not ok:
            if ok:
                return self._converge(task_id, TaskState.SUCCEEDED, None, False, now)
            failure = code or DEFAULT_CODE[phase]
            return self._converge(task_id, TaskState.FAILED, failure, retryable, now)
        task.phase = NEXT_PHASE[phase]
        command: Norm = (
            ("calls", task_id) if task.phase is TaskPhase.CALLS else ("plugin", task_id, outputs)
        )
        return Prediction(reply=(TaskState.RUNNING, task.phase), commands=(command,))

    def watch_attached(self, task_id: str) -> None:
        task = self.live.get(task_id)
        if task is not None:
            task.attached, task.lost = True, False
            task.grace_deadline = None

    def watch_detached(self, task_id: str) -> None:
        task = self.live.get(task_id)
        if task is not None:
            task.attached = task.lost = False
            task.grace_deadline = None

    def watch_disconnected(self, task_id: str, now: int) -> None:
        task = self.live.get(task_id)
        if task is not None and task.attached:
            task.attached, task.lost = False, True
            if task.submitted:
                self._arm_grace(task, now)

    def drain_deadline_passed(self, now: int) -> Prediction:
        self.draining = True
        commands: list[Norm] = []
        for task_id, task in list(self.live.items()):
            if task.submitted:
                prediction = self._converge(
                    task_id, TaskState.FAILED, FailureCode.WORKER_SHUTDOWN, True, now
                )
                commands.extend(prediction.commands)
            else:
                del self.live[task_id]
                commands.append(("forget", task_id, ForgetReason.WORKER_SHUTDOWN))
        return Prediction(commands=tuple(commands))

    def cancel(self, task_id: str, code: FailureCode, now: int) -> Prediction:
        """A submitted live task ends FAILED with `code`; anything else stays as it is."""
        task = self.live.get(task_id)
        if task is None or not task.submitted:
            return Prediction()
        return self._converge(task_id, TaskState.FAILED, code, True, now)

    def fire_next(self, now: int) -> tuple[Norm, ...]:
        """Fire the earliest due timer (ties: the first armed); () if none is due."""
        due = [timer for timer in self.timers() if timer[0] <= now]
        if not due:
            return ()
        _, _, kind, task_id = min(due)
        return self._fire(kind, task_id, now)

    def next_due(self) -> int | None:
        return min((timer[0] for timer in self.timers()), default=None)

    # -------------------------------------------------------------- helpers

    def timers(self) -> list[tuple[int, int, str, str]]:
        timers: list[tuple[int, int, str, str]] = []
        for task_id, task in self.live.items():
            if task.lease_expires_at is not None:
                timers.append((task.lease_expires_at, task.lease_seq, "lease", task_id))
            if task.deadline is not None:
                timers.append((task.deadline, task.deadline_seq, "deadline", task_id))
            if task.grace_deadline is not None:
                timers.append((task.grace_deadline, task.grace_seq, "grace", task_id))
        for task_id, result in (self.results | self.evicted).items():
            timers.append((result.purge_at, result.seq, "purge", task_id))
        return timers

    def _fire(self, kind: str, task_id: str, now: int) -> tuple[Norm, ...]:
        if kind == "purge":
            if self.results.pop(task_id, None) is None:
                del self.evicted[task_id]
            return (("forget", task_id, ForgetReason.RESULT_PURGED),)
        task = self.live[task_id]
        if kind == "lease" and not task.submitted:
            del self.live[task_id]
            return (("forget", task_id, ForgetReason.LEASE_EXPIRED),)
        code, retryable = {
            "lease": (FailureCode.SLOT_LOST, True),
            "deadline": (FailureCode.TIMED_OUT, True),
            "grace": (FailureCode.WATCH_DISCONNECTED, False),
        }[kind]
        return self._converge(task_id, TaskState.FAILED, code, retryable, now).commands

    def _reserve(self, task_id: str, ttl_ms: int, now: int) -> ModelTask:
        task = ModelTask(lease_expires_at=now + ttl_ms, lease_seq=self._next_seq())
        self.live[task_id] = task
        self.evicted.pop(task_id, None)
        return task

    def _arm_grace(self, task: ModelTask, now: int) -> None:
        if self.config.watch_disconnect_grace_ms > 0:
            task.grace_deadline = now + self.config.watch_disconnect_grace_ms
            task.grace_seq = self._next_seq()

    def _converge(
        self, task_id: str, state: TaskState, code: FailureCode | None, retryable: bool, now: int
    ) -> Prediction:
        del self.live[task_id]
        self.results[task_id] = ModelResult(
            state=state, purge_at=now + self.config.result_retention_ms, seq=self._next_seq()
        )
        return Prediction(
            reply=(state, TaskPhase.TERMINAL),
            commands=(("converge", task_id, state, code, retryable),),
        )
