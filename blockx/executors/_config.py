"""Settings of the executor pool and their checks.

Names in errors are the configuration fields (`executorCount`, ...). The
defaults are declared once, in `blockx.config`; this class never reads the
environment or a file, it only checks that the values fit together.
"""

from __future__ import annotations

import attrs

from blockx.executors._errors import InvalidPoolConfig
from blockx.executors._wire import MAX_FRAME_BYTES

MAX_RESULT_BYTES_LIMIT = MAX_FRAME_BYTES // 2
"""A batch of results must fit a frame next to its largest result."""


@attrs.frozen(kw_only=True)
class ExecutorPoolConfig:
    executor_count: int
    heartbeat_interval_ms: int
    heartbeat_timeout_ms: int
    stall_timeout_ms: int
    """Must exceed the longest call deadline: a call that computes for longer
    without returning looks exactly like a stalled loop."""
    health_check_interval_ms: int
    start_timeout_ms: int
    """From spawn to an accepted Hello."""
    restart_enabled: bool
    restart_delay_ms: int
    max_restarts: int
    restart_window_ms: int
    restart_backoff_ms: int
    grace_ms: int
    """How long `stop()` waits after Shutdown before it kills."""
    max_result_bytes: int
    send_queue_frames: int
    """Frames waiting to be written to one executor before `send` refuses."""
    python_executable: str
    runtime_dir_parent: str | None
    """Where the private runtime directory is made; None = the system temp dir."""

    def __attrs_post_init__(self) -> None:
        check = InvalidPoolConfig.check
        interval = self.heartbeat_interval_ms
        for field, value in (
            ("executorCount", self.executor_count),
            ("executorHeartbeatIntervalMs", interval),
            ("executorHealthCheckIntervalMs", self.health_check_interval_ms),
            ("executorStartTimeoutMs", self.start_timeout_ms),
            ("executorRestartWindowMs", self.restart_window_ms),
            ("executorSendQueueFrames", self.send_queue_frames),
        ):
            check(value > 0, field=field, value=value, allowed="must be > 0")
        for field, value in (
            ("executorHeartbeatTimeoutMs", self.heartbeat_timeout_ms),
            ("executorStallTimeoutMs", self.stall_timeout_ms),
        ):
            check(
                value > interval,
                field=field,
                value=value,
                allowed=f"must be > executorHeartbeatIntervalMs ({interval})",
            )
        for field, value in (
            ("executorRestartDelayMs", self.restart_delay_ms),
            ("executorMaxRestarts", self.max_restarts),
            ("executorRestartBackoffMs", self.restart_backoff_ms),
            ("executorStopGraceMs", self.grace_ms),
        ):
            check(value >= 0, field=field, value=value, allowed="must be >= 0")
        check(
            0 < self.max_result_bytes <= MAX_RESULT_BYTES_LIMIT,
            field="executorMaxResultBytes",
            value=self.max_result_bytes,
            allowed=f"must be > 0 and <= {MAX_RESULT_BYTES_LIMIT}",
        )
        check(
            bool(self.python_executable),
            field="executorPython",
            value=self.python_executable,
            allowed="must name a Python interpreter",
        )
