"""The worker's clock: epoch milliseconds from Trio's clock, and the Trio time of a millisecond."""

from __future__ import annotations

import trio
import trio.testing

from blockx.process.clock import EpochClock

EPOCH_MS = 1_700_000_000_000


async def test_waking_at_the_trio_time_of_a_millisecond_reads_that_millisecond(
    autojump_clock: trio.testing.MockClock,
) -> None:
    # A timer armed for `due_ms` wakes at `trio_time(due_ms)`; reading one millisecond
    # more there (float rounding: 2.007 * 1000 > 2007) made timers fire late.
    clock = EpochClock(epoch_ms=EPOCH_MS)
    late = []
    for ms in range(1, 5_000):
        await trio.sleep_until(clock.trio_time(EPOCH_MS + ms))
        if clock.now_ms() != EPOCH_MS + ms:
            late.append(ms)
    assert late == []


async def test_a_reading_between_two_milliseconds_is_the_later_one(
    autojump_clock: trio.testing.MockClock,
) -> None:
    clock = EpochClock(epoch_ms=EPOCH_MS)
    assert clock.now_ms() == EPOCH_MS
    await trio.sleep_until(2.0005)
    assert clock.now_ms() == EPOCH_MS + 2_001
    assert clock.trio_time(EPOCH_MS + 2_001) == 2.001


async def test_a_worker_thread_reads_the_same_time(
    autojump_clock: trio.testing.MockClock,
) -> None:
    # The hub makes its ids inside database batches, which run in a worker thread.
    clock = EpochClock(epoch_ms=EPOCH_MS)
    await trio.sleep(1.5)
    assert await trio.to_thread.run_sync(clock.now_ms) == clock.now_ms() == EPOCH_MS + 1_500
