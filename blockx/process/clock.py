"""The one clock of a blockx process: epoch milliseconds read from Trio's clock.

Leases, deadlines and results carry epoch milliseconds to clients, so a
process's time is the wall clock, anchored once at start and then advanced by
Trio's clock: it never goes backwards, and tests run a whole worker, hub or
automatic worker on Trio's virtual clock. Every part that reads time (the
worker's slot table, dispatcher, executor pool and code refresher; the hub's
sessions and API; the automatic worker's runtime) reads one `EpochClock`, so
their figures agree to the millisecond. It is made inside `trio.run` and may
be read from any thread: blocking work run off the Trio thread (the hub's
database batches, which make its task and attempt ids) reads the same time.
"""

from __future__ import annotations

import math
import time

import trio


class EpochClock:
    """Epoch milliseconds that advance with the clock of the Trio run it was made in (see
    the module)."""

    def __init__(self, *, epoch_ms: int | None = None) -> None:
        # The run's clock itself, not `trio.current_time()`: that one is only for the Trio
        # thread, and a worker thread of the run must read the same time.
        self._trio_clock = trio.lowlevel.current_clock()
        anchor = int(time.time() * 1000) if epoch_ms is None else epoch_ms
        self._offset_ms = anchor - math.floor(self._trio_ms())

    def now_ms(self) -> int:
        return self._offset_ms + math.ceil(self._trio_ms())

    def trio_time(self, at_ms: int) -> float:
        """The Trio clock reading at which `now_ms()` reaches `at_ms`."""
        return (at_ms - self._offset_ms) / 1000

    def _trio_ms(self) -> float:
        """Trio's clock in milliseconds, rid of the float error of the product (2.007 s
        times 1000 is a hair over 2007): at `trio_time(at_ms)`, `now_ms()` reads `at_ms`,
        not one more, so timers armed for a millisecond fire in it."""
        return round(self._trio_clock.current_time() * 1000, 6)
