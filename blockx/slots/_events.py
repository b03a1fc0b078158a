"""Events: what happened, told to the slot machine. Named in the past tense.

Every event carries the time it happened (`now_ms`, milliseconds on the
worker's clock) and the id of the stimulus that caused it (required: the
runtime stamps it where the event is made); commands the machine answers with
carry the same id. Events check their own fields when constructed, so a
malformed event never reaches the machine.
"""

from __future__ import annotations

import attrs

from blockx.calls import CallPhaseOutcome, FailureCode
from blockx.errors import Misuse
from blockx.slots._model import PhaseOutcome, TaskPhase, TaskSpec, Timer

OUTCOME_PHASES = (TaskPhase.BUILDER, TaskPhase.PLUGIN)
"""The phases whose end is reported with a `PhaseOutcome` (calls: `CallsFinished`)."""


@attrs.frozen(kw_only=True)
class SlotRequested:
    """A client asked to reserve a slot for `task_id` (`ttl_ms` 0 = default)."""

    task_id: str
    ttl_ms: int
    now_ms: int
    stimulus_id: str


@attrs.frozen(kw_only=True)
class TaskSubmitted:
    """A client submitted a task, into a reserved slot or (slot_id None) inline."""

    spec: TaskSpec
    slot_id: str | None
    now_ms: int
    stimulus_id: str


@attrs.frozen(kw_only=True)
class ActivationPrepared:
    """The runtime pinned the task's code epoch and opened its IO scope."""

    task_id: str
    slot_id: str
    task_code_epoch: str
    now_ms: int
    stimulus_id: str


@attrs.frozen(kw_only=True)
class ActivationFailed:
    """The runtime could not activate the task (no epoch to pin, its IO scope failed, or this
    worker has no builder or plugin of the task's types)."""

    task_id: str
    failure_code: FailureCode | None
    message: str
    retryable: bool
    now_ms: int
    stimulus_id: str


@attrs.frozen(kw_only=True)
class PhaseFinished:
    """The task's runtime finished `phase` (BUILDER or PLUGIN)."""

    task_id: str
    phase: TaskPhase
    outcome: PhaseOutcome
    now_ms: int
    stimulus_id: str

    def __attrs_post_init__(self) -> None:
        if self.phase not in OUTCOME_PHASES:
            raise Misuse(
                what=f"phase {self.phase.value} is not reported with a PhaseOutcome "
                "(the calls phase ends with CallsFinished)"
            )


@attrs.frozen(kw_only=True)
class CallsFinished:
    """The task's calls phase ended, as the dispatch core reported it."""

    task_id: str
    outcome: CallPhaseOutcome
    now_ms: int
    stimulus_id: str


@attrs.frozen(kw_only=True)
class WatchAttached:
    """The first watch stream for `task_id` attached."""

    task_id: str
    now_ms: int
    stimulus_id: str


@attrs.frozen(kw_only=True)
class WatchDetached:
    """The last watch stream for `task_id` ended cleanly."""

    task_id: str
    now_ms: int
    stimulus_id: str


@attrs.frozen(kw_only=True)
class WatchDisconnected:
    """The last watch stream for `task_id` broke (client gone or transport lost)."""

    task_id: str
    now_ms: int
    stimulus_id: str


@attrs.frozen(kw_only=True)
class TimerFired:
    """A timer from `SlotMachine.due_timers` came due and the runtime fed it back."""

    timer: Timer
    now_ms: int
    stimulus_id: str


@attrs.frozen(kw_only=True)
class WorkerReady:
    """Whether any executor is healthy changed: the worker admits work only while one is
    (`ready`), and not before the first is up."""

    now_ms: int
    stimulus_id: str
    ready: bool = True


@attrs.frozen(kw_only=True)
class DrainStarted:
    """The worker stopped admitting new work."""

    now_ms: int
    stimulus_id: str


@attrs.frozen(kw_only=True)
class DrainDeadlinePassed:
    """The drain timeout ran out: whatever is still live must end now."""

    now_ms: int
    stimulus_id: str


@attrs.frozen(kw_only=True)
class TaskCancelled:
    """Whoever the task runs for gave it up (a hub ended the attempt's lease): a submitted
    task ends FAILED with `failure_code` at once; anything else is left as it is."""

    task_id: str
    failure_code: FailureCode
    message: str
    now_ms: int
    stimulus_id: str


Event = (
    SlotRequested
    | TaskSubmitted
    | ActivationPrepared
    | ActivationFailed
    | PhaseFinished
    | CallsFinished
    | WatchAttached
    | WatchDetached
    | WatchDisconnected
    | TimerFired
    | WorkerReady
    | DrainStarted
    | DrainDeadlinePassed
    | TaskCancelled
)
