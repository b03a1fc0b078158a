"""Prometheus metrics of one worker, and its low-rate memory diagnostics.

Owns a per-worker `CollectorRegistry` (never prometheus-client's global one:
several workers in one test process must not share series). Counters and
histograms are fed by hooks: `task_finished` sees every terminal result,
`rpc_finished` every gRPC call, `grpc_connection_closed` every connection the
server closed of its own accord; `task_finished` also feeds the status page's
per-second `history`. Gauges that mirror state (slots, live tasks,
executors, watch streams, drain) are not stored at all: each scrape renders
them from a fresh `WorkerSnapshot` (`render`), which a `WorkerProbe` reads
from the actors that own the state, so they are never stale and need no
refresh task.

Must never block, start a thread, or keep a second copy of slot or task
state: the slot machine and the executor pool stay the only sources of truth.
"""

from __future__ import annotations

import collections
import gc
import logging
from collections.abc import Iterable, Iterator
from typing import Final, Protocol

import attrs
import trio
from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import choose_encoder
from prometheus_client.gc_collector import GCCollector
from prometheus_client.process_collector import ProcessCollector

from blockx.executors import ExecutorState, ExecutorView
from blockx.identity import WorkerIdentity
from blockx.observability.history import TaskHistory
from blockx.slots import (
    RUN_PHASES,
    Heartbeat,
    SlotState,
    SlotView,
    TaskResult,
    TaskSnapshot,
    TaskState,
)

logger = logging.getLogger("blockx.memory")

TASK_BUCKETS_S: Final = (
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0
)  # fmt: skip
"""Phases run from milliseconds (a cached builder) to minutes (a large call list)."""
RPC_BUCKETS_S: Final = (
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 60.0
)  # fmt: skip
"""Unary calls answer in well under a millisecond to a few ms; WatchTasks lasts a task's life."""
RECENT_RESULTS: Final = 20
"""Terminal results the status page lists (newest first)."""
_BYTES_PER_MIB: Final = 1024 * 1024


@attrs.frozen(kw_only=True)
class WorkerSnapshot:
    """The worker's state at one moment, as its actors answered for it."""

    at_ms: int
    identity: WorkerIdentity
    heartbeat: Heartbeat
    slots: tuple[SlotView, ...]
    tasks: tuple[TaskSnapshot, ...]
    """Every task that holds a slot: reserved (phase None) or running."""
    executors: tuple[ExecutorView, ...]
    watch_streams: int
    worker_rss_bytes: int
    retained_results: int = 0
    """Terminal results kept for reads, and their size (`TaskResult.retained_bytes`)."""
    retained_bytes: int = 0

    @property
    def executors_rss_bytes(self) -> int:
        return sum(view.rss_bytes for view in self.executors)


class WorkerProbe(Protocol):
    """Reads the current state of one worker, asking the actors that own it."""

    async def snapshot(self) -> WorkerSnapshot: ...


class WorkerMetrics:
    """The metrics of one worker: its registry, its hooks and its state collector.

    Make one per worker (`started_at_ms`: when it started, where its history
    begins), hand `task_finished` to the slot table's `on_finished` and
    `rpc_finished` to the gRPC front end; `render` a scrape with a snapshot of
    the worker for the gauges.
    """

    def __init__(self, started_at_ms: int) -> None:
        self.registry = CollectorRegistry()
        registry = self.registry
        ProcessCollector(registry=registry)  # process_resident_memory_bytes and friends
        GCCollector(registry=registry)
        self.tasks_finished = Counter(
            "blockx_tasks_finished",
            "Tasks that reached a terminal state, by state and failure code.",
            ["state", "failure_code"],
            registry=registry,
        )
        self.task_duration = Histogram(
            "blockx_task_duration_seconds",
            "Time from a task's acceptance to its terminal result, by terminal state.",
            ["state"],
            buckets=TASK_BUCKETS_S,
            registry=registry,
        )
        self.phase_duration = Histogram(
            "blockx_task_phase_duration_seconds",
            "Time a task spent in each phase it reached (the phase it ended in included).",
            ["phase"],
            buckets=TASK_BUCKETS_S,
            registry=registry,
        )
        self.calls = Counter(
            "blockx_calls",
            "Calls of finished tasks, by outcome.",
            ["outcome"],
            registry=registry,
        )
        self.call_retries = Counter(
            "blockx_call_retries", "Call attempts that were retries.", registry=registry
        )
        self.rpc_requests = Counter(
            "blockx_rpc_requests",
            "gRPC calls handled, by service, method and status code.",
            ["service", "method", "code"],
            registry=registry,
        )
        self.rpc_duration = Histogram(
            "blockx_rpc_duration_seconds",
            "Time from a gRPC call's request to its end, by service and method.",
            ["service", "method"],
            buckets=RPC_BUCKETS_S,
            registry=registry,
        )
        self.grpc_connections_closed = _connections_closed(registry)
        for outcome in ("succeeded", "failed"):
            self.calls.labels(outcome=outcome)
        self.recent: collections.deque[TaskResult] = collections.deque(maxlen=RECENT_RESULTS)
        """The newest terminal results, oldest first."""
        self.finished_by_state: collections.Counter[str] = collections.Counter()
        self.history = TaskHistory(started_at_ms)
        """Finished tasks per second, for the status page's charts."""
        self._state = _StateCollector()
        registry.register(self._state)

    def render(self, snapshot: WorkerSnapshot, accept: str) -> tuple[bytes, str]:
        """A scrape in the format `accept` asks for, the gauges taken from `snapshot`:
        (body, content type)."""
        encode, content_type = choose_encoder(accept)
        self._state.snapshot = snapshot
        try:
            return encode(self.registry), content_type
        finally:
            self._state.snapshot = None

    # ---------------------------------------------------------------- hooks

    def task_finished(self, result: TaskResult) -> None:
        """The slot table's `on_finished` hook: count one terminal result."""
        state = result.state.value
        self.tasks_finished.labels(state=state, failure_code=result.failure_code or "").inc()
        self.finished_by_state[state] += 1
        self.recent.append(result)
        timings = result.timings
        self.task_duration.labels(state=state).observe(timings.total_ms / 1000)
        # A phase the task never reached has 0 ms in its timings; counting it
        # would pull every histogram towards zero.
        reached = (
            RUN_PHASES[: RUN_PHASES.index(result.phase) + 1]
            if result.phase in RUN_PHASES
            else RUN_PHASES
        )
        for phase in reached:
            self.phase_duration.labels(phase=phase.value).observe(timings.ms(phase) / 1000)
        stats = result.call_stats
        self.calls.labels(outcome="succeeded").inc(stats.calls_succeeded)
        self.calls.labels(outcome="failed").inc(stats.calls_failed)
        self.call_retries.inc(stats.calls_retried)
        self.history.record(
            result.finished_at_ms,
            succeeded=result.state is TaskState.SUCCEEDED,
            total_ms=timings.total_ms,
            calls=stats.calls_total,
        )

    def grpc_connection_closed(self, reason: str) -> None:
        """The gRPC front end's hook: it closed a connection for `reason`."""
        self.grpc_connections_closed.labels(reason=reason).inc()

    def rpc_finished(self, path: str, code: str, duration_s: float) -> None:
        """The gRPC front end's hook: one call to `path` ("/package.Service/Method") ended."""
        service, _, method = path.lstrip("/").rpartition("/")
        self.rpc_requests.labels(service=service, method=method, code=code).inc()
        self.rpc_duration.labels(service=service, method=method).observe(duration_s)


def _connections_closed(registry: CollectorRegistry) -> Counter:
    counter = Counter(
        "blockx_grpc_connections_closed",
        "gRPC connections the worker closed of its own accord, by reason: refused (one "
        "beyond grpcMaxConnections), abuse (streams reset beyond grpcMaxResets), idle.",
        ["reason"],
        registry=registry,
    )
    for reason in ("refused", "abuse", "idle"):  # each shown from the start, at 0
        counter.labels(reason=reason)
    return counter


class _StateCollector:
    """The state gauges of the scrape being rendered (none outside `WorkerMetrics.render`)."""

    def __init__(self) -> None:
        self.snapshot: WorkerSnapshot | None = None

    def describe(self) -> Iterable[Metric]:
        return list(_state_families(None))

    def collect(self) -> Iterable[Metric]:
        if self.snapshot is None:
            return []
        return list(_state_families(self.snapshot))


def _state_families(snapshot: WorkerSnapshot | None) -> Iterator[Metric]:
    """The state gauges, filled from `snapshot` (None: empty, for `describe`)."""
    slots = GaugeMetricFamily("blockx_slots", "Task slots by state.", labels=["state"])
    tasks = GaugeMetricFamily(
        "blockx_live_tasks",
        "Tasks holding a slot, by phase (RESERVED: not submitted).",
        labels=["phase"],
    )
    executors = GaugeMetricFamily(
        "blockx_executors", "Executor processes by state.", labels=["state"]
    )
    restarts = CounterMetricFamily(
        "blockx_executor_restarts", "Executor processes restarted since the worker started."
    )
    executors_rss = GaugeMetricFamily(
        "blockx_executors_rss_bytes", "Resident memory of all executor processes, summed."
    )
    streams = GaugeMetricFamily("blockx_watch_streams", "Open WatchTasks streams.")
    draining = GaugeMetricFamily("blockx_draining", "1 while the worker drains, else 0.")
    retained = GaugeMetricFamily(
        "blockx_retained_results", "Terminal results kept for GetTaskResult."
    )
    retained_bytes = GaugeMetricFamily(
        "blockx_retained_result_bytes",
        "Their size as worker.resultRetentionBytes bounds it (the encoded results, estimated).",
    )
    if snapshot is not None:
        slot_counts = collections.Counter(slot.state for slot in snapshot.slots)
        for slot_state in SlotState:
            slots.add_metric([slot_state.value], slot_counts[slot_state])
        phase_counts = collections.Counter(
            task.phase.value if task.phase is not None else "RESERVED" for task in snapshot.tasks
        )
        for phase in ("RESERVED", *(p.value for p in RUN_PHASES)):
            tasks.add_metric([phase], phase_counts[phase])
        executor_counts = collections.Counter(view.state for view in snapshot.executors)
        for executor_state in ExecutorState:
            executors.add_metric([executor_state.value], executor_counts[executor_state])
        restarts.add_metric([], sum(view.restarts for view in snapshot.executors))
        executors_rss.add_metric([], snapshot.executors_rss_bytes)
        streams.add_metric([], snapshot.watch_streams)
        draining.add_metric([], 1 if snapshot.heartbeat.draining else 0)
        retained.add_metric([], snapshot.retained_results)
        retained_bytes.add_metric([], snapshot.retained_bytes)
    yield from (
        *(slots, tasks, executors, restarts, executors_rss, streams, draining),
        *(retained, retained_bytes),
    )


# ------------------------------------------------------------ memory diagnostics


async def log_memory_diagnostics(probe: WorkerProbe, *, interval_ms: int) -> None:
    """Log the worker's memory figures at INFO now and every `interval_ms`, until cancelled.

    A slow leak shows as a trend across these lines long before it hurts:
    the worker's and the executors' RSS, the garbage collector's counts, and
    how many tasks and watch streams are live (which memory should follow).
    """
    while True:
        snapshot = await probe.snapshot()
        gc_counts = gc.get_count()
        gc_collections = tuple(generation["collections"] for generation in gc.get_stats())
        logger.info(
            "memory: worker rss %.1f MiB, executors rss %.1f MiB (%d), "
            "gc pending %s, gc collections %s, %d live tasks, %d watch streams",
            snapshot.worker_rss_bytes / _BYTES_PER_MIB,
            snapshot.executors_rss_bytes / _BYTES_PER_MIB,
            len(snapshot.executors),
            gc_counts,
            gc_collections,
            snapshot.heartbeat.active_tasks,
            snapshot.watch_streams,
            extra={
                "worker_rss_bytes": snapshot.worker_rss_bytes,
                "executors_rss_bytes": snapshot.executors_rss_bytes,
                "gc_pending": list(gc_counts),
                "gc_collections": list(gc_collections),
                "live_tasks": snapshot.heartbeat.active_tasks,
                "watch_streams": snapshot.watch_streams,
            },
        )
        await trio.sleep(interval_ms / 1000)
