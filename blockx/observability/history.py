"""The worker's recent task figures, one point a second, for the status page's charts.

`TaskHistory` keeps the last `HISTORY_S` seconds: per second, the tasks that
finished in it (succeeded, failed), the calls those tasks made, and the 50th
and 99th percentiles of their total time. A finished task costs `record` a few
additions and one list append; a second's percentiles are computed once, when
a later second begins (one sort per second, never one per task). The seconds
live in a ring, so memory stays flat however long the worker runs.

Pure: nothing here reads a clock. Every call says what time it is (`now_ms`,
epoch milliseconds), and time never goes back: a task recorded with a time in
a second already closed counts in the open one.
"""

from __future__ import annotations

import math
from typing import Final

import attrs

HISTORY_S: Final = 300
"""Seconds kept and shown: five minutes, one point a second (300 points a series)."""
STEP_MS: Final = 1000
"""One point per this many milliseconds."""


@attrs.frozen(kw_only=True)
class HistoryWindow:
    """Whole seconds of history: point `i` is the second from `start_ms + i * STEP_MS`.

    `p50_ms` and `p99_ms` are None for a second in which no task finished.
    """

    start_ms: int
    succeeded: tuple[int, ...]
    failed: tuple[int, ...]
    calls: tuple[int, ...]
    p50_ms: tuple[int | None, ...]
    p99_ms: tuple[int | None, ...]

    @property
    def end_ms(self) -> int:
        """Where the window ends (exclusive): the start of the second after its last point."""
        return self.start_ms + len(self.succeeded) * STEP_MS


class TaskHistory:
    """The last `seconds` whole seconds of finished tasks, from `started_at_ms` on."""

    def __init__(self, started_at_ms: int, *, seconds: int = HISTORY_S) -> None:
        self.seconds = seconds
        self._first_s = started_at_ms // STEP_MS
        size = seconds + 1  # the closed seconds shown, and the open one
        self._second = [-1] * size
        """Which second each place of the ring holds (-1: none yet)."""
        self._succeeded = [0] * size
        self._failed = [0] * size
        self._calls = [0] * size
        self._p50: list[int | None] = [None] * size
        self._p99: list[int | None] = [None] * size
        self._open_s = self._first_s
        self._open_latencies: list[int] = []
        self._clear(self._first_s)

    def record(self, now_ms: int, *, succeeded: bool, total_ms: int, calls: int) -> None:
        """A task finished at `now_ms`, after `total_ms`, having made `calls` calls."""
        self._advance(now_ms // STEP_MS)
        place = self._open_s % len(self._second)
        if succeeded:
            self._succeeded[place] += 1
        else:
            self._failed[place] += 1
        self._calls[place] += calls
        self._open_latencies.append(total_ms)

    def window(self, now_ms: int, *, since_ms: int | None = None) -> HistoryWindow:
        """The whole seconds before the one `now_ms` is in, at most `seconds` of them and
        none before the start; with `since_ms`, only those from the one it is in on."""
        now_s = now_ms // STEP_MS
        self._advance(now_s)
        first_s = max(self._first_s, now_s - self.seconds)
        if since_ms is not None:
            first_s = max(first_s, since_ms // STEP_MS)
        places = [self._place(second) for second in range(first_s, now_s)]
        return HistoryWindow(
            start_ms=first_s * STEP_MS,
            succeeded=tuple(0 if p is None else self._succeeded[p] for p in places),
            failed=tuple(0 if p is None else self._failed[p] for p in places),
            calls=tuple(0 if p is None else self._calls[p] for p in places),
            p50_ms=tuple(None if p is None else self._p50[p] for p in places),
            p99_ms=tuple(None if p is None else self._p99[p] for p in places),
        )

    def _advance(self, second: int) -> None:
        """Close the open second if `second` is a later one, and open `second`."""
        if second <= self._open_s:
            return
        if self._open_latencies:
            ordered = sorted(self._open_latencies)
            place = self._open_s % len(self._second)
            self._p50[place] = _percentile(ordered, 0.50)
            self._p99[place] = _percentile(ordered, 0.99)
            self._open_latencies = []
        self._open_s = second
        self._clear(second)

    def _clear(self, second: int) -> None:
        place = second % len(self._second)
        self._second[place] = second
        self._succeeded[place] = self._failed[place] = self._calls[place] = 0
        self._p50[place] = self._p99[place] = None

    def _place(self, second: int) -> int | None:
        """Where `second` is in the ring, or None if it was never opened (nothing happened
        in it: no task finished, no window was read)."""
        place = second % len(self._second)
        return place if self._second[place] == second else None


def _percentile(ordered: list[int], share: float) -> int:
    """The nearest-rank percentile of the sorted, non-empty `ordered`."""
    return ordered[max(0, math.ceil(share * len(ordered)) - 1)]
