"""Events of the call-dispatch core: what happened, named in the past tense.

Every event carries `now_ms` and the id of the stimulus that caused it;
events that may schedule a retry also carry `draw`, a uniform number in
[0, 1) drawn by the runtime, from which the core takes its back-off jitter,
so the core itself never draws a random number.
"""

from __future__ import annotations

import attrs

from blockx.calls import CallOutcome, CallSpec, FailureCode, Succeeded
from blockx.dispatch._model import CallPolicy
from blockx.errors import Misuse


def _check_draw(_: object, __: attrs.Attribute[float], draw: float) -> None:
    if not 0.0 <= draw < 1.0:
        raise Misuse(what=f"draw={draw!r} must be in [0, 1)")


@attrs.frozen(kw_only=True)
class ExecutorJoined:
    """An executor is ready; it takes up to `capacity` calls at once (pipelined)."""

    executor_id: str
    capacity: int
    now_ms: int
    stimulus_id: str


@attrs.frozen(kw_only=True)
class ExecutorLeft:
    """An executor is gone (`error_code` EXECUTOR_LOST or EXECUTOR_WEDGED)."""

    executor_id: str
    error_code: FailureCode
    now_ms: int
    stimulus_id: str
    draw: float = attrs.field(default=0.0, validator=_check_draw)


@attrs.frozen(kw_only=True)
class TaskOpened:
    task_id: str
    policy: CallPolicy
    now_ms: int
    stimulus_id: str


@attrs.frozen(kw_only=True)
class CallsAdded:
    """More calls of a task; `sealed` says no more will follow. The core knows each call
    by `id_prefix` followed by its spec's id (and answers and commands use that id)."""

    task_id: str
    calls: tuple[CallSpec, ...]
    sealed: bool
    now_ms: int
    stimulus_id: str
    id_prefix: str = ""


@attrs.frozen(kw_only=True)
class CallResultsArrived:
    """Attempts of `executor_id` ended: `succeeded` in bulk, then `outcomes` (any kind)."""

    executor_id: str
    outcomes: tuple[CallOutcome, ...]
    now_ms: int
    stimulus_id: str
    draw: float = attrs.field(default=0.0, validator=_check_draw)
    succeeded: tuple[Succeeded, ...] = ()


@attrs.frozen(kw_only=True)
class SubcallRequested:
    """A running call asked for another call and waits for its result."""

    executor_id: str
    parent_call_id: str
    parent_attempt: int
    subcall: CallSpec
    now_ms: int
    stimulus_id: str


@attrs.frozen(kw_only=True)
class TaskCancelled:
    task_id: str
    now_ms: int
    stimulus_id: str


@attrs.frozen(kw_only=True)
class ClockTicked:
    """Time passed: back-offs may be over, call deadlines may have passed."""

    now_ms: int
    stimulus_id: str
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
