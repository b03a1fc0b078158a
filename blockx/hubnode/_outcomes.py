"""How a node's task result becomes the outcome of the hub's attempt: the one table.

The hub decides what happens next from the outcome (see `blockx.hub` rules):
SUCCEEDED ends the task; FAILED and not retryable ends it FAILED; FAILED and
retryable queues it again while attempts and time remain ("it had no
effect, and another try may succeed"); UNKNOWN ("it may have had its
effect") queues an idempotent task again and sends any other to review.

| the node's task ended                                         | the attempt reports      |
|---------------------------------------------------------------|--------------------------|
| SUCCEEDED                                                     | SUCCEEDED                |
| FAILED with a code of the task itself (`DETERMINISTIC`)       | FAILED, not retryable    |
| FAILED with a code of the node (`NODE`) before its plugin ran | FAILED, retryable        |
| FAILED with a code of the node while its plugin ran           | UNKNOWN                  |
| FAILED with a code whose effect is unknown (`UNCERTAIN`)      | UNKNOWN                  |
| FAILED without a code, or with one not in this table          | UNKNOWN                  |

The plugin is the phase that stores a task's outputs: a node that fails
while it runs cannot say whether part of them was written. The result (or
the failure details) is the task's result as `blockx submit --watch` prints
it: state, phase, failure code, message, call stats, timings and the
`result` plugin's outputs when it kept them. UNKNOWN carries the code only.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

from blockx.calls import FailureCode
from blockx.hubwire import Failed, Outcome, Succeeded, Unknown
from blockx.slots import TaskPhase, TaskResult, TaskState

DETERMINISTIC: Final = frozenset(
    {
        FailureCode.BUILDER_NOT_FOUND,
        FailureCode.PLUGIN_NOT_FOUND,
        FailureCode.BUILDER_FAILED,
        FailureCode.CALLS_FAILED,
        FailureCode.OUTPUTS_TOO_LARGE,
        FailureCode.CALL_RAISED,
        FailureCode.UNKNOWN_FUNCTION,
        FailureCode.INVALID_ARGS,
        FailureCode.RESULT_NOT_SERIALIZABLE,
        FailureCode.RESULT_TOO_LARGE,
    }
)
"""The task would fail the same way on any node: running it again cannot help."""

NODE: Final = frozenset(
    {
        FailureCode.ACTIVATION_FAILED,
        FailureCode.IO_SCOPE_FAILED,
        FailureCode.SLOT_LOST,
        FailureCode.PHASE_IO_TIMEOUT,
        FailureCode.TIMED_OUT,
        FailureCode.WATCH_DISCONNECTED,
        FailureCode.WORKER_SHUTDOWN,
        FailureCode.CALL_RAISED_RETRYABLE,
        FailureCode.CODE_UNAVAILABLE,
        FailureCode.CALL_CANCELLED,
        FailureCode.DEADLINE_EXCEEDED,
        FailureCode.EXECUTOR_LOST,
        FailureCode.EXECUTOR_WEDGED,
    }
)
"""The node failed the task (or a call asked to be retried): another try, on this node or
another, may succeed."""

UNCERTAIN: Final = frozenset(
    {FailureCode.PLUGIN_FAILED, FailureCode.LEASE_LOST, FailureCode.CALL_REVOKED}
)
"""The task's effect is unknown: its plugin failed part way, its lease was ended under it,
or a code that never ends a task reached one."""

KIND_OF: Final[Mapping[FailureCode, str]] = {
    **dict.fromkeys(DETERMINISTIC, "deterministic"),
    **dict.fromkeys(NODE, "node"),
    **dict.fromkeys(UNCERTAIN, "uncertain"),
}
"""Every failure code's kind: the docs print this table."""


def attempt_outcome(result: TaskResult, document: str) -> Outcome:
    """The outcome of the attempt whose task ended with `result`; `document` is the result as
    JSON text (the attempt's result, or its failure details)."""
    if result.state is TaskState.SUCCEEDED:
        return Succeeded(result=document)
    code = result.failure_code
    if code is None:
        return Unknown(code="NO_FAILURE_CODE")
    kind = KIND_OF.get(code, "uncertain")
    if kind == "deterministic":
        return Failed(code=code.value, details=document, retryable=False)
    if kind == "node" and result.phase is not TaskPhase.PLUGIN:
        return Failed(code=code.value, details=document, retryable=True)
    return Unknown(code=code.value)
