"""Settings of the slot table (the `worker.*` fields of the configuration) and their checks.

The defaults are declared once, in `blockx.config`; this class only checks
that the values it is given fit together.
"""

from __future__ import annotations

import attrs

from blockx.calls import RetryPolicy
from blockx.slots._errors import InvalidConfig

_RETRY_FIELDS = {
    "max_attempts": "worker.defaultMaxAttempts",
    "base_backoff_ms": "worker.defaultBaseBackoffMs",
    "jitter_percent": "worker.defaultRetryJitterPercent",
}


@attrs.frozen(kw_only=True)
class SlotConfig:
    task_slots: int
    default_ttl_ms: int
    task_deadline_ms: int
    max_task_timeout_ms: int
    result_retention_ms: int
    result_retention_bytes: int
    watch_disconnect_grace_ms: int
    default_retry_policy: RetryPolicy

    def __attrs_post_init__(self) -> None:
        check = InvalidConfig.check
        check(
            self.task_slots > 0,
            field="worker.taskSlots",
            value=self.task_slots,
            allowed="must be > 0",
        )
        check(
            self.default_ttl_ms > 0,
            field="worker.defaultTTLMs",
            value=self.default_ttl_ms,
            allowed="must be > 0",
        )
        check(
            self.max_task_timeout_ms > 0,
            field="worker.maxTaskTimeoutMs",
            value=self.max_task_timeout_ms,
            allowed="must be > 0",
        )
        check(
            0 < self.task_deadline_ms <= self.max_task_timeout_ms,
            field="worker.taskDeadlineMs",
            value=self.task_deadline_ms,
            allowed=f"must be > 0 and <= worker.maxTaskTimeoutMs ({self.max_task_timeout_ms})",
        )
        check(
            self.result_retention_ms >= 0,
            field="worker.resultRetentionMs",
            value=self.result_retention_ms,
            allowed="must be >= 0",
        )
        check(
            self.result_retention_bytes > 0,
            field="worker.resultRetentionBytes",
            value=self.result_retention_bytes,
            allowed="must be > 0 (the newest result is always kept, even one larger than this)",
        )
        check(
            self.watch_disconnect_grace_ms >= 0,
            field="worker.watchDisconnectGraceMs",
            value=self.watch_disconnect_grace_ms,
            allowed="must be >= 0 (0 turns reclamation off)",
        )
        violation = self.default_retry_policy.first_violation()
        if violation is not None:
            attribute, value, allowed = violation
            raise InvalidConfig(field=_RETRY_FIELDS[attribute], value=value, allowed=allowed)
