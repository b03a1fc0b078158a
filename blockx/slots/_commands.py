"""Commands: what the slot machine tells the runtime to do. Named in the imperative.

Each carries the id of the stimulus that caused it. The runtime carries them
out and reports back with events; it never decides slot or phase state itself.
"""

from __future__ import annotations

import attrs

from blockx.slots._model import ForgetReason, RetryPolicy, TaskResult, TaskSpec


@attrs.frozen(kw_only=True)
class PrepareTaskActivation:
    """Start the task's runtime: pin a code epoch, open its IO scope, report back."""

    task_id: str
    slot_id: str
    spec: TaskSpec
    retry_policy: RetryPolicy
    deadline_ms: int
    stimulus_id: str


@attrs.frozen(kw_only=True)
class StartBuilderPhase:
    task_id: str
    task_code_epoch: str
    stimulus_id: str


@attrs.frozen(kw_only=True)
class StartCallPhase:
    task_id: str
    call_count: int
    streaming: bool
    stimulus_id: str


@attrs.frozen(kw_only=True)
class StartWriterPhase:
    task_id: str
    stimulus_id: str


@attrs.frozen(kw_only=True)
class ConvergeTask:
    """The task has ended: cancel what it still runs, close its scope, tell watchers.

    The slot is already free when this command is issued.
    """

    task_id: str
    result: TaskResult
    stimulus_id: str


@attrs.frozen(kw_only=True)
class ForgetTask:
    """The machine no longer knows `task_id`; drop anything kept for it."""

    task_id: str
    reason: ForgetReason
    stimulus_id: str


Command = (
    PrepareTaskActivation
    | StartBuilderPhase
    | StartCallPhase
    | StartWriterPhase
    | ConvergeTask
    | ForgetTask
)
