"""The one registry of failure codes: every code a task result or a call can carry.

A code names what went wrong in a way a coordinator can branch on; the
message next to it is for people. Codes are stable strings (they travel in
`TaskResult.failure_code` over gRPC and in executor frames), so a member is
never renamed. Whether a failure is retryable travels beside the code, not in
it: a code says *what* failed, the flag says whether trying again may help.
"""

from __future__ import annotations

import enum


class FailureCode(enum.StrEnum):
    """Why a task or a call attempt failed. Members are grouped by who assigns them."""

    # --- a task, before its phases run
    ACTIVATION_FAILED = "ACTIVATION_FAILED"
    """No function code could be pinned for the task (none loaded yet)."""
    BUILDER_NOT_FOUND = "BUILDER_NOT_FOUND"
    """No builder of the task's function-call type is registered in this worker (found at
    activation: no call has run)."""
    PLUGIN_NOT_FOUND = "PLUGIN_NOT_FOUND"
    """No plugin of the result handler's type is registered in this worker (found at
    activation: neither the builder nor any call has run)."""
    IO_SCOPE_FAILED = "IO_SCOPE_FAILED"
    """The task's IO scope (its connections to sources and sinks) could not be opened."""
    SLOT_LOST = "SLOT_LOST"
    """The slot's lease ran out before the task was activated."""

    # --- a task's phases
    BUILDER_FAILED = "BUILDER_FAILED"
    """The builder refused the payload or its config (or raised)."""
    CALLS_FAILED = "CALLS_FAILED"
    """The calls phase failed without a more specific call code."""
    PLUGIN_FAILED = "PLUGIN_FAILED"
    """The plugin could not store the outputs (or raised)."""
    OUTPUTS_TOO_LARGE = "OUTPUTS_TOO_LARGE"
    """The outputs, as JSON, are larger than the `result` plugin keeps in a retained result."""
    PHASE_IO_TIMEOUT = "PHASE_IO_TIMEOUT"
    """A builder or plugin took longer than `phaseIoTimeoutMs`."""

    # --- a task ended from outside
    TIMED_OUT = "TIMED_OUT"
    """The task deadline passed."""
    WATCH_DISCONNECTED = "WATCH_DISCONNECTED"
    """The task's last watcher went away and none came back within the grace."""
    WORKER_SHUTDOWN = "WORKER_SHUTDOWN"
    """The worker stopped before the task finished."""
    LEASE_LOST = "LEASE_LOST"
    """The task ran for a hub's attempt, and the hub ended the attempt's lease first."""

    # --- a call attempt, as an executor reports it
    CALL_RAISED = "CALL_RAISED"
    """The function raised."""
    CALL_RAISED_RETRYABLE = "CALL_RAISED_RETRYABLE"
    """The function raised `blockx.RetryableError` (or let a retryable subcall failure out)."""
    UNKNOWN_FUNCTION = "UNKNOWN_FUNCTION"
    """No such module or callable in the call's code epoch."""
    CODE_UNAVAILABLE = "CODE_UNAVAILABLE"
    """The worker could not supply the module's source."""
    INVALID_ARGS = "INVALID_ARGS"
    """The call's arguments are not a msgpack argument list or keyword map."""
    RESULT_NOT_SERIALIZABLE = "RESULT_NOT_SERIALIZABLE"
    """The return value has no msgpack form."""
    RESULT_TOO_LARGE = "RESULT_TOO_LARGE"
    """The encoded return value exceeds the executor's result size limit."""
    CALL_CANCELLED = "CALL_CANCELLED"
    """Cancelled before it started, or while it waited on a subcall."""
    CALL_REVOKED = "CALL_REVOKED"
    """Taken back before it started, to run on an executor that is idle: the call
    runs again elsewhere and the attempt does not count; never a task's code."""

    # --- a call attempt, as the dispatcher ends it
    DEADLINE_EXCEEDED = "DEADLINE_EXCEEDED"
    """The call deadline passed (queued on the executor, or running)."""
    EXECUTOR_LOST = "EXECUTOR_LOST"
    """The executor died or stopped answering during the call."""
    EXECUTOR_WEDGED = "EXECUTOR_WEDGED"
    """The executor's loop stalled during the call and it was killed."""
