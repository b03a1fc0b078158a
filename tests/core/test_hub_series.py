"""The dashboard's series (`blockx.hub._series`): buckets of the last hour, counts and
quantiles per bucket, old buckets dropped, bounded memory; every time given explicitly."""

from __future__ import annotations

import math
import sys
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from blockx.hub._series import (
    BINS,
    COUNTS,
    GROWTH,
    LATENCIES,
    QUEUE_BYTES,
    SLOTS,
    SMALLEST_MS,
    STEP_MS,
    WINDOW_MS,
    Kind,
    Series,
    bin_of,
    bin_value,
    rank,
)

START_MS = 1_800_000_003_000
"""The hub's start: 3 s into a bucket."""
FIRST = START_MS - START_MS % STEP_MS


def exact_quantile(values: list[float], percent: int) -> float:
    """The nearest-rank quantile, from every sample."""
    ordered = sorted(values)
    return ordered[math.ceil(len(ordered) * percent / 100) - 1]


def test_each_bin_stands_for_a_value_inside_it() -> None:
    assert [bin_of(bin_value(index)) for index in range(BINS)] == list(range(BINS))
    assert bin_of(0) == bin_of(SMALLEST_MS / 2) == 0
    assert bin_of(SMALLEST_MS) == 1
    assert bin_of(math.inf) == bin_of(1e300) == BINS - 1
    assert bin_of(math.nan) == 0
    assert SMALLEST_MS * GROWTH ** (BINS - 2) > 30 * 86_400_000  # beyond any attempt timeout


def test_rank_is_the_nearest_rank() -> None:
    assert [rank(n, 50) for n in (1, 2, 3, 4)] == [1, 1, 2, 2]
    assert [rank(n, 99) for n in (1, 99, 100, 101, 200)] == [1, 99, 99, 100, 198]


def test_counts_and_latencies_land_in_the_bucket_of_their_time() -> None:
    series = Series(START_MS)
    series.add(START_MS, "q", Kind.SUBMISSIONS, 1)
    series.add(START_MS + 1, "q", Kind.SUBMISSIONS, 1)
    series.add(START_MS + STEP_MS, "q", Kind.SUCCEEDED, 1)
    series.add(START_MS + STEP_MS, "q", Kind.QUEUE_WAIT, 5.0)
    series.add(START_MS + STEP_MS, "q", Kind.QUEUE_WAIT, 500.0)
    series.add(START_MS + 3 * STEP_MS, "other", Kind.FAILED, 1)
    series.add(START_MS + 3 * STEP_MS, "other", Kind.ATTEMPT, 42.0)
    shown = series.snapshot(START_MS + 3 * STEP_MS + 5)
    assert shown["t"] == [FIRST + step * STEP_MS for step in range(4)]
    assert (shown["started_at_ms"], shown["step_ms"], shown["window_ms"]) == (
        START_MS,
        STEP_MS,
        WINDOW_MS,
    )
    q, other = shown["queues"]["q"], shown["queues"]["other"]
    assert q["submissions"] == [2, 0, 0, 0]
    assert q["succeeded"] == [0, 1, 0, 0]
    assert q["failed"] == q["unknown"] == [0, 0, 0, 0]
    assert q["queue_wait_p50_ms"][0] is None
    assert bin_of(q["queue_wait_p50_ms"][1]) == bin_of(5.0)
    assert bin_of(q["queue_wait_p99_ms"][1]) == bin_of(500.0)
    assert q["attempt_p50_ms"] == [None] * 4
    assert other["failed"] == [0, 0, 0, 1]
    assert bin_of(other["attempt_p99_ms"][3]) == bin_of(42.0)  # the bucket still filling
    assert all(len(values) == 4 for values in (*q.values(), *other.values()))
    assert set(q) == {*COUNTS, *LATENCIES}


def test_buckets_older_than_the_window_are_dropped() -> None:
    series = Series(START_MS)
    series.add(START_MS, "old", Kind.SUBMISSIONS, 1)
    series.add(START_MS, "kept", Kind.SUBMISSIONS, 1)
    series.add(START_MS, "kept", Kind.QUEUE_WAIT, 7.0)
    within = series.snapshot(START_MS + WINDOW_MS)
    assert len(within["t"]) == SLOTS
    assert within["queues"]["old"]["submissions"][0] == 1
    later_ms = START_MS + WINDOW_MS + STEP_MS
    series.add(later_ms, "kept", Kind.SUBMISSIONS, 1)
    shown = series.snapshot(later_ms)
    assert len(shown["t"]) == SLOTS
    assert shown["t"][0] == FIRST + STEP_MS
    assert "old" not in shown["queues"]
    kept = shown["queues"]["kept"]
    assert kept["submissions"] == [0] * (SLOTS - 1) + [1]
    assert kept["queue_wait_p50_ms"] == [None] * SLOTS


def test_a_gap_longer_than_the_window_leaves_nothing_of_before() -> None:
    series = Series(START_MS)
    series.add(START_MS, "q", Kind.SUBMISSIONS, 5)
    series.add(START_MS, "q", Kind.ATTEMPT, 3.0)
    later_ms = START_MS + SLOTS * STEP_MS  # the same slot of the ring
    series.add(later_ms, "q", Kind.SUBMISSIONS, 1)
    shown = series.snapshot(later_ms)["queues"]["q"]
    assert sum(shown["submissions"]) == 1
    assert shown["attempt_p50_ms"] == [None] * SLOTS


def test_the_last_buckets_only() -> None:
    series = Series(START_MS)
    for step in range(5):
        series.add(START_MS + step * STEP_MS, "q", Kind.UNKNOWN, step)
    shown = series.snapshot(START_MS + 4 * STEP_MS, buckets=2)
    assert shown["t"] == [FIRST + 3 * STEP_MS, FIRST + 4 * STEP_MS]
    assert shown["queues"]["q"]["unknown"] == [3, 4]
    assert len(series.snapshot(START_MS, buckets=2)["t"]) == 1  # only the start's bucket yet


def test_a_queue_takes_a_fixed_amount_of_memory() -> None:
    series = Series(START_MS)

    def size() -> int:
        (queue,) = series._queues.values()
        parts: list[Any] = [queue, queue.counts, queue.quantiles]
        for histogram in (queue.waits, queue.attempts):
            parts += [histogram, histogram.bins]
        return sum(sys.getsizeof(part) for part in parts)

    series.add(START_MS, "q", Kind.SUBMISSIONS, 1)
    empty = size()
    for index in range(20_000):
        at_ms = START_MS + index * 200
        series.add(at_ms, "q", Kind.QUEUE_WAIT, index * 1.7)
        series.add(at_ms, "q", Kind.ATTEMPT, index * 31.0)
        series.add(at_ms, "q", Kind.SUCCEEDED, 1)
    assert size() == empty <= QUEUE_BYTES


Sample = tuple[int, Kind, float]
SAMPLES = st.lists(
    st.tuples(
        st.integers(0, 2 * WINDOW_MS),
        st.sampled_from(Kind),
        st.one_of(
            st.floats(0, 1e10, allow_nan=False),
            st.sampled_from([0.0, SMALLEST_MS, 1.0, 10.0]),  # ties
        ),
    ),
    max_size=300,
)


@given(
    samples=SAMPLES,
    started_ms=st.integers(1_000_000_000_000, 2_000_000_000_000),
    then_ms=st.integers(0, WINDOW_MS + 2 * STEP_MS),
)
def test_the_window_shows_exactly_the_samples_recorded_in_it(
    samples: list[Sample], started_ms: int, then_ms: int
) -> None:
    series = Series(started_ms)
    timed = sorted(
        ((t, kind, value if kind >= Kind.QUEUE_WAIT else 1) for t, kind, value in samples),
        key=lambda sample: sample[0],
    )
    for offset_ms, kind, value in timed:
        series.add(started_ms + offset_ms, f"q{offset_ms % 3}", kind, value)
    now_ms = started_ms + (timed[-1][0] if timed else 0) + then_ms
    shown = series.snapshot(now_ms)
    first = max(started_ms, now_ms - WINDOW_MS) // STEP_MS
    assert shown["t"] == [b * STEP_MS for b in range(first, now_ms // STEP_MS + 1)]
    expected_queues = {f"q{t % 3}" for t, _, _ in timed if (started_ms + t) // STEP_MS >= first}
    assert set(shown["queues"]) == expected_queues
    for queue_id, queue in shown["queues"].items():
        for index, bucket_ms in enumerate(shown["t"]):
            mine = [
                (kind, value)
                for offset_ms, kind, value in timed
                if f"q{offset_ms % 3}" == queue_id
                and (started_ms + offset_ms) // STEP_MS * STEP_MS == bucket_ms
            ]
            for kind, name in zip(Kind, COUNTS, strict=False):
                assert queue[name][index] == sum(v for k, v in mine if k is kind)
            for kind, prefix in ((Kind.QUEUE_WAIT, "queue_wait"), (Kind.ATTEMPT, "attempt")):
                values = [v for k, v in mine if k is kind]
                for percent in (50, 99):
                    shown_value = queue[f"{prefix}_p{percent}_ms"][index]
                    if not values:
                        assert shown_value is None
                        continue
                    assert_within_a_bin(shown_value, exact_quantile(values, percent))


def assert_within_a_bin(shown: float, exact: float) -> None:
    assert bin_of(shown) == bin_of(exact)
    if SMALLEST_MS <= exact < SMALLEST_MS * GROWTH ** (BINS - 2):
        assert exact / GROWTH <= shown <= exact * GROWTH
