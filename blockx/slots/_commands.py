"""Commands: what the slot machine tells the runtime to do. Named in the imperative.

Each carries the id of the stimulus that caused it. The runtime carries them
out and reports back with events; it never decides slot or phase state itself.
A command that starts a phase names that phase in `phase`.
"""

from __future__ import annotations

from typing import ClassVar

import attrs

from blockx.calls import RetryPolicy
from blockx.slots._model import ForgetReason, TaskPhase, TaskResult, TaskSpec


@attrs.frozen(kw_only=True)
class PrepareTaskActivation:
    """Start the task's runtime: pin a code epoch, open its IO scope, report back."""

    phase: ClassVar[TaskPhase] = TaskPhase.PREPARING
    task_id: str
    slot_id: str
    spec: TaskSpec
    retry_policy: RetryPolicy
    deadline_ms: int
    stimulus_id: str


@attrs.frozen(kw_only=True)
class StartBuilderPhase:
    phase: ClassVar[TaskPhase] = TaskPhase.BUILDER
    task_id: str
    task_code_epoch: str
    stimulus_id: str


@attrs.frozen(kw_only=True)
class StartCallPhase:
    phase: ClassVar[TaskPhase] = TaskPhase.CALLS
    task_id: str
    call_count: int
    streaming: bool
    stimulus_id: str


@attrs.frozen(kw_only=True)
class StartPluginPhase:
    """Store `outputs` (the values of the calls that succeeded, in call order)."""

    phase: ClassVar[TaskPhase] = TaskPhase.PLUGIN
    task_id: str
    outputs: tuple[bytes, ...] = attrs.field(repr=False)
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


StartPhase = StartBuilderPhase | StartCallPhase | StartPluginPhase
"""A command that starts one of the phases a task actor runs."""

Command = PrepareTaskActivation | StartPhase | ConvergeTask | ForgetTask
