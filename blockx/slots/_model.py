"""Values of the slot table: states, phases, task specs, results and snapshots.

Everything here is an immutable value (or an enum) that the machine hands out
or takes in. Nothing here holds state or knows about time beyond the
millisecond figures it carries.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from typing import Final

import attrs

from blockx.calls import CallFailurePolicy, CallStats, FailureCode, RetryPolicy


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


RUN_PHASES: Final = (TaskPhase.PREPARING, TaskPhase.BUILDER, TaskPhase.CALLS, TaskPhase.PLUGIN)
"""The phases a submitted task runs through, in order, before TERMINAL: the one list."""


class TimerKind(enum.Enum):
    SLOT_LEASE = "SLOT_LEASE"
    TASK_DEADLINE = "TASK_DEADLINE"
    WATCH_GRACE = "WATCH_GRACE"
    RESULT_RETENTION = "RESULT_RETENTION"


class ForgetReason(enum.Enum):
    LEASE_EXPIRED = "LEASE_EXPIRED"
    RESULT_PURGED = "RESULT_PURGED"
    RESULT_EVICTED = "RESULT_EVICTED"
    WORKER_SHUTDOWN = "WORKER_SHUTDOWN"


@attrs.frozen(kw_only=True)
class FunctionCall:
    """Which builder turns the payload into calls, and its JSON settings."""

    type: str
    config_json: str = ""


@attrs.frozen(kw_only=True)
class ResultHandler:
    """Which plugin stores the outputs, and its JSON settings."""

    type: str
    config_json: str = ""


MAX_TASK_ID_CHARS: Final = 256
"""The longest task id a worker accepts. Ids travel in every reply, log line and error
message about their task, so a worker never takes one of unbounded size."""

SHADOW_LABEL: Final = "blockx.shadow"
"""The reserved label of a task mirrored here by another worker (a shadow submit); its
value is the address of the worker that mirrored it."""


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

    @property
    def is_shadow(self) -> bool:
        """Whether another worker mirrored this task here (it must never store outputs)."""
        return SHADOW_LABEL in self.labels

    def as_shadow(self) -> TaskSpec:
        """The task as a shadow runs it: without a result handler, so it stores nothing."""
        return attrs.evolve(self, result_handler=None)


@attrs.frozen(kw_only=True)
class PluginResult:
    """How one plugin stored a task's outputs.

    `outputs_json` is set by a plugin that stores the outputs in the task's
    result itself (the `result` plugin): a JSON array, held as long as the
    result is retained and sent as the result's `outputs_json`.
    """

    plugin_type: str
    ok: bool
    records_written: int = 0
    detail: str = ""
    outputs_json: str = ""


@attrs.frozen(kw_only=True)
class PhaseOutcome:
    """How the builder or the plugin phase ended, as the task's runtime reports it.

    `failure_code` None on a failure means "the phase's default code". The
    builder reports `call_count`/`streaming`, the plugin phase
    `plugin_results`. (The calls phase reports a `CallPhaseOutcome`.)
    """

    ok: bool
    failure_code: FailureCode | None = None
    message: str = ""
    retryable: bool = False
    call_count: int = 0
    streaming: bool = False
    plugin_results: tuple[PluginResult, ...] = ()


@attrs.frozen(kw_only=True)
class PhaseTimings:
    """How long a task spent in each phase of `RUN_PHASES`, and in all."""

    preparing_ms: int = 0
    builder_ms: int = 0
    calls_ms: int = 0
    plugin_ms: int = 0
    total_ms: int = 0

    @classmethod
    def of(cls, phase_ms: Mapping[TaskPhase, int], *, total_ms: int) -> PhaseTimings:
        """Timings from per-phase figures; a phase not in `phase_ms` took 0 ms."""
        fields = {_timing_field(phase): phase_ms.get(phase, 0) for phase in RUN_PHASES}
        return cls(**fields, total_ms=total_ms)

    def ms(self, phase: TaskPhase) -> int:
        """Milliseconds spent in `phase` (one of `RUN_PHASES`)."""
        value: int = getattr(self, _timing_field(phase))
        return value


def _timing_field(phase: TaskPhase) -> str:
    return f"{phase.value.lower()}_ms"


@attrs.frozen(kw_only=True)
class TaskResult:
    """The terminal result of a task. Once made it never changes."""

    task_id: str
    slot_id: str
    state: TaskState
    phase: TaskPhase
    failure_code: FailureCode | None = None
    message: str = ""
    retryable: bool = False
    output_count: int = 0
    output_bytes: int = 0
    plugin_results: tuple[PluginResult, ...] = ()
    call_stats: CallStats = attrs.field(factory=CallStats)
    timings: PhaseTimings = PhaseTimings()
    task_code_epoch: str = ""
    accepted_at_ms: int = 0
    finished_at_ms: int = 0

    @property
    def outputs_json(self) -> str:
        """The outputs a plugin kept in this result (a JSON array), or "" if none did."""
        return next((kept.outputs_json for kept in self.plugin_results if kept.outputs_json), "")

    @property
    def retained_bytes(self) -> int:
        """What keeping this result costs, as `worker.resultRetentionBytes` counts it.

        The size of the result as the API sends it (its encoded `TaskResult`), estimated
        without encoding: `RESULT_FIXED_BYTES` for the numbers, states and framing, plus
        the length of each text and `PLUGIN_RESULT_FIXED_BYTES` per plugin result. Text
        counts in characters, so text outside ASCII counts less than its UTF-8 bytes;
        outputs kept in the result (`outputs_json`, the bulk of a large result) count
        in full.
        """
        size = RESULT_FIXED_BYTES + len(self.task_id) + len(self.message)
        size += len(self.task_code_epoch)
        for kept in self.plugin_results:
            size += PLUGIN_RESULT_FIXED_BYTES + len(kept.plugin_type) + len(kept.detail)
            size += len(kept.outputs_json)
        return size


RESULT_FIXED_BYTES: Final = 128
"""The encoded size of a `TaskResult` beyond its texts: tags, lengths, state, phase,
failure code, counts, call statistics, timings and times (at most about 120 bytes)."""
PLUGIN_RESULT_FIXED_BYTES: Final = 16
"""The encoded size of one `PluginResult` beyond its texts."""


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
    ready: bool
    """An executor is healthy: the worker admits work (unless draining)."""
    slots_granted: int
    """Reservations granted since the table was made: every reservation changes it, even
    one whose task has ended again before anyone looked at the capacity."""


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
