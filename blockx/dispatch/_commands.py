"""Commands of the call-dispatch core: what the dispatcher actor must do. Imperative names."""

from __future__ import annotations

from typing import NamedTuple

import attrs

from blockx.calls import CallOutcome, CallPhaseOutcome


class CallDispatch(NamedTuple):
    """One attempt of one call, sent to an executor.

    A named tuple rather than an attrs class: one is made per call attempt, on the
    hottest path of the core, and a tuple is made at a fraction of the cost."""

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
class RevokeCalls:
    """Give these (call id, attempt) pairs back if they have not started; an attempt
    given back is answered with a CALL_REVOKED outcome, one that started runs on."""

    executor_id: str
    attempts: tuple[tuple[str, int], ...]


@attrs.frozen(kw_only=True)
class DeliverSubcallResult:
    """Hand the final outcome of a subcall to the attempt that waits for it."""

    executor_id: str
    parent_call_id: str
    parent_attempt: int
    outcome: CallOutcome


@attrs.frozen(kw_only=True)
class FinishCallPhase:
    """The task's calls phase has ended with `outcome`; the core has forgotten the task."""

    task_id: str
    outcome: CallPhaseOutcome


@attrs.frozen(kw_only=True)
class ReplaceExecutor:
    """`executor_id` has not stopped a cancelled call within the cancel grace: end its
    process and start another (its `ExecutorLeft` follows)."""

    executor_id: str
    why: str


DispatchCommand = (
    RunCalls | CancelCalls | RevokeCalls | DeliverSubcallResult | FinishCallPhase | ReplaceExecutor
)
