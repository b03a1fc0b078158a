"""The pool manager's rules: is an executor healthy, and when may it restart.

Owns the heartbeat-timeout and stall rules and the sliding restart window.
Must never import trio, read a clock or touch a process: every time comes in
as `now_ms` (milliseconds on the worker's clock).
"""

from __future__ import annotations

import collections

import attrs

from blockx.executors._model import DownReason
from blockx.executors._wire import Heartbeat


def assess_health(
    *,
    now_ms: int,
    last_heartbeat_at_ms: int,
    heartbeat: Heartbeat | None,
    heartbeat_timeout_ms: int,
    stall_timeout_ms: int,
) -> DownReason | None:
    """LOST when no heartbeat came for more than `heartbeat_timeout_ms`; WEDGED when
    the executor reports a running call and its loop has not progressed for more
    than `stall_timeout_ms`; None when healthy.

    `last_heartbeat_at_ms` is when the last heartbeat arrived (or the connection
    was accepted, before the first). The loop's stall is the age the executor
    reported plus the time since that report.
    """
    silent_ms = now_ms - last_heartbeat_at_ms
    if silent_ms > heartbeat_timeout_ms:
        return DownReason.LOST
    if (
        heartbeat is not None
        and heartbeat.running_call_id is not None
        and heartbeat.loop_progress_age_ms + silent_ms > stall_timeout_ms
    ):
        return DownReason.WEDGED
    return None


@attrs.define
class RestartWindow:
    """Restarts of one executor within the last `window_ms`, and the next delay.

    Below `max_restarts` restarts in the window the next one waits `delay_ms`;
    at or past it, `backoff_ms`. The window slides: old restarts age out.
    """

    delay_ms: int
    max_restarts: int
    window_ms: int
    backoff_ms: int
    _recent: collections.deque[int] = attrs.field(factory=collections.deque, init=False)

    def recent(self, now_ms: int) -> int:
        """Restarts within the window that ends at `now_ms`."""
        horizon = now_ms - self.window_ms
        while self._recent and self._recent[0] <= horizon:
            self._recent.popleft()
        return len(self._recent)

    def next_delay_ms(self, now_ms: int) -> int:
        if self.recent(now_ms) >= self.max_restarts:
            return self.backoff_ms
        return self.delay_ms

    def record(self, now_ms: int) -> None:
        """A restart happened at `now_ms`."""
        self._recent.append(now_ms)
