"""Settings of the executor pool, with their defaults and their checks.

Names in errors are the configuration fields (`executorCount`, ...). Must never
read the environment or a file: the application's configuration layer does
that and builds this value.
"""

from __future__ import annotations

import sys

import attrs

from blockx.executors._errors import InvalidPoolConfig
from blockx.executors._wire import MAX_FRAME_BYTES

MAX_RESULT_BYTES_LIMIT = MAX_FRAME_BYTES // 2
"""A batch of results must fit a frame next to its largest result."""


@attrs.frozen(kw_only=True)
class ExecutorPoolConfig:
    executor_count: int = 8
    heartbeat_interval_ms: int = 500
    heartbeat_timeout_ms: int = 5_000
    stall_timeout_ms: int = 60_000
    """Must exceed the longest call deadline: a call that computes for longer
    without returning looks exactly like a stalled loop."""
    health_check_interval_ms: int = 250
    start_timeout_ms: int = 30_000
    """From spawn to an accepted Hello."""
    restart_enabled: bool = True
    restart_delay_ms: int = 1_000
    max_restarts: int = 10
    restart_window_ms: int = 60_000
    restart_backoff_ms: int = 30_000
    grace_ms: int = 5_000
    """How long `stop()` waits after Shutdown before it kills."""
    max_result_bytes: int = 16 * 1024 * 1024
    send_queue_frames: int = 1_024
    """Frames waiting to be written to one executor before `send` refuses."""
    event_buffer: int = 4_096
    """Pool events waiting for the dispatcher before executors' readers wait."""
    python_executable: str = attrs.field(factory=lambda: sys.executable)
    runtime_dir_parent: str | None = None
    """Where the private runtime directory is made; None = the system temp dir."""

    def __attrs_post_init__(self) -> None:
        def need(ok: bool, field: str, value: object, allowed: str) -> None:
            if not ok:
                raise InvalidPoolConfig(field=field, value=value, allowed=allowed)

        interval = self.heartbeat_interval_ms
        need(self.executor_count > 0, "executorCount", self.executor_count, "must be > 0")
        need(interval > 0, "executorHeartbeatIntervalMs", interval, "must be > 0")
        need(
            self.heartbeat_timeout_ms > interval,
            "executorHeartbeatTimeoutMs",
            self.heartbeat_timeout_ms,
            f"must be > executorHeartbeatIntervalMs ({interval})",
        )
        need(
            self.stall_timeout_ms > interval,
            "executorStallTimeoutMs",
            self.stall_timeout_ms,
            f"must be > executorHeartbeatIntervalMs ({interval})",
        )
        need(
            self.health_check_interval_ms > 0,
            "executorHealthCheckIntervalMs",
            self.health_check_interval_ms,
            "must be > 0",
        )
        need(
            self.start_timeout_ms > 0,
            "executorStartTimeoutMs",
            self.start_timeout_ms,
            "must be > 0",
        )
        for field, value in (
            ("executorRestartDelayMs", self.restart_delay_ms),
            ("executorMaxRestarts", self.max_restarts),
            ("executorRestartBackoffMs", self.restart_backoff_ms),
            ("executorStopGraceMs", self.grace_ms),
        ):
            need(value >= 0, field, value, "must be >= 0")
        need(
            self.restart_window_ms > 0,
            "executorRestartWindowMs",
            self.restart_window_ms,
            "must be > 0",
        )
        need(
            0 < self.max_result_bytes <= MAX_RESULT_BYTES_LIMIT,
            "executorMaxResultBytes",
            self.max_result_bytes,
            f"must be > 0 and <= {MAX_RESULT_BYTES_LIMIT}",
        )
        need(
            self.send_queue_frames > 0,
            "executorSendQueueFrames",
            self.send_queue_frames,
            "must be > 0",
        )
        need(self.event_buffer > 0, "executorEventBuffer", self.event_buffer, "must be > 0")
        need(
            bool(self.python_executable),
            "executorPython",
            self.python_executable,
            "must name a Python interpreter",
        )
