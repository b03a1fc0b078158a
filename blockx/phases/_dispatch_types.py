"""Values, events and commands of the call-dispatch core.

Events are named in the past tense, commands in the imperative. Every event
carries `now_ms`; events that may schedule a retry also carry `draw`, a
uniform number in [0, 1) drawn by the runtime, from which the core takes its
back-off jitter, so the core itself never draws a random number.
"""

from __future__ import annotations

import enum

import attrs

from blockx.errors import BlockxError


class CallErrorCode(enum.StrEnum):
    """Stable codes of a failed call attempt, shared by executors and the dispatcher.

    Executors report the first group; the dispatcher adds executor lost,
    wedged and deadline exceeded. Whether an attempt is retried follows the
    `retryable` flag reported with it, not the code.
    """

    CALL_RAISED = "CALL_RAISED"
    """The function raised; not retryable."""
    CALL_RAISED_RETRYABLE = "CALL_RAISED_RETRYABLE"
    """The function raised `blockx.RetryableError` (or a retryable subcall failure)."""
    UNKNOWN_FUNCTION = "UNKNOWN_FUNCTION"
    """No such module or callable in the call's epoch; not retryable."""
    CODE_UNAVAILABLE = "CODE_UNAVAILABLE"
    """The worker could not supply the module source; retryable."""
    INVALID_ARGS = "INVALID_ARGS"
    """`args` is not a msgpack argument list or keyword map; not retryable."""
    RESULT_NOT_SERIALIZABLE = "RESULT_NOT_SERIALIZABLE"
    """The return value cannot be encoded with msgpack; not retryable."""
    RESULT_TOO_LARGE = "RESULT_TOO_LARGE"
    """The encoded return value exceeds the executor's result size limit; not retryable."""
    CALL_CANCELLED = "CALL_CANCELLED"
    """Cancelled before it started, or while it waited on a subcall; not retryable."""
    DEADLINE_EXCEEDED = "DEADLINE_EXCEEDED"
    """The call deadline passed (queued on the executor, or running); retryable."""
    EXECUTOR_LOST = "EXECUTOR_LOST"
    """The executor died or stopped answering during the call; retryable."""
    EXECUTOR_WEDGED = "EXECUTOR_WEDGED"
    """The executor's loop stalled during the call and it was killed; retryable."""


class DispatchMisuse(BlockxError):
    """The runtime drove the dispatch core in a way it never asked for (a bug)."""

    def __init__(self, *, what: str) -> None:
        self.what = what
        super().__init__(what)


def _check_draw(_: object, __: attrs.Attribute[float], draw: float) -> None:
    if not 0.0 <= draw < 1.0:
        raise DispatchMisuse(what=f"draw={draw!r} must be in [0, 1)")


@attrs.frozen(kw_only=True)
class CallPolicy:
    """How one task's calls run: retries, failure policy, window and deadline."""

    max_attempts: int = 3
    base_backoff_ms: int = 10
    jitter_percent: int = 5
    fail_fast: bool = True
    window: int = 64
    call_deadline_ms: int = 60_000

    def __attrs_post_init__(self) -> None:
        if self.max_attempts < 1 or self.base_backoff_ms < 0 or self.window < 1:
            raise DispatchMisuse(what=f"invalid call policy {self!r}")
        if not 0 <= self.jitter_percent <= 100 or self.call_deadline_ms < 1:
            raise DispatchMisuse(what=f"invalid call policy {self!r}")

    def backoff_ms(self, attempt: int, draw: float) -> int:
        """Delay before attempt `attempt + 1`, after `attempt` attempts failed."""
        base = self.base_backoff_ms << (attempt - 1)
        return base + int(base * self.jitter_percent * draw / 100)


@attrs.frozen(kw_only=True)
class CallSpec:
    """One call as the builder produced it; `args` is opaque to the core."""

    call_id: str
    function: str
    args: bytes = b""


@attrs.frozen(kw_only=True)
class CallOutcome:
    """How one attempt of a call ended on an executor."""

    call_id: str
    attempt: int
    ok: bool
    value: bytes = b""
    error_code: str = ""
    error_message: str = ""
    retryable: bool = False


@attrs.frozen(kw_only=True)
class CallFailure:
    call_id: str
    function: str
    attempts: int
    error_code: str
    error_message: str


@attrs.frozen(kw_only=True)
class CallPhaseStats:
    calls_total: int = 0
    calls_succeeded: int = 0
    calls_failed: int = 0
    calls_retried: int = 0
    subcalls: int = 0


@attrs.frozen(kw_only=True)
class CallPhaseOutcome:
    """The end of a task's calls phase.

    Fail fast: `ok` is False after the first call that failed for good.
    Best effort: `ok` is True once every call ended; `failures` lists the rest.
    `outputs` holds the values of the calls that succeeded, in call order.
    """

    ok: bool
    failure_code: str = ""
    message: str = ""
    retryable: bool = False
    stats: CallPhaseStats = CallPhaseStats()
    outputs: tuple[bytes, ...] = ()
    failures: tuple[CallFailure, ...] = ()


# ---------------------------------------------------------------- events


@attrs.frozen(kw_only=True)
class ExecutorJoined:
    """An executor is ready; it takes up to `capacity` calls at once (pipelined)."""

    executor_id: str
    capacity: int
    now_ms: int


@attrs.frozen(kw_only=True)
class ExecutorLeft:
    """An executor is gone (`error_code` EXECUTOR_LOST or EXECUTOR_WEDGED)."""

    executor_id: str
    error_code: str
    now_ms: int
    draw: float = attrs.field(default=0.0, validator=_check_draw)


@attrs.frozen(kw_only=True)
class TaskOpened:
    task_id: str
    policy: CallPolicy
    now_ms: int


@attrs.frozen(kw_only=True)
class CallsAdded:
    """More calls of a task; `sealed` says no more will follow."""

    task_id: str
    calls: tuple[CallSpec, ...]
    sealed: bool
    now_ms: int


@attrs.frozen(kw_only=True)
class CallResultsArrived:
    executor_id: str
    outcomes: tuple[CallOutcome, ...]
    now_ms: int
    draw: float = attrs.field(default=0.0, validator=_check_draw)


@attrs.frozen(kw_only=True)
class SubcallRequested:
    """A running call asked for another call and waits for its result."""

    executor_id: str
    parent_call_id: str
    parent_attempt: int
    subcall: CallSpec
    now_ms: int


@attrs.frozen(kw_only=True)
class TaskCancelled:
    task_id: str
    now_ms: int


@attrs.frozen(kw_only=True)
class ClockTicked:
    """Time passed: back-offs may be over, call deadlines may have passed."""

    now_ms: int
    draw: float = attrs.field(default=0.0, validator=_check_draw)


DispatchEvent = (
    ExecutorJoined
    | ExecutorLeft
    | TaskOpened
    | CallsAdded
    | CallResultsArrived
    | SubcallRequested
    | TaskCancelled
    | ClockTicked
)


# -------------------------------------------------------------- commands


@attrs.frozen(kw_only=True)
class CallDispatch:
    call_id: str
    task_id: str
    function: str
    args: bytes
    attempt: int
    deadline_ms: int


@attrs.frozen(kw_only=True)
class RunCalls:
    executor_id: str
    calls: tuple[CallDispatch, ...]


@attrs.frozen(kw_only=True)
class CancelCalls:
    """Stop these (call id, attempt) pairs; their answers, if any, are ignored."""

    executor_id: str
    attempts: tuple[tuple[str, int], ...]


@attrs.frozen(kw_only=True)
class DeliverSubcallResult:
    executor_id: str
    parent_call_id: str
    parent_attempt: int
    outcome: CallOutcome


@attrs.frozen(kw_only=True)
class FinishCallPhase:
    task_id: str
    outcome: CallPhaseOutcome


DispatchCommand = RunCalls | CancelCalls | DeliverSubcallResult | FinishCallPhase
