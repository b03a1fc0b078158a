"""Shared builders for the slot machine's core tests.

Builds configs, specs and events with explicit times, and observes a machine's
whole visible state so a test can assert that a refused or ignored event
changed nothing. Never reads a clock.
"""

from __future__ import annotations

import attrs

from blockx.calls import CallPhaseOutcome, RetryPolicy
from blockx.slots import (
    ActivationPrepared,
    CallsFinished,
    FunctionCall,
    Heartbeat,
    NotFound,
    PhaseFinished,
    PhaseOutcome,
    SlotConfig,
    SlotMachine,
    SlotRequested,
    SlotView,
    Step,
    TaskPhase,
    TaskSnapshot,
    TaskSpec,
    TaskState,
    TaskSubmitted,
    Timer,
    TimerFired,
    TimerKind,
    WorkerReady,
)

# Later than any due time a test arms: `due_timers(FAR_FUTURE_MS)` lists every
# current timer.
FAR_FUTURE_MS = 10**12

DEFAULT_RETRY = RetryPolicy(max_attempts=3, base_backoff_ms=10, jitter_percent=5)

CONFIG = SlotConfig(
    task_slots=3,
    default_ttl_ms=5_000,
    task_deadline_ms=60_000,
    max_task_timeout_ms=600_000,
    result_retention_ms=30_000,
    result_retention_bytes=1_000_000,
    watch_disconnect_grace_ms=0,
    default_retry_policy=DEFAULT_RETRY,
)

OK = PhaseOutcome(ok=True)
CALLS_OK = CallPhaseOutcome(ok=True)


class MachineFactory:
    """Makes machines from `CONFIG` with overrides; checks them all at teardown."""

    def __init__(self) -> None:
        self.made: list[SlotMachine] = []

    def __call__(
        self,
        *,
        task_slots: int = CONFIG.task_slots,
        result_retention_ms: int = CONFIG.result_retention_ms,
        result_retention_bytes: int = CONFIG.result_retention_bytes,
        watch_disconnect_grace_ms: int = CONFIG.watch_disconnect_grace_ms,
    ) -> SlotMachine:
        config = attrs.evolve(
            CONFIG,
            task_slots=task_slots,
            result_retention_ms=result_retention_ms,
            result_retention_bytes=result_retention_bytes,
            watch_disconnect_grace_ms=watch_disconnect_grace_ms,
        )
        machine = SlotMachine(config)
        machine.handle(WorkerReady(now_ms=0, stimulus_id="ready"))
        self.made.append(machine)
        return machine

    def check_all(self) -> None:
        for machine in self.made:
            machine.check_invariants()


def task_spec(
    task_id: str = "t1",
    *,
    builder: str = "csv",
    task_timeout_ms: int = 0,
    call_retry_policy: RetryPolicy | None = None,
) -> TaskSpec:
    return TaskSpec(
        task_id=task_id,
        function_call=FunctionCall(type=builder, config_json='{"sep": ","}'),
        payload=b"payload",
        task_timeout_ms=task_timeout_ms,
        call_retry_policy=call_retry_policy,
    )


# Every event needs a stimulus id. The builders below default to one naming the
# kind of event; a test that asserts on commands passes its own.


def requested(
    task_id: str, *, now_ms: int, ttl_ms: int = 0, stimulus_id: str = "request"
) -> SlotRequested:
    return SlotRequested(task_id=task_id, ttl_ms=ttl_ms, now_ms=now_ms, stimulus_id=stimulus_id)


def submitted(
    spec: TaskSpec | str,
    *,
    now_ms: int,
    slot_id: str | None = None,
    stimulus_id: str = "submit",
) -> TaskSubmitted:
    if isinstance(spec, str):
        spec = task_spec(spec)
    return TaskSubmitted(spec=spec, slot_id=slot_id, now_ms=now_ms, stimulus_id=stimulus_id)


def prepared(
    task_id: str, *, slot_id: str, now_ms: int, epoch: str = "e1", stimulus_id: str = "prepare"
) -> ActivationPrepared:
    return ActivationPrepared(
        task_id=task_id,
        slot_id=slot_id,
        task_code_epoch=epoch,
        now_ms=now_ms,
        stimulus_id=stimulus_id,
    )


def finished(
    task_id: str,
    phase: TaskPhase,
    *,
    now_ms: int,
    outcome: PhaseOutcome = OK,
    stimulus_id: str = "finish",
) -> PhaseFinished:
    """The end of the BUILDER or PLUGIN phase (the calls phase: `calls_finished`)."""
    return PhaseFinished(
        task_id=task_id, phase=phase, outcome=outcome, now_ms=now_ms, stimulus_id=stimulus_id
    )


def calls_finished(
    task_id: str,
    *,
    now_ms: int,
    outcome: CallPhaseOutcome = CALLS_OK,
    stimulus_id: str = "calls",
) -> CallsFinished:
    return CallsFinished(task_id=task_id, outcome=outcome, now_ms=now_ms, stimulus_id=stimulus_id)


def outputs_of(count: int, total_bytes: int) -> tuple[bytes, ...]:
    """`count` call values (count > 0) whose lengths add up to `total_bytes`."""
    size, extra = divmod(total_bytes, count)
    return tuple(bytes([i]) * (size + (i < extra)) for i in range(count))


def fired(timer: Timer, *, now_ms: int, stimulus_id: str = "timer") -> TimerFired:
    return TimerFired(timer=timer, now_ms=now_ms, stimulus_id=stimulus_id)


def start_task(machine: SlotMachine, task_id: str, *, now_ms: int) -> str:
    """Submit `task_id` inline and activate it at `now_ms`; returns its slot id."""
    reply = machine.handle(submitted(task_id, now_ms=now_ms)).reply
    assert reply is not None
    machine.handle(prepared(task_id, slot_id=reply.slot_id, now_ms=now_ms))
    return reply.slot_id


def current_timers(machine: SlotMachine) -> tuple[tuple[TimerKind, str, int], ...]:
    """Every current timer as (kind, key, due_ms), earliest first; tickets left out."""
    return tuple(
        (timer.kind, timer.key, timer.due_ms) for timer in machine.due_timers(FAR_FUTURE_MS)
    )


def timer_of(machine: SlotMachine, kind: TimerKind, key: str) -> Timer:
    """The one current timer of `kind` for `key`."""
    (timer,) = (
        timer
        for timer in machine.due_timers(FAR_FUTURE_MS)
        if timer.kind is kind and timer.key == key
    )
    return timer


@attrs.frozen(kw_only=True)
class Observed:
    """Everything a caller can see of a machine, for before/after comparisons."""

    slots: tuple[SlotView, ...]
    heartbeat: Heartbeat
    free_capacity: int
    active_tasks: int
    draining: bool
    results: tuple[TaskSnapshot | None, ...]
    timers: tuple[Timer, ...]
    next_deadline_ms: int | None


def observe(machine: SlotMachine, *task_ids: str) -> Observed:
    return Observed(
        slots=machine.slot_views(),
        heartbeat=machine.heartbeat(0),
        free_capacity=machine.free_capacity(),
        active_tasks=machine.active_task_count(),
        draining=machine.draining,
        results=tuple(result_or_none(machine, task_id) for task_id in task_ids),
        timers=machine.due_timers(FAR_FUTURE_MS),
        next_deadline_ms=machine.next_deadline_ms(),
    )


def result_or_none(machine: SlotMachine, task_id: str) -> TaskSnapshot | None:
    try:
        return machine.get_result(task_id)
    except NotFound:
        return None


EMPTY_STEP = Step()


def fail_builder(machine: SlotMachine, task_id: str, *, now_ms: int) -> None:
    """Report the builder phase of `task_id` as failed; the task must end FAILED."""
    step = machine.handle(
        finished(task_id, TaskPhase.BUILDER, now_ms=now_ms, outcome=PhaseOutcome(ok=False))
    )
    assert step.reply is not None
    assert step.reply.state is TaskState.FAILED
