"""The hub's Prometheus metrics (`GET /metrics` on its port): what it committed, what it serves.

Owns a per-hub `CollectorRegistry` (never prometheus-client's global one:
several hubs in one test process must not share series). Counters and
histograms are fed once per committed transaction: `HubMetrics` is one of the
committer's tails and reads what the transaction wrote (`Tx.moved_tasks`,
`Tx.moved_attempts`, each row beside what it was), so a change is counted
whichever operation made it, and only once it is durable. They count what this
hub process committed; several hubs sharing a database each count their own.
The gauges are read at each scrape: tasks by queue and state from the
database (every hub sharing it shows the same), sessions and capacity from
this hub's own sessions. The same samples feed the dashboard's series of the
last hour (`series`, a `_series.Series`), so both count the same.

Must never keep a copy of task state, nor read the database but for a scrape.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Final, TypeAlias

import attrs
import trio
from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.exposition import choose_encoder
from prometheus_client.gc_collector import GCCollector
from prometheus_client.process_collector import ProcessCollector

from blockx.hub._auth import check
from blockx.hub._committer import MAX_BATCH, Committer
from blockx.hub._model import ANY_QUEUE, AttemptState, Right, Task, TaskState
from blockx.hub._series import Kind, Series
from blockx.hub._store import StoreError, Tx
from blockx.hubwire import dumps
from blockx.net.http import Connection, Request, header, respond_keeping

METRICS_PATH: Final = "/metrics"
WAIT_BUCKETS_S: Final = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
    300.0, 900.0, 3600.0,
)  # fmt: skip
"""A task waits from about a commit (a worker with room) to hours (a queue nobody serves)."""
ATTEMPT_BUCKETS_S: Final = (
    0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0,
    900.0, 3600.0, 14400.0,
)  # fmt: skip
"""Handlers run from a millisecond (an echo) to hours (an attempt timeout allows days)."""
COMMIT_BUCKETS_S: Final = (
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5
)  # fmt: skip
"""A SQLite commit takes a fraction of a millisecond on a fast disk; a batch up to seconds."""
BATCH_BUCKETS: Final = tuple(float(2**n) for n in range(MAX_BATCH.bit_length()))
"""Powers of two up to the committer's largest batch."""
_ENDED_BY_REPORT: Final = frozenset(
    {AttemptState.SUCCEEDED, AttemptState.FAILED, AttemptState.UNKNOWN}
)
_NOT_A_RETRY: Final = frozenset({TaskState.QUEUED, TaskState.OFFERED})
"""A task queued again from these ran nothing: it was withdrawn, or not moved."""

Sample: TypeAlias = tuple[Counter | Histogram, tuple[str, ...], float]
"""A metric, its label values, and what to add (a counter) or observe (a histogram)."""
TaskCounts: TypeAlias = tuple[list[str], list[tuple[str, str, int]]]
"""Every queue, and (queue, state, count) of every pair that has tasks."""
Feed: TypeAlias = tuple[str, Kind, float] | None
"""Where a labelled series' samples go in the `Series` (queue, kind, factor), if anywhere."""


@attrs.frozen(kw_only=True)
class SessionLoad:
    """One open worker session: its queue, the capacity it declared, the attempts it holds."""

    queue_id: str
    capacity: int
    held: int


class HubMetrics:
    """The metrics of one hub: its registry, the committer's `Tail` and `Meter`, and `serve`.
    `now_ms`: the hub's clock, for the `series`."""

    def __init__(self, now_ms: Callable[[], int]) -> None:
        self._now_ms = now_ms
        self.series = Series(now_ms())
        self.registry = registry = CollectorRegistry()
        ProcessCollector(registry=registry)  # process_cpu_seconds_total and friends
        GCCollector(registry=registry)

        def counter(name: str, text: str, *labels: str) -> Counter:
            return Counter(f"blockx_hub_{name}", text, labels, registry=registry)

        def histogram(name: str, text: str, buckets: tuple[float, ...], *labels: str) -> Histogram:
            return Histogram(f"blockx_hub_{name}", text, labels, buckets=buckets, registry=registry)

        self.submissions = counter(
            "submissions", "Tasks submitted (not repeats), by queue.", "queue"
        )
        self.grants = counter("grants", "Starts granted: attempts that began to run.", "queue")
        self.finishes = counter(
            "finishes",
            "Attempts ended by their worker's report, by outcome: SUCCEEDED, FAILED, UNKNOWN.",
            "queue",
            "outcome",
        )
        self.lease_expiries = counter(
            "lease_expiries", "Started attempts whose lease ran out before a report.", "queue"
        )
        self.retries = counter("retries", "Tasks queued again after an attempt ran.", "queue")
        self.reviews = counter("reviews", "Tasks moved to NEEDS_REVIEW.", "queue")
        self.queue_wait = histogram(
            "queue_wait_seconds",
            "From when a task could be offered (submitted, or re-queued and its back-off over) "
            "to the grant of its start.",
            WAIT_BUCKETS_S,
            "queue",
        )
        self.attempt_duration = histogram(
            "attempt_duration_seconds",
            "From an attempt's grant to its end (its report, or its lease running out).",
            ATTEMPT_BUCKETS_S,
            "queue",
        )
        self.commit_batch_size = histogram(
            "commit_batch_size", "Operations committed in one transaction.", BATCH_BUCKETS
        )
        self.commit_duration = histogram(
            "commit_duration_seconds",
            "Time one transaction took, its operations and its commit.",
            COMMIT_BUCKETS_S,
        )
        self.database_errors = counter(
            "database_errors",
            "Transactions that failed with a database error (a failed batch is then tried "
            "one operation at a time: each failure counts).",
        )
        self._record: dict[
            tuple[object, tuple[str, ...]], tuple[Callable[[float], None], Feed]
        ] = {}
        """Each labelled series' `inc` or `observe`, and its `Feed`, looked up once."""
        self._state = _StateCollector()
        registry.register(self._state)

    # ------------------------------------------------------ the committer's tail

    def operation(self) -> Callable[[Tx], list[Sample]]:
        return self._samples

    def _samples(self, tx: Tx) -> list[Sample]:
        """What the transaction did, as samples (run last in it, so it sees every write)."""
        found: list[Sample] = []
        for before, task in tx.moved_tasks:
            self._task_moved(tx, before, task, found)
        for was, attempt in tx.moved_attempts:
            if was is None or was.state is not AttemptState.RUNNING or attempt.state.is_live:
                continue
            owner = tx.task(attempt.task_id)
            queue = "" if owner is None else owner.queue_id
            if attempt.state in _ENDED_BY_REPORT:
                found.append((self.finishes, (queue, attempt.state.value), 1))
            elif attempt.state is AttemptState.LEASE_EXPIRED:
                found.append((self.lease_expiries, (queue,), 1))
            ran_ms = attempt.finished_at_ms - attempt.started_at_ms
            found.append((self.attempt_duration, (queue,), max(ran_ms, 0) / 1000))
        return found

    def _task_moved(self, tx: Tx, before: Task | None, task: Task, found: list[Sample]) -> None:
        queue = (task.queue_id,)
        if before is None:
            found.append((self.submissions, queue, 1))
        elif before.state is TaskState.OFFERED and task.state is TaskState.RUNNING:
            attempt = tx.attempt(task.attempt_id)
            granted_ms = before.available_at_ms if attempt is None else attempt.started_at_ms
            waited_ms = granted_ms - before.available_at_ms
            found.append((self.grants, queue, 1))
            found.append((self.queue_wait, queue, max(waited_ms, 0) / 1000))
        elif task.state is TaskState.QUEUED and before.state not in _NOT_A_RETRY:
            found.append((self.retries, queue, 1))
        elif task.state is TaskState.NEEDS_REVIEW and before.state is not TaskState.NEEDS_REVIEW:
            found.append((self.reviews, queue, 1))

    def committed(self, result: list[Sample]) -> None:
        if not result:
            return
        now_ms = self._now_ms()
        for metric, labels, amount in result:
            found = self._record.get((metric, labels))
            if found is None:
                found = self._record[(metric, labels)] = self._recorder(metric, labels)
            record, feed = found
            record(amount)
            if feed is not None:
                queue_id, kind, factor = feed
                self.series.add(now_ms, queue_id, kind, amount * factor)

    def _recorder(
        self, metric: Counter | Histogram, labels: tuple[str, ...]
    ) -> tuple[Callable[[float], None], Feed]:
        child = metric.labels(*labels)
        record = child.inc if isinstance(child, Counter) else child.observe
        feed: Feed = None
        if metric is self.submissions:
            feed = (labels[0], Kind.SUBMISSIONS, 1)
        elif metric is self.finishes:
            feed = (labels[0], Kind[labels[1]], 1)
        elif metric is self.queue_wait:
            feed = (labels[0], Kind.QUEUE_WAIT, 1000)  # seconds to ms
        elif metric is self.attempt_duration:
            feed = (labels[0], Kind.ATTEMPT, 1000)
        return record, feed

    # ----------------------------------------------------- the committer's meter

    def batch_committed(self, operations: int, seconds: float) -> None:
        self.commit_batch_size.observe(operations)
        self.commit_duration.observe(seconds)

    def batch_failed(self, error: StoreError) -> None:
        self.database_errors.inc()

    # ---------------------------------------------------------------- scrapes

    def render(
        self, accept: str, counts: TaskCounts, sessions: Iterable[SessionLoad]
    ) -> tuple[bytes, str]:
        """A scrape in the format `accept` asks for: (body, content type)."""
        encode, content_type = choose_encoder(accept)
        self._state.scrape = _Scrape(counts=counts, sessions=tuple(sessions))
        try:
            return encode(self.registry), content_type
        finally:
            self._state.scrape = None

    async def serve(
        self,
        stream: trio.abc.Stream,
        connection: Connection,
        request: Request,
        *,
        committer: Committer,
        sessions: Callable[[], Iterable[SessionLoad]],
        admin_only: bool,
        keep: bool,
    ) -> bool:
        """Answer `GET /metrics` (with `admin_only`, for an admin credential only); whether
        the connection is kept for the client's next request."""
        body: bytes | str
        if request.method != b"GET":
            status, body, content_type = 405, _error("GET only"), "application/json"
        else:
            token = header(request, b"authorization").removeprefix("Bearer ").strip()
            try:
                found = await committer.do(_read_counts(token if admin_only else None))
            except StoreError as error:
                found = _Refused(503, f"the hub cannot reach its database: {error.reason}")
            if isinstance(found, _Refused):
                status, body, content_type = found.status, _error(found.error), "application/json"
            else:
                status = 200
                body, content_type = self.render(header(request, b"accept"), found, sessions())
        return await respond_keeping(
            stream, connection, request, status, body, content_type=content_type, keep=keep
        )


@attrs.frozen
class _Refused:
    status: int
    error: str


def _error(message: str) -> str:
    return dumps({"error": message}) + "\n"


def _read_counts(token: str | None) -> Callable[[Tx], TaskCounts | _Refused]:
    """The tasks by queue and state, if `token` is an admin's (None: no credential needed)."""

    def read(tx: Tx) -> TaskCounts | _Refused:
        if token is not None:
            credential = check(tx, token)
            if credential is None:
                return _Refused(401, "no valid credential (Authorization: Bearer <token>)")
            if not credential.allows(Right.ADMIN, ANY_QUEUE):
                return _Refused(403, "the metrics need an admin credential")
        counts = [(queue, state.value, count) for queue, state, count, _ in tx.task_counts()]
        return tx.queues(), counts

    return read


@attrs.frozen(kw_only=True)
class _Scrape:
    counts: TaskCounts
    sessions: tuple[SessionLoad, ...]


class _StateCollector:
    """The gauges of the scrape being rendered (none outside `HubMetrics.render`)."""

    def __init__(self) -> None:
        self.scrape: _Scrape | None = None

    def describe(self) -> Iterable[Metric]:
        return list(_state_families(None))

    def collect(self) -> Iterable[Metric]:
        if self.scrape is None:
            return []
        return list(_state_families(self.scrape))


def _state_families(scrape: _Scrape | None) -> Iterator[Metric]:
    """The gauges, filled from `scrape` (None: empty, for `describe`); every queue gets a
    sample of each, zero or not, so a queue nobody serves shows as 0, not as nothing."""
    tasks = GaugeMetricFamily(
        "blockx_hub_tasks",
        "Tasks in the database by queue and state (every hub on the database shows the same).",
        labels=["queue", "state"],
    )
    sessions = GaugeMetricFamily(
        "blockx_hub_sessions", "Worker sessions open on this hub.", labels=["queue"]
    )
    declared = GaugeMetricFamily(
        "blockx_hub_capacity_declared",
        "Attempts this hub's sessions said they can hold at once.",
        labels=["queue"],
    )
    used = GaugeMetricFamily(
        "blockx_hub_capacity_used",
        "Attempts this hub's sessions hold (offered or running).",
        labels=["queue"],
    )
    if scrape is not None:
        queue_ids, counts = scrape.counts
        by_state = {(queue, state): count for queue, state, count in counts}
        by_queue: dict[str, list[int]] = {queue: [0, 0, 0] for queue in queue_ids}
        by_queue.update({queue: [0, 0, 0] for queue, _, _ in counts if queue not in by_queue})
        for load in scrape.sessions:
            totals = by_queue.setdefault(load.queue_id, [0, 0, 0])
            totals[0] += 1
            totals[1] += load.capacity
            totals[2] += load.held
        for queue, totals in sorted(by_queue.items()):
            for state in TaskState:
                tasks.add_metric([queue, state.value], by_state.get((queue, state.value), 0))
            for family, value in zip((sessions, declared, used), totals, strict=True):
                family.add_metric([queue], value)
    yield from (tasks, sessions, declared, used)
