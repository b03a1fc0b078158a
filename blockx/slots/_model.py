"""Values of the slot table: states, phases, task specs, results and snapshots.

Everything here is an immutable value (or an enum) that the machine hands out
or takes in. Nothing here holds state or knows about time beyond the
millisecond figures it carries.
"""

from __future__ import annotations

import enum

import attrs


class SlotState(enum.Enum):
    FREE = "FREE"
    ALLOCATED = "ALLOCATED"
    RUNNING = "RUNNING"


class TaskState(enum.Enum):
    """What a client sees. Every internal phase of a submitted task is RUNNING."""

    ALLOCATED = "ALLOCATED"
    RUNNING = "RUNNING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"

    @property
    def is_terminal(self) -> bool:
        return self in (TaskState.SUCCEEDED, TaskState.FAILED)


class TaskPhase(enum.Enum):
    PREPARING = "PREPARING"
    BUILDER = "BUILDER"
    CALLS = "CALLS"
    PLUGIN = "PLUGIN"
    TERMINAL = "TERMINAL"


class CallFailurePolicy(enum.Enum):
    FAIL_FAST = "FAIL_FAST"
    BEST_EFFORT = "BEST_EFFORT"


class FailureCode(enum.StrEnum):
    """Failure codes the slot table itself assigns.

    A phase outcome may carry any other stable code (for example one chosen by
    the dispatcher); these are the ones this package decides on its own.
    """

    ACTIVATION_FAILED = "ACTIVATION_FAILED"
    IO_SCOPE_FAILED = "IO_SCOPE_FAILED"
    SLOT_LOST = "SLOT_LOST"
    BUILDER_FAILED = "BUILDER_FAILED"
    BUILDER_NOT_FOUND = "BUILDER_NOT_FOUND"
    CALLS_FAILED = "CALLS_FAILED"
    PLUGIN_FAILED = "PLUGIN_FAILED"
    TIMED_OUT = "TIMED_OUT"
    WATCH_DISCONNECTED = "WATCH_DISCONNECTED"
    WORKER_SHUTDOWN = "WORKER_SHUTDOWN"


class TimerKind(enum.Enum):
    SLOT_LEASE = "SLOT_LEASE"
    TASK_DEADLINE = "TASK_DEADLINE"
    WATCH_GRACE = "WATCH_GRACE"
    RESULT_RETENTION = "RESULT_RETENTION"


class ForgetReason(enum.Enum):
    LEASE_EXPIRED = "LEASE_EXPIRED"
    RESULT_PURGED = "RESULT_PURGED"
    WORKER_SHUTDOWN = "WORKER_SHUTDOWN"


MAX_JITTER_PERCENT = 5


@attrs.frozen(kw_only=True)
class RetryPolicy:
    max_attempts: int
    base_backoff_ms: int
    jitter_percent: int

    def first_violation(self) -> tuple[str, int, str] | None:
        """(attribute, value, what is allowed) of the first out-of-range field, if any."""
        if self.max_attempts < 1:
            return ("max_attempts", self.max_attempts, "must be >= 1")
        if self.base_backoff_ms < 0:
            return ("base_backoff_ms", self.base_backoff_ms, "must be >= 0")
        if not 0 <= self.jitter_percent <= MAX_JITTER_PERCENT:
            return ("jitter_percent", self.jitter_percent, f"between 0 and {MAX_JITTER_PERCENT}")
        return None


@attrs.frozen(kw_only=True)
class FunctionCall:
    """Which builder turns the payload into calls, and its JSON settings."""

    type: str
    config_json: str = ""


@attrs.frozen(kw_only=True)
class ResultHandler:
    """Which writer plugin stores the outputs, and its JSON settings."""

    type: str
    config_json: str = ""


@attrs.frozen(kw_only=True)
class TaskSpec:
    """A task as submitted. The machine validates it and passes it through."""

    task_id: str
    function_call: FunctionCall
    payload: bytes = b""
    result_handler: ResultHandler | None = None
    task_timeout_ms: int = 0
    call_failure_policy: CallFailurePolicy = CallFailurePolicy.FAIL_FAST
    call_retry_policy: RetryPolicy | None = None
    labels: dict[str, str] = attrs.field(factory=dict, hash=False)


@attrs.frozen(kw_only=True)
class CallStats:
    calls_total: int = 0
    calls_succeeded: int = 0
    calls_failed: int = 0
    calls_retried: int = 0


@attrs.frozen(kw_only=True)
class PluginResult:
    plugin_type: str
    ok: bool
    records_written: int = 0
    detail: str = ""


@attrs.frozen(kw_only=True)
class PhaseOutcome:
    """How a phase ended, as the task's runtime reports it.

    `failure_code` None on a failure means "the phase's default code". The
    remaining fields are read only for the phase they belong to: the builder
    reports `call_count`/`streaming`, the calls phase `call_stats` and the
    output summary, the plugin phase `plugin_results`.
    """

    ok: bool
    failure_code: str | None = None
    message: str = ""
    retryable: bool = False
    call_count: int = 0
    streaming: bool = False
    call_stats: CallStats | None = None
    output_count: int = 0
    output_bytes: int = 0
    plugin_results: tuple[PluginResult, ...] = ()


@attrs.frozen(kw_only=True)
class PhaseTimings:
    preparing_ms: int = 0
    builder_ms: int = 0
    calls_ms: int = 0
    plugin_ms: int = 0
    total_ms: int = 0


@attrs.frozen(kw_only=True)
class TaskResult:
    """The terminal result of a task. Once made it never changes."""

    task_id: str
    slot_id: str
    state: TaskState
    phase: TaskPhase
    failure_code: str = ""
    message: str = ""
    retryable: bool = False
    output_count: int = 0
    output_bytes: int = 0
    plugin_results: tuple[PluginResult, ...] = ()
    call_stats: CallStats = CallStats()
    timings: PhaseTimings = PhaseTimings()
    task_code_epoch: str = ""
    accepted_at_ms: int = 0
    finished_at_ms: int = 0


@attrs.frozen(kw_only=True)
class TaskSnapshot:
    """What the worker answers about one task id at one moment.

    `phase` is None for a reservation that has not been submitted.
    `lease_expires_at_ms` is set while the task still depends on its slot
    lease (reserved, or submitted and not yet activated).
    """

    task_id: str
    slot_id: str
    state: TaskState
    phase: TaskPhase | None
    lease_expires_at_ms: int | None = None
    deadline_ms: int | None = None
    result: TaskResult | None = None

    @classmethod
    def of_result(cls, result: TaskResult) -> TaskSnapshot:
        """The snapshot of a task that has ended with `result`."""
        return cls(
            task_id=result.task_id,
            slot_id=result.slot_id,
            state=result.state,
            phase=TaskPhase.TERMINAL,
            result=result,
        )

    @property
    def is_terminal(self) -> bool:
        return self.state.is_terminal


@attrs.frozen(kw_only=True)
class SlotView:
    slot_id: str
    state: SlotState
    task_id: str | None
    lease_expires_at_ms: int | None


@attrs.frozen(kw_only=True)
class Heartbeat:
    """Capacity as the slot table sees it; the etcd heartbeat is derived from this."""

    at_ms: int
    slots_total: int
    reserved_slots: int
    running_tasks: int
    free_slots: int
    active_tasks: int
    draining: bool


@attrs.frozen(kw_only=True, order=False)
class Timer:
    """A due time with the ticket of whatever armed it.

    Re-arming or disarming the same slot or task issues a new ticket, so a
    timer fired with an old ticket is recognised as stale and does nothing.
    """

    kind: TimerKind
    key: str
    ticket: int
    due_ms: int
