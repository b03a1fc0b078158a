"""Settings of the slot table (the seed's `worker.*` fields), with their defaults."""

from __future__ import annotations

import attrs

from blockx.slots._errors import InvalidConfig
from blockx.slots._model import RetryPolicy

_RETRY_FIELDS = {
    "max_attempts": "worker.defaultMaxAttempts",
    "base_backoff_ms": "worker.defaultBaseBackoffMs",
    "jitter_percent": "worker.defaultRetryJitterPercent",
}


@attrs.frozen(kw_only=True)
class SlotConfig:
    task_slots: int = 50
    default_ttl_ms: int = 5_000
    task_deadline_ms: int = 300_000
    max_task_timeout_ms: int = 28_800_000
    result_retention_ms: int = 300_000
    watch_disconnect_grace_ms: int = 0
    default_retry_policy: RetryPolicy = attrs.field(
        factory=lambda: RetryPolicy(max_attempts=3, base_backoff_ms=10, jitter_percent=5)
    )

    def __attrs_post_init__(self) -> None:
        def need(ok: bool, field: str, value: object, allowed: str) -> None:
            if not ok:
                raise InvalidConfig(field=field, value=value, allowed=allowed)

        need(self.task_slots > 0, "worker.taskSlots", self.task_slots, "must be > 0")
        need(self.default_ttl_ms > 0, "worker.defaultTTLMs", self.default_ttl_ms, "must be > 0")
        need(
            self.max_task_timeout_ms > 0,
            "worker.maxTaskTimeoutMs",
            self.max_task_timeout_ms,
            "must be > 0",
        )
        need(
            0 < self.task_deadline_ms <= self.max_task_timeout_ms,
            "worker.taskDeadlineMs",
            self.task_deadline_ms,
            f"must be > 0 and <= worker.maxTaskTimeoutMs ({self.max_task_timeout_ms})",
        )
        need(
            self.result_retention_ms >= 0,
            "worker.resultRetentionMs",
            self.result_retention_ms,
            "must be >= 0",
        )
        need(
            self.watch_disconnect_grace_ms >= 0,
            "worker.watchDisconnectGraceMs",
            self.watch_disconnect_grace_ms,
            "must be >= 0 (0 turns reclamation off)",
        )
        violation = self.default_retry_policy.first_violation()
        if violation is not None:
            attribute, value, allowed = violation
            raise InvalidConfig(field=_RETRY_FIELDS[attribute], value=value, allowed=allowed)
