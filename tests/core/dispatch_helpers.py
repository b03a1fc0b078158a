"""Shared builders for the dispatch core's tests.

Builds policies, call specs, events and the commands a test expects, all with
explicit times and draws, and observes a core's visible state so a test can
assert that a refused event changed nothing. Never reads a clock.

Every event gets a stimulus id; unless a test names one, it is the helper's
kind and the event's time (`"joined-0"`, `"arrived-10"`, ...).
"""

from __future__ import annotations

import attrs

from blockx.calls import (
    CallFailurePolicy,
    CallOutcome,
    CallSpec,
    FailureCode,
    RetryPolicy,
)
from blockx.dispatch import (
    CallDispatch,
    CallPolicy,
    CallResultsArrived,
    CallsAdded,
    CancelCalls,
    ClockTicked,
    DeliverSubcallResult,
    DispatchCommand,
    DispatchCore,
    ExecutorJoined,
    ExecutorLeft,
    RevokeCalls,
    RunCalls,
    SubcallRequested,
    TaskCancelled,
    TaskOpened,
)

FUNCTION = "work"


def call_policy(
    *,
    max_attempts: int = 3,
    base_backoff_ms: int = 10,
    jitter_percent: int = 5,
    fail_fast: bool = True,
    window: int = 64,
    call_deadline_ms: int = 60_000,
    at_most_once: bool = False,
) -> CallPolicy:
    """A `CallPolicy`; every figure not given is the old default one."""
    return CallPolicy(
        retry=RetryPolicy(
            max_attempts=max_attempts,
            base_backoff_ms=base_backoff_ms,
            jitter_percent=jitter_percent,
            at_most_once=at_most_once,
        ),
        failure_policy=CallFailurePolicy.FAIL_FAST if fail_fast else CallFailurePolicy.BEST_EFFORT,
        window=window,
        call_deadline_ms=call_deadline_ms,
    )


# 3 attempts, 10 ms base back-off, 5 % jitter, fail fast, window 64, 60 s deadline.
DEFAULT_POLICY = call_policy()
DEADLINE_MS = DEFAULT_POLICY.call_deadline_ms


def _stimulus(kind: str, now_ms: int, stimulus_id: str | None) -> str:
    return f"{kind}-{now_ms}" if stimulus_id is None else stimulus_id


def value_of(call_id: str) -> bytes:
    """The value a test's executor returns for `call_id`."""
    return f"out-{call_id}".encode()


def spec(call_id: str) -> CallSpec:
    return CallSpec(call_id=call_id, function=FUNCTION, args=call_id.encode())


def dispatch(
    call_id: str,
    *,
    at_ms: int,
    task_id: str = "t1",
    attempt: int = 1,
    deadline_after_ms: int = DEADLINE_MS,
) -> CallDispatch:
    """The `CallDispatch` for `spec(call_id)` sent at `at_ms`."""
    return CallDispatch(
        call_id=call_id,
        task_id=task_id,
        function=FUNCTION,
        args=call_id.encode(),
        attempt=attempt,
        deadline_ms=at_ms + deadline_after_ms,
    )


def run(executor_id: str, *calls: CallDispatch) -> RunCalls:
    return RunCalls(executor_id=executor_id, calls=calls)


def joined(
    executor_id: str, *, capacity: int, now_ms: int, stimulus_id: str | None = None
) -> ExecutorJoined:
    return ExecutorJoined(
        executor_id=executor_id,
        capacity=capacity,
        now_ms=now_ms,
        stimulus_id=_stimulus("joined", now_ms, stimulus_id),
    )


def left(
    executor_id: str,
    *,
    now_ms: int,
    error_code: FailureCode = FailureCode.EXECUTOR_LOST,
    draw: float = 0.0,
    stimulus_id: str | None = None,
) -> ExecutorLeft:
    return ExecutorLeft(
        executor_id=executor_id,
        error_code=error_code,
        now_ms=now_ms,
        draw=draw,
        stimulus_id=_stimulus("left", now_ms, stimulus_id),
    )


def opened(
    task_id: str = "t1",
    *,
    now_ms: int,
    policy: CallPolicy = DEFAULT_POLICY,
    stimulus_id: str | None = None,
) -> TaskOpened:
    return TaskOpened(
        task_id=task_id,
        policy=policy,
        now_ms=now_ms,
        stimulus_id=_stimulus("opened", now_ms, stimulus_id),
    )


def added(
    task_id: str,
    *call_ids: str,
    now_ms: int,
    sealed: bool = True,
    stimulus_id: str | None = None,
) -> CallsAdded:
    return CallsAdded(
        task_id=task_id,
        calls=tuple(spec(call_id) for call_id in call_ids),
        sealed=sealed,
        now_ms=now_ms,
        stimulus_id=_stimulus("added", now_ms, stimulus_id),
    )


def cancelled(task_id: str, *, now_ms: int, stimulus_id: str | None = None) -> TaskCancelled:
    return TaskCancelled(
        task_id=task_id, now_ms=now_ms, stimulus_id=_stimulus("cancelled", now_ms, stimulus_id)
    )


def ok(call_id: str, *, attempt: int = 1) -> CallOutcome:
    return CallOutcome.success(call_id=call_id, attempt=attempt, value=value_of(call_id))


def failed(
    call_id: str,
    *,
    attempt: int = 1,
    code: FailureCode = FailureCode.CALL_RAISED,
    retryable: bool = False,
    message: str = "boom",
) -> CallOutcome:
    return CallOutcome.failure(
        call_id=call_id,
        attempt=attempt,
        error_code=code,
        error_message=message,
        retryable=retryable,
    )


def retryable_failure(call_id: str, *, attempt: int = 1) -> CallOutcome:
    return failed(call_id, attempt=attempt, code=FailureCode.CALL_RAISED_RETRYABLE, retryable=True)


def revoked(call_id: str, *, attempt: int = 1) -> CallOutcome:
    """What an executor answers for an attempt it gives back before starting it."""
    return failed(
        call_id, attempt=attempt, code=FailureCode.CALL_REVOKED, retryable=True, message="back"
    )


def revoke(executor_id: str, *attempts: tuple[str, int]) -> RevokeCalls:
    """`RevokeCalls` of (call id, attempt) pairs on `executor_id`."""
    return RevokeCalls(executor_id=executor_id, attempts=attempts)


def cancel(executor_id: str, *attempts: tuple[str, int]) -> CancelCalls:
    """`CancelCalls` of (call id, attempt) pairs on `executor_id`."""
    return CancelCalls(executor_id=executor_id, attempts=attempts)


def arrived(
    executor_id: str,
    *outcomes: CallOutcome,
    now_ms: int,
    draw: float = 0.0,
    stimulus_id: str | None = None,
) -> CallResultsArrived:
    return CallResultsArrived(
        executor_id=executor_id,
        outcomes=outcomes,
        now_ms=now_ms,
        draw=draw,
        stimulus_id=_stimulus("arrived", now_ms, stimulus_id),
    )


def ticked(now_ms: int, *, draw: float = 0.0, stimulus_id: str | None = None) -> ClockTicked:
    return ClockTicked(
        now_ms=now_ms, draw=draw, stimulus_id=_stimulus("ticked", now_ms, stimulus_id)
    )


def subcall(
    executor_id: str,
    parent_call_id: str,
    subcall_id: str,
    *,
    now_ms: int,
    parent_attempt: int = 1,
    stimulus_id: str | None = None,
) -> SubcallRequested:
    return SubcallRequested(
        executor_id=executor_id,
        parent_call_id=parent_call_id,
        parent_attempt=parent_attempt,
        subcall=spec(subcall_id),
        now_ms=now_ms,
        stimulus_id=_stimulus("subcall", now_ms, stimulus_id),
    )


def delivered(
    executor_id: str, parent_call_id: str, outcome: CallOutcome, *, parent_attempt: int = 1
) -> DeliverSubcallResult:
    return DeliverSubcallResult(
        executor_id=executor_id,
        parent_call_id=parent_call_id,
        parent_attempt=parent_attempt,
        outcome=outcome,
    )


def start(
    core: DispatchCore,
    task_id: str,
    *call_ids: str,
    now_ms: int,
    policy: CallPolicy = DEFAULT_POLICY,
    sealed: bool = True,
) -> tuple[DispatchCommand, ...]:
    """Open `task_id` and add `call_ids` at `now_ms`; returns the commands of the add."""
    assert core.handle(opened(task_id, now_ms=now_ms, policy=policy)).commands == ()
    return core.handle(added(task_id, *call_ids, now_ms=now_ms, sealed=sealed)).commands


@attrs.frozen(kw_only=True)
class Observed:
    """Everything a caller can see of a core, for before/after comparisons."""

    task_ids: tuple[str, ...]
    running: tuple[tuple[str, tuple[str, ...]], ...]
    next_deadline_ms: int | None


def observe(core: DispatchCore) -> Observed:
    return Observed(
        task_ids=core.task_ids(),
        running=tuple(
            (executor_id, core.running_calls(executor_id)) for executor_id in core.executor_ids()
        ),
        next_deadline_ms=core.next_deadline_ms(),
    )
