"""The worker's clock and the timer actor.

The slot table works in epoch milliseconds (leases and results carry them to
clients). `WorkerClock` reads them from Trio's clock, anchored to the wall
clock once at start, so time never goes backwards and tests can run the
whole worker on Trio's virtual clock.

The timer actor sleeps until the slot table's next deadline, and at most
`max_sleep_ms`, then tells the slot-table actor to scan its due timers. The
slot-table actor lowers the wake-up with `wake_at` when it arms an earlier
deadline.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

import trio

from blockx.actors._messages import SlotTableMessage, TimersDue

TICK_MS = 500


class WorkerClock:
    def __init__(self, *, epoch_ms: int | None = None) -> None:
        anchor = int(time.time() * 1000) if epoch_ms is None else epoch_ms
        self._offset_ms = anchor - math.floor(trio.current_time() * 1000)

    def now_ms(self) -> int:
        return self._offset_ms + math.ceil(trio.current_time() * 1000)

    def trio_time(self, at_ms: int) -> float:
        """The Trio clock reading at which `now_ms()` reaches `at_ms`."""
        return (at_ms - self._offset_ms) / 1000


class TimerActor:
    def __init__(
        self,
        *,
        clock: WorkerClock,
        to_slot_table: Callable[[SlotTableMessage], None],
        max_sleep_ms: int = TICK_MS,
    ) -> None:
        self._clock = clock
        self._to_slot_table = to_slot_table
        self._max_sleep_s = max_sleep_ms / 1000
        self._scope: trio.CancelScope | None = None

    def wake_at(self, due_ms: int) -> None:
        """Make the next scan happen no later than `due_ms`."""
        if self._scope is not None:
            self._scope.deadline = min(self._scope.deadline, self._clock.trio_time(due_ms))

    async def run(self) -> None:
        while True:
            with trio.CancelScope(deadline=trio.current_time() + self._max_sleep_s) as scope:
                self._scope = scope
                await trio.sleep_forever()
            # No checkpoint until the next scope exists, so `wake_at` always
            # finds the scope that is current.
            self._to_slot_table(TimersDue())
