"""The worker's one clock: epoch milliseconds read from Trio's clock.

Leases, deadlines and results carry epoch milliseconds to clients, so the
worker's time is the wall clock, anchored once at start and then advanced by
Trio's clock: it never goes backwards, and tests run a whole worker on Trio's
virtual clock. Every part of the worker that reads time (the slot table, the
dispatcher, the executor pool, the code refresher) reads this one, so their
figures agree to the millisecond.
"""

from __future__ import annotations

import math
import time

import trio


class WorkerClock:
    def __init__(self, *, epoch_ms: int | None = None) -> None:
        anchor = int(time.time() * 1000) if epoch_ms is None else epoch_ms
        self._offset_ms = anchor - math.floor(trio.current_time() * 1000)

    def now_ms(self) -> int:
        return self._offset_ms + math.ceil(trio.current_time() * 1000)

    def trio_time(self, at_ms: int) -> float:
        """The Trio clock reading at which `now_ms()` reaches `at_ms`."""
        return (at_ms - self._offset_ms) / 1000
