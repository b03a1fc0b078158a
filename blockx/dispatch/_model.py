"""How one task's calls run: its `CallPolicy`.

The retry rules are the task's `RetryPolicy` (one set of rules for the whole
worker, in `blockx.calls`); window and call deadline are the worker's
dispatcher settings. Checked when made: a policy the core cannot honour is
the runtime's bug, never a client's mistake (the slot table refuses a bad
retry policy before a task is accepted).
"""

from __future__ import annotations

import attrs

from blockx.calls import CallFailurePolicy, RetryPolicy
from blockx.errors import Misuse


@attrs.frozen(kw_only=True)
class CallPolicy:
    """Retries, failure policy, the in-flight window and the call deadline of one task."""

    retry: RetryPolicy
    failure_policy: CallFailurePolicy
    window: int
    """Top-level calls of the task running at once."""
    call_deadline_ms: int

    def __attrs_post_init__(self) -> None:
        violation = self.retry.first_violation()
        if violation is not None or self.window < 1 or self.call_deadline_ms < 1:
            raise Misuse(what=f"invalid call policy {self!r}")

    @property
    def fail_fast(self) -> bool:
        return self.failure_policy is CallFailurePolicy.FAIL_FAST
