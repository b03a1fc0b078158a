"""The dashboard's time series: the last hour of what this hub committed, per queue, in memory.

`Series` takes the samples the hub's Prometheus counters and histograms take
(`_metrics`): submissions, finishes by outcome, queue wait and attempt
duration, each with the time it was committed. Time is cut into buckets of
`STEP_MS` aligned on the epoch; `snapshot` shows the buckets of the last
`WINDOW_MS` (the shape of `GET /v1/stats`): counts per bucket, and the p50
and p99 of each latency per bucket.

A latency is not kept as such: it falls into one of `BINS` bins of a
log-scale histogram, each `GROWTH` times wider than the one before, from
`SMALLEST_MS` to about 37 days (one bin below, one above). So recording is
O(1), and a quantile is accurate to one bin (about 10 %): it is reported as
the middle of the bin that holds the sample of its rank. A bucket's
histograms are kept only while it fills: when the next bucket begins, its
p50 and p99 are worked out and kept, and the histograms start again.

Memory per queue, whatever the traffic: `SLOTS` buckets of 4 counts and 4
quantiles of 8 bytes (23,104 bytes) and the two histograms of the bucket
filling, `BINS` counts of 4 bytes each (2,048 bytes): 25,152 bytes of data,
under 26 KB per queue-hour with the objects that hold it (`QUEUE_BYTES`). A
queue that has had no sample for an hour is dropped.

Pure: every time is given (`now_ms`), nothing reads a clock.
"""

from __future__ import annotations

import enum
import math
from array import array
from typing import Any, Final

STEP_MS: Final = 10_000
WINDOW_MS: Final = 3_600_000
SLOTS: Final = WINDOW_MS // STEP_MS + 1
"""The buckets a snapshot may show: the one `WINDOW_MS` ago began in, up to now's."""
BINS: Final = 256
SMALLEST_MS: Final = 0.1
GROWTH: Final = 1.1
_LOG_GROWTH: Final = math.log(GROWTH)
COUNTS: Final = ("submissions", "succeeded", "failed", "unknown")
LATENCIES: Final = ("queue_wait_p50_ms", "queue_wait_p99_ms", "attempt_p50_ms", "attempt_p99_ms")
_TOP: Final = SMALLEST_MS * GROWTH ** (BINS - 2)
"""Where the last bin begins (about 37 days)."""
_ZEROS: Final = array("I", bytes(4 * BINS))
_NO_COUNTS: Final = array("d", bytes(8 * len(COUNTS)))
_NO_QUANTILES: Final = array("d", [math.nan] * len(LATENCIES))
QUEUE_BYTES: Final = 26_000
"""The most one queue's series takes, in bytes, whatever the traffic (see the module)."""


class Kind(enum.IntEnum):
    """What a sample is: a count of one of `COUNTS` (in that order), or a latency in ms."""

    SUBMISSIONS = 0
    SUCCEEDED = 1
    FAILED = 2
    UNKNOWN = 3
    QUEUE_WAIT = 4
    ATTEMPT = 5


def bin_of(ms: float) -> int:
    """The histogram bin of a latency: 0 below `SMALLEST_MS`, then one per `GROWTH`, the
    last for everything beyond."""
    if not ms >= SMALLEST_MS:  # NaN too
        return 0
    if ms >= _TOP:
        return BINS - 1
    return min(int(math.log(ms / SMALLEST_MS) / _LOG_GROWTH) + 1, BINS - 1)


def bin_value(index: int) -> float:
    """What bin `index` stands for: its middle on the log scale (half of `SMALLEST_MS` for
    the first)."""
    if index == 0:
        return SMALLEST_MS / 2
    return float(SMALLEST_MS * GROWTH ** (index - 0.5))


def rank(count: int, percent: int) -> int:
    """The rank (from 1) of the `percent` quantile of `count` samples: the smallest sample
    with at least `percent` % of them at or below it."""
    return max(-(-count * percent // 100), 1)


class _Histogram:
    """The latencies of the bucket filling, by bin."""

    __slots__ = ("bins", "count")

    def __init__(self) -> None:
        self.bins = array("I", _ZEROS)
        self.count = 0

    def add(self, ms: float) -> None:
        self.bins[bin_of(ms)] += 1
        self.count += 1

    def quantiles(self) -> tuple[float, float]:
        """p50 and p99 (NaN without samples)."""
        if not self.count:
            return math.nan, math.nan
        middle, high = rank(self.count, 50), rank(self.count, 99)
        p50 = math.nan
        seen = 0
        for index, count in enumerate(self.bins):
            seen += count
            if seen >= middle and math.isnan(p50):
                p50 = bin_value(index)
            if seen >= high:
                return p50, bin_value(index)
        raise AssertionError("the bins hold fewer samples than counted")

    def clear(self) -> None:
        if self.count:
            self.bins[:] = _ZEROS
            self.count = 0


class _Queue:
    """One queue's buckets, in a ring of `SLOTS` (bucket `b` at slot `b % SLOTS`)."""

    __slots__ = ("attempts", "counts", "heard", "newest", "quantiles", "waits")

    def __init__(self, bucket: int) -> None:
        self.newest = bucket
        """The bucket filling: its quantiles are still in the histograms."""
        self.heard = bucket
        """The bucket of the latest sample."""
        self.counts = _NO_COUNTS * SLOTS
        self.quantiles = _NO_QUANTILES * SLOTS
        self.waits = _Histogram()
        self.attempts = _Histogram()

    def add(self, bucket: int, kind: Kind, value: float) -> None:
        self.advance(bucket)
        self.heard = self.newest
        if kind is Kind.QUEUE_WAIT:
            self.waits.add(value)
        elif kind is Kind.ATTEMPT:
            self.attempts.add(value)
        else:
            self.counts[self.newest % SLOTS * len(COUNTS) + kind] += value

    def advance(self, bucket: int) -> None:
        """Make `bucket` the one filling (an earlier one stays as it is: a clock stepped
        back): the one before is closed, those between emptied."""
        if bucket <= self.newest:
            return
        at = self.newest % SLOTS * len(LATENCIES)
        self.quantiles[at : at + 2] = array("d", self.waits.quantiles())
        self.quantiles[at + 2 : at + 4] = array("d", self.attempts.quantiles())
        self.waits.clear()
        self.attempts.clear()
        for emptied in range(max(self.newest + 1, bucket - SLOTS + 1), bucket + 1):
            slot = emptied % SLOTS
            self.counts[slot * len(COUNTS) : (slot + 1) * len(COUNTS)] = _NO_COUNTS
            self.quantiles[slot * len(LATENCIES) : (slot + 1) * len(LATENCIES)] = _NO_QUANTILES
        self.newest = bucket

    def shown(self, first: int, last: int) -> dict[str, list[Any]]:
        """Buckets `first` to `last` (now's: `advance`d to it first), as `GET /v1/stats`
        shows a queue."""
        self.advance(last)
        shown: dict[str, list[Any]] = {name: [] for name in (*COUNTS, *LATENCIES)}
        counts = [shown[name] for name in COUNTS]
        latencies = [shown[name] for name in LATENCIES]
        filling = (*self.waits.quantiles(), *self.attempts.quantiles())
        for bucket in range(first, last + 1):
            slot = bucket % SLOTS
            for index, values in enumerate(counts):
                values.append(int(self.counts[slot * len(COUNTS) + index]))
            for index, values in enumerate(latencies):
                value = (
                    filling[index]
                    if bucket == self.newest
                    else self.quantiles[slot * len(LATENCIES) + index]
                )
                values.append(None if math.isnan(value) else value)
        return shown


class Series:
    """Every queue's series since `started_ms` (the hub's start), the last hour of it kept."""

    def __init__(self, started_ms: int) -> None:
        self.started_ms = started_ms
        self._queues: dict[str, _Queue] = {}
        self._bucket = started_ms // STEP_MS
        """The newest bucket a sample came in."""

    def add(self, now_ms: int, queue_id: str, kind: Kind, value: float) -> None:
        """A sample committed at `now_ms`: a count (`value` added) or a latency (ms)."""
        bucket = now_ms // STEP_MS
        if bucket > self._bucket:
            self._bucket = bucket
            self._forget(bucket)
        queue = self._queues.get(queue_id)
        if queue is None:
            queue = self._queues[queue_id] = _Queue(bucket)
        queue.add(bucket, kind, value)

    def _forget(self, bucket: int) -> None:
        """Drop the queues with no sample in the buckets a snapshot may show (once a step)."""
        oldest = bucket - SLOTS + 1
        for queue_id in [q for q, queue in self._queues.items() if queue.heard < oldest]:
            del self._queues[queue_id]

    def snapshot(self, now_ms: int, buckets: int | None = None) -> dict[str, Any]:
        """The buckets from the one `WINDOW_MS` before `now_ms` (or the start) began in to
        now's (only the last `buckets` of them, if given), of every queue with a sample
        in the window: the body of `GET /v1/stats` (less `hub_id`)."""
        last = now_ms // STEP_MS
        first = min(max(self.started_ms, now_ms - WINDOW_MS) // STEP_MS, last)
        shown_from = first if buckets is None else max(first, last - buckets + 1)
        return {
            "started_at_ms": self.started_ms,
            "at_ms": now_ms,
            "step_ms": STEP_MS,
            "window_ms": WINDOW_MS,
            "t": [bucket * STEP_MS for bucket in range(shown_from, last + 1)],
            "queues": {
                queue_id: queue.shown(shown_from, last)
                for queue_id, queue in sorted(self._queues.items())
                if queue.heard >= first
            },
        }
