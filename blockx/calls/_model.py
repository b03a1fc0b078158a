"""Values of call execution: what a call is, how an attempt ended, how a task's calls ended.

These cross every boundary of the worker unchanged: a builder makes
`CallSpec`s, the dispatch core runs them under a `RetryPolicy`, an executor
answers each attempt with a `CallOutcome`, the dispatch core ends a task's
calls phase with a `CallPhaseOutcome` (its `CallStats` included) and the slot
table records that outcome in the task's result. Immutable values only.
"""

from __future__ import annotations

import enum
from typing import Final, TypeAlias

import attrs

from blockx.calls._codes import FailureCode
from blockx.errors import Misuse

MAX_JITTER_PERCENT: Final = 5


class CallFailurePolicy(enum.Enum):
    """What a call that failed for good does to its task."""

    FAIL_FAST = "FAIL_FAST"
    """The calls phase fails at once; the task's other calls are cancelled."""
    BEST_EFFORT = "BEST_EFFORT"
    """Every call runs; the phase succeeds and reports the failures."""


@attrs.frozen(kw_only=True)
class RetryPolicy:
    """How often a call whose attempt failed retryably runs again, and after what delay."""

    max_attempts: int
    base_backoff_ms: int
    jitter_percent: int
    at_most_once: bool = False
    """An attempt that may have run (its executor was lost or killed under it, its call
    deadline passed while it ran) is never run again: for functions that are not
    idempotent. Off, such a call runs again (at least once)."""

    def first_violation(self) -> tuple[str, int, str] | None:
        """(attribute, value, what is allowed) of the first out-of-range field, if any.

        Not checked on construction: a policy from a client is checked where the
        client can be told which of its fields is wrong.
        """
        if self.max_attempts < 1:
            return ("max_attempts", self.max_attempts, "must be >= 1")
        if self.base_backoff_ms < 0:
            return ("base_backoff_ms", self.base_backoff_ms, "must be >= 0")
        if not 0 <= self.jitter_percent <= MAX_JITTER_PERCENT:
            return ("jitter_percent", self.jitter_percent, f"between 0 and {MAX_JITTER_PERCENT}")
        return None

    def backoff_ms(self, attempt: int, draw: float) -> int:
        """Delay before attempt `attempt + 1`, after `attempt` attempts failed.

        `base * 2**(attempt-1)` plus up to `jitter_percent` of that, scaled by
        `draw` (uniform in [0, 1), drawn by the caller).
        """
        base = self.base_backoff_ms << (attempt - 1)
        return base + int(base * self.jitter_percent * draw / 100)


@attrs.frozen(kw_only=True)
class CallSpec:
    """One call as a builder describes it; `args` is `encode_args` bytes, opaque to the cores."""

    call_id: str
    function: str
    args: bytes = b""


@attrs.frozen(kw_only=True)
class CallOutcome:
    """How one attempt of a call ended: a msgpack `value`, or a failure code and message."""

    call_id: str
    attempt: int
    ok: bool
    value: bytes = b""
    error_code: FailureCode | None = None
    error_message: str = ""
    retryable: bool = False

    def __attrs_post_init__(self) -> None:
        if self.ok != (self.error_code is None) or self.ok != bool(self.value):
            raise Misuse(
                what=f"call outcome {self.call_id!r}: ok={self.ok} with "
                f"error_code={self.error_code!r} and {len(self.value)} value bytes "
                "(a success has a value and no code, a failure a code and no value)"
            )

    @classmethod
    def success(cls, *, call_id: str, attempt: int, value: bytes) -> CallOutcome:
        return cls(call_id=call_id, attempt=attempt, ok=True, value=value)

    @classmethod
    def failure(
        cls,
        *,
        call_id: str,
        attempt: int,
        error_code: FailureCode,
        error_message: str,
        retryable: bool,
    ) -> CallOutcome:
        return cls(
            call_id=call_id,
            attempt=attempt,
            ok=False,
            error_code=error_code,
            error_message=error_message,
            retryable=retryable,
        )


Succeeded: TypeAlias = tuple[str, int, bytes]
"""(call id, attempt, msgpack value) of an attempt that succeeded: how successes travel
in bulk, from an executor's frame to the dispatch core, without a `CallOutcome` each.
The value is never empty (as in a successful `CallOutcome`)."""


@attrs.frozen(kw_only=True)
class CallFailure:
    """A call of a task that failed for good, after `attempts` attempts."""

    call_id: str
    function: str
    attempts: int
    error_code: FailureCode
    error_message: str


@attrs.frozen(kw_only=True)
class CallStats:
    """What happened to one task's calls."""

    calls_total: int = 0
    calls_succeeded: int = 0
    calls_failed: int = 0
    calls_retried: int = 0
    """Attempts that were retries."""
    subcalls: int = 0


@attrs.frozen(kw_only=True)
class CallPhaseOutcome:
    """The end of a task's calls phase, as the slot table records it.

    Fail fast: `ok` is False after the first call that failed for good.
    Best effort: `ok` is True once every call ended; `failures` lists the rest
    and `message` names the first. `outputs` holds the values of the calls
    that succeeded, in call order.
    """

    ok: bool
    failure_code: FailureCode | None = None
    message: str = ""
    retryable: bool = False
    stats: CallStats = CallStats()
    outputs: tuple[bytes, ...] = attrs.field(default=(), repr=False)
    failures: tuple[CallFailure, ...] = ()

    @property
    def output_count(self) -> int:
        return len(self.outputs)

    @property
    def output_bytes(self) -> int:
        return sum(len(value) for value in self.outputs)
