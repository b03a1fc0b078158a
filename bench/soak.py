"""Load and soak: many clients on one real worker for minutes; every task accounted for.

    uv run python bench/soak.py [--duration 300] [--clients 32] [--sample-every 10]
                                [--warmup 120] [--executors 2] [--max-rss-growth-mb 10]
                                [--max-rss-slope-mb-per-min 1.5]
    uv run nox -s soak -- --duration 60

One run starts `python -m blockx serve` (bench/serve.py's worker: examples/
functions, `--executors` executor processes, 4 slots per client and at least
128, results retained for RETENTION_MS) and drives it for `--duration`
seconds from `--clients` concurrent `blockx.client.WorkerClient`s, each on a
connection of its own that it replaces every few hundred operations. Each
client loops over a random mix (`OPS`, by weight) of:

* reserved: RequestTaskSlot, SubmitTask into the slot, WatchTasks to the
  terminal update, then GetTaskResult.
* inline: SubmitTask without a slot and WatchTasks (`run_task`).
* reserve_twice: RequestTaskSlot twice (the same reservation), SubmitTask
  into it, then GetTaskResult polled until terminal (a client that never
  watches). The API has no call that releases a reservation: a client gives
  one back by submitting into it or by letting it lapse, as `lapse` does.
* lapse: RequestTaskSlot with a LAPSE_TTL_MS lease, a wait past it, then
  SubmitTask into the slot: refused FAILED_PRECONDITION ("its reservation
  lapsed"), or ABORTED while the worker is still reclaiming the slot; the
  task id is unknown afterwards (GetTaskResult: NOT_FOUND).
* abandon_watch: a slow task (`demo.sleep`) whose watch is cancelled after
  its first update or at a random moment; its result is read later.
* batch: BATCH_TASKS quick tasks on one RunTasks stream, read to its end.
* abandon_stream: BATCH_TASKS slow tasks on one RunTasks stream, left as
  soon as the first ends; the others' results are read later. One the worker
  had not read from the stream yet was never accepted: it is counted apart
  (stream_tasks_not_admitted), neither lost nor an error.
* failing: a call that raises (FAILED, CALL_RAISED).
* timeout: a call that sleeps past its task's deadline (FAILED, TIMED_OUT).

A quick task adds two random integers and keeps the sum with the `result`
plugin, so each result is checked for its own outputs, not only its state.

Every task submitted is in a ledger with the outcome it must have. Each
terminal result read is checked against it, and every later read of the same
task against the first (one end per task: same state, code and times). At
the end, once the clients stopped, the ledger is closed: a task the worker
accepted whose result was never read is fetched, and one it does not know
(NOT_FOUND) is unaccounted; the last RECHECK_TASKS results still retained
are read once more. The worker must then settle to every slot free within
SETTLE_TIMEOUT_S (GetWorkerStatus), answer the health check SERVING with
every executor READY and none restarted, log no ERROR and exit 0 on SIGTERM.

Prints a `SAMPLE t=<s> tasks=<ended so far> tasks_per_s=<since the last
sample> rss_mb=<worker> executors_rss_mb=<all executors> busy_slots=<n>
errors=<unexpected> expected_errors=<n>` line every `--sample-every` seconds,
then RESULT lines: tasks_per_s, tasks_total, errors_total and one line per
error kind (errors_<kind>; the expected kinds are lapsed_lease,
lapsed_lease_reclaiming, watch_cancelled and stream_abandoned, every other is
unexpected), errors_unexpected, unaccounted_tasks, stream_tasks_not_admitted
(tasks of an abandoned stream that the worker never read: not accepted, not
lost), leaked_slots, executor_restarts, worker_log_errors, rss_start_mb (the
mean of the first RSS_END_SAMPLES samples after `--warmup`), rss_end_mb (of
the last ones), rss_growth_mb (the one less the other) and
rss_slope_mb_per_min (least squares over the samples after the warm-up). RSS
is the worker process's own, in MiB.

Exit status 1 if an unexpected error occurred, a task is unaccounted for, a
slot stayed taken, the worker is unhealthy (health check, executors, ERROR
lines, exit status), or its RSS is not flat: it grew by more than
`--max-rss-growth-mb` (10) after the warm-up, or, over at least
SLOPE_WINDOW_S after it, it trends up by more than
`--max-rss-slope-mb-per-min` (1.5). The warm-up (120 s, at most half of
the run) is how long the worker takes to reach its steady working set here:
the retained results (RETENTION_MS), the stale timers it compacts, each
connection's HTTP/2 state. Measured on 2 cores: with a full collection every
minute the growth after it was 1.5 MiB in 3 minutes (slope 0.4); without,
the reference cycles waiting for the oldest generation made it 5.5 to 6.6
MiB (slope 2.0 to 3.9) and 12 MiB in 13 minutes.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import functools
import heapq
import json
import random
import re
import statistics
import sys
import time
import traceback
from collections.abc import Awaitable, Callable
from typing import Any

import attrs
import trio
import trio_asyncio
from grpclib.client import Channel
from grpclib.const import Status
from grpclib.health.v1.health_grpc import HealthStub
from grpclib.health.v1.health_pb2 import HealthCheckRequest, HealthCheckResponse
from serve import HOST, SLOTS, WorkerProcess, result, rss_mib, start_worker, stop_worker

from blockx._proto.blockx.worker import v1 as pb
from blockx.client import TaskOutcome, WorkerCallError, WorkerClient, task_outputs, task_spec
from blockx.errors import BlockxError
from blockx.process.lifecycle import tune_gc

RETENTION_MS = 30_000
"""The worker's result retention: short, so that retained results reach their steady
number within the warm-up; every result is read well within it."""
LAPSE_TTL_MS = 300
LAPSE_WAIT_S = 1.2
"""How long `lapse` waits after reserving: past the lease and two of the worker's 500 ms
timer ticks, so the slot is normally reclaimed (FAILED_PRECONDITION)."""
SLOW_CALL_S = 0.1
TIMEOUT_TASK_MS = 200
TIMEOUT_CALL_S = 5.0
BATCH_TASKS = 4
FETCH_AFTER_S = 1.0
"""How long after abandoning a task's watch its client reads its result."""
FETCH_RETRY_S = 0.2
OP_TIMEOUT_S = 30.0
"""An operation that takes longer is stuck: an unexpected error."""
SETTLE_TIMEOUT_S = 30.0
RECHECK_TASKS = 1000
RETENTION_MARGIN_MS = 5_000
"""The re-read at the end leaves out results this close to the end of their retention."""
OPS_PER_CONNECTION = (100, 400)
RSS_END_SAMPLES = 3
"""Samples averaged at each end of the RSS series: one sample is noisy."""
SLOPE_WINDOW_S = 180.0
"""The RSS trend is judged only over at least this long after the warm-up."""
LAPSED_MESSAGE = "its reservation lapsed"
WORKER_LOG_ERROR = re.compile(r'"level": ?"(ERROR|CRITICAL)"')
EXPECTED_ERRORS = ("lapsed_lease", "lapsed_lease_reclaiming", "watch_cancelled", "stream_abandoned")


# ------------------------------------------------------------------ the ledger


@attrs.frozen(kw_only=True)
class Expected:
    """The end a task must have."""

    state: pb.TaskState
    failure_code: str = ""
    outputs: list[Any] | None = None
    """The values the `result` plugin keeps; None: not checked."""


@attrs.define
class TaskRecord:
    op: str
    expected: Expected
    accepted: bool = False
    """The worker answered that it took the task (or a result of it was read)."""
    refused: bool = False
    result: pb.TaskResult | None = None
    """The first terminal result read."""


def _identity(ended: pb.TaskResult) -> tuple[object, ...]:
    """What every read of one task's end must repeat."""
    return (
        ended.state,
        ended.failure_code,
        ended.accepted_at_ms,
        ended.finished_at_ms,
        ended.outputs_json,
    )


class Ledger:
    """Every task submitted, what it must end as and what was read of it; the errors seen."""

    def __init__(self) -> None:
        self.tasks: dict[str, TaskRecord] = {}
        self.tasks_ended = 0
        self.errors: collections.Counter[str] = collections.Counter()
        self.first_message: dict[str, str] = {}
        self.unaccounted: set[str] = set()
        """Tasks the worker accepted and then did not know, or never ended."""
        self.not_admitted: set[str] = set()
        """Tasks of an abandoned stream that the worker never read: not accepted, not lost."""

    def sent(self, task_id: str, op: str, expected: Expected) -> None:
        self.tasks[task_id] = TaskRecord(op=op, expected=expected)

    def accepted(self, task_id: str) -> None:
        self.tasks[task_id].accepted = True

    def refused(self, task_id: str) -> None:
        self.tasks[task_id].refused = True

    def ended(self, task_id: str, ended: pb.TaskResult) -> None:
        """A terminal result of `task_id` was read: check it and, if it is the first, book it."""
        record = self.tasks.get(task_id)
        if record is None:
            self.error("result_of_unknown_task", task_id)
            return
        record.accepted = True
        if record.result is not None:
            if _identity(record.result) != _identity(ended):
                self.error("ended_twice", f"{task_id}: {record.result} then {ended}")
            return
        record.result = ended
        self.tasks_ended += 1
        expected = record.expected
        if (ended.state, ended.failure_code) != (expected.state, expected.failure_code):
            self.error(
                "wrong_outcome",
                f"{task_id} ({record.op}) ended {ended.state.name} {ended.failure_code!r}"
                f" ({ended.message}); expected {expected.state.name} {expected.failure_code!r}",
            )
        elif expected.outputs is not None and task_outputs(ended) != expected.outputs:
            outputs = task_outputs(ended)
            self.error("wrong_outputs", f"{task_id}: {outputs} instead of {expected.outputs}")

    def unknown(self, task_id: str, message: str) -> None:
        """The worker answered NOT_FOUND for `task_id`, which it was sent and did not refuse."""
        record = self.tasks[task_id]
        if record.op == "abandon_stream" and not record.accepted:
            self.not_admitted.add(task_id)
        else:
            self.unaccounted.add(task_id)
            self.error("unaccounted", f"{task_id} ({record.op}): {message}")

    def open(self, task_id: str) -> bool:
        """Whether `task_id` still owes the ledger its end."""
        record = self.tasks[task_id]
        closed = self.unaccounted.union(self.not_admitted)
        return record.result is None and not record.refused and task_id not in closed

    def error(self, kind: str, message: str) -> None:
        self.errors[kind] += 1
        self.first_message.setdefault(kind, message)

    @property
    def unexpected_errors(self) -> int:
        return sum(n for kind, n in self.errors.items() if kind not in EXPECTED_ERRORS)

    @property
    def expected_errors(self) -> int:
        return sum(n for kind, n in self.errors.items() if kind in EXPECTED_ERRORS)


def error_kind(op: str, error: BaseException) -> str:
    """The unexpected-error kind of `error` raised by operation `op`."""
    if isinstance(error, WorkerCallError):
        return f"{op}_{error.rpc}_{error.status.name}"
    return f"{op}_{type(error).__name__}"


# ------------------------------------------------------------------ the clients


class Client:
    """One client loop: its own connection, random operations until `stop`, then it reads
    the results it still owes the ledger."""

    def __init__(self, index: int, address: str, ledger: Ledger, stop: trio.Event) -> None:
        self.index = index
        self.address = address
        self.ledger = ledger
        self.stop = stop
        self.random = random.Random(index)
        self.sequence = 0
        self.due: list[tuple[float, str]] = []
        """(when, task id): results to read later, a heap."""
        self.planned: dict[str, tuple[str, Expected]] = {}
        """Tasks made and not sent yet: task id -> (operation, expected end)."""
        self.worker: WorkerClient

    async def run(self) -> None:
        names = list(OPS)
        weights = [weight for weight, _ in OPS.values()]
        while not self.stop.is_set():
            async with WorkerClient.connect(self.address) as self.worker:
                for _ in range(self.random.randint(*OPS_PER_CONNECTION)):
                    if self.stop.is_set():
                        break
                    await self.guarded("fetch", self.fetch_due)
                    (name,) = self.random.choices(names, weights)
                    await self.guarded(name, functools.partial(OPS[name][1], self))
        async with WorkerClient.connect(self.address) as self.worker:
            with trio.move_on_after(SETTLE_TIMEOUT_S):
                while self.due:
                    await self.guarded("fetch", self.fetch_due)
                    await trio.sleep(FETCH_RETRY_S)
            for when, task_id in self.due:
                self.ledger.error("fetch_gave_up", f"{task_id} (due at {when:.1f})")

    async def guarded(self, op: str, work: Callable[[], Awaitable[None]]) -> None:
        """Run one operation; what it raises is an unexpected error of its kind."""
        try:
            with trio.fail_after(OP_TIMEOUT_S):
                await work()
        except trio.TooSlowError:
            self.ledger.error(f"{op}_stuck", f"client {self.index}: over {OP_TIMEOUT_S} s")
        except BlockxError as error:
            self.ledger.error(error_kind(op, error), f"client {self.index}: {error}")
        except Exception as error:  # anything else is a finding too: count it and go on
            where = "".join(traceback.format_exception(error)[-3:]).strip()
            self.ledger.error(error_kind(op, error), f"client {self.index}: {where}")
        finally:
            self.planned.clear()  # made for an operation that stopped before sending them

    # --- tasks -------------------------------------------------------------------------

    def new_id(self, op: str) -> str:
        self.sequence += 1
        return f"{op}-{self.index}-{self.sequence}"

    def calls_task(
        self, op: str, calls: list[tuple[str, list[Any]]], expected: Expected, timeout_ms: int = 0
    ) -> pb.TaskSpec:
        task_id = self.new_id(op)
        entries = [{"function": function, "args": args} for function, args in calls]
        task = task_spec(
            task_id,
            builder="call_list",
            payload=json.dumps({"calls": entries}).encode(),
            plugin="result",
            timeout_ms=timeout_ms,
        )
        self.planned[task_id] = (op, expected)
        return task

    def sending(self, *tasks: pb.TaskSpec) -> None:
        """Book `tasks` in the ledger: they are about to be submitted."""
        for task in tasks:
            self.ledger.sent(task.task_id, *self.planned.pop(task.task_id))

    def quick_task(self, op: str) -> pb.TaskSpec:
        a, b = self.random.randrange(10**6), self.random.randrange(10**6)
        expected = Expected(state=pb.TaskState.SUCCEEDED, outputs=[a + b])
        return self.calls_task(op, [("demo.add", [a, b])], expected)

    def slow_task(self, op: str) -> pb.TaskSpec:
        expected = Expected(state=pb.TaskState.SUCCEEDED, outputs=[SLOW_CALL_S])
        return self.calls_task(op, [("demo.sleep", [SLOW_CALL_S])], expected)

    async def submit(self, task: pb.TaskSpec, slot_id: str = "") -> pb.SubmitTaskResponse:
        self.sending(task)
        try:
            answer = await self.worker.submit(task, slot_id)
        except WorkerCallError:
            self.ledger.refused(task.task_id)
            raise
        self.ledger.accepted(task.task_id)
        if answer.result is not None:
            self.ledger.ended(task.task_id, answer.result)
        return answer

    async def watch_to_end(self, task_id: str) -> None:
        async with contextlib.aclosing(self.worker.watch([task_id])) as updates:
            async for update in updates:
                if update.is_terminal:
                    if update.result is None:
                        self.ledger.error("terminal_update_without_result", task_id)
                    else:
                        self.ledger.ended(task_id, update.result)
                    return
        self.ledger.error("watch_ended_early", task_id)

    async def read_result(self, task_id: str) -> bool:
        """GetTaskResult; True once `task_id` is terminal (its result booked)."""
        try:
            answer = await self.worker.result(task_id)
        except WorkerCallError as error:
            if error.status == Status.NOT_FOUND:
                self.ledger.unknown(task_id, error.message)
                return True  # nothing more will come of it
            raise
        if answer.result is None:
            return False
        self.ledger.ended(task_id, answer.result)
        return True

    def read_later(self, task_id: str) -> None:
        heapq.heappush(self.due, (time.monotonic() + FETCH_AFTER_S, task_id))

    async def fetch_due(self) -> None:
        now = time.monotonic()
        while self.due and self.due[0][0] <= now:
            _, task_id = heapq.heappop(self.due)
            if not await self.read_result(task_id):
                heapq.heappush(self.due, (now + FETCH_RETRY_S, task_id))

    # --- operations ----------------------------------------------------------------------

    async def reserved(self) -> None:
        task = self.quick_task("reserved")
        reservation = await self.worker.request_slot(task.task_id)
        answer = await self.submit(task, reservation.slot_id)
        if answer.result is None:
            await self.watch_to_end(task.task_id)
        if not await self.read_result(task.task_id):
            self.ledger.error("not_terminal_after_watch", task.task_id)

    async def inline(self) -> None:
        task = self.quick_task("inline")
        self.sending(task)
        ended = await self.worker.run_task(task)
        self.ledger.ended(task.task_id, ended)

    async def reserve_twice(self) -> None:
        task = self.quick_task("reserve_twice")
        first = await self.worker.request_slot(task.task_id)
        again = await self.worker.request_slot(task.task_id)
        if (again.slot_id, again.lease_expires_at_ms) != (first.slot_id, first.lease_expires_at_ms):
            self.ledger.error("reservation_not_idempotent", f"{task.task_id}: {first} {again}")
        await self.submit(task, first.slot_id)
        while not await self.read_result(task.task_id):
            await trio.sleep(0.02)

    async def lapse(self) -> None:
        task = self.quick_task("lapse")
        task_id = task.task_id
        reservation = await self.worker.request_slot(task_id, ttl_ms=LAPSE_TTL_MS)
        await trio.sleep(LAPSE_WAIT_S)
        try:
            await self.submit(task, reservation.slot_id)
        except WorkerCallError as error:
            if error.status == Status.FAILED_PRECONDITION and LAPSED_MESSAGE in error.message:
                self.ledger.error("lapsed_lease", error.message)
            elif error.status == Status.ABORTED:
                self.ledger.error("lapsed_lease_reclaiming", error.message)
            else:
                raise
        else:
            self.ledger.error("lapsed_lease_honoured", task_id)
            self.read_later(task_id)
            return
        try:
            await self.worker.result(task_id)
        except WorkerCallError as error:
            if error.status != Status.NOT_FOUND:
                raise
        else:
            self.ledger.error("lapsed_task_known", task_id)

    async def abandon_watch(self) -> None:
        task = self.slow_task("abandon_watch")
        answer = await self.submit(task)
        if answer.result is not None:
            return
        ended = False
        with trio.move_on_after(self.random.uniform(0, 2 * SLOW_CALL_S)):
            async with contextlib.aclosing(self.worker.watch([task.task_id])) as updates:
                async for update in updates:
                    if update.is_terminal and update.result is not None:
                        self.ledger.ended(task.task_id, update.result)
                        ended = True
                    elif self.random.random() < 0.5:
                        break  # left after its first update
        if not ended:
            self.ledger.error("watch_cancelled", task.task_id)
            self.read_later(task.task_id)

    async def batch(self) -> None:
        tasks = [self.quick_task("batch") for _ in range(BATCH_TASKS)]
        self.sending(*tasks)
        async with self.worker.run_tasks(tasks) as outcomes:
            async for outcome in outcomes:
                self.stream_outcome(outcome)

    async def abandon_stream(self) -> None:
        tasks = [self.slow_task("abandon_stream") for _ in range(BATCH_TASKS)]
        self.sending(*tasks)
        async with self.worker.run_tasks(tasks) as outcomes:
            async for outcome in outcomes:
                self.stream_outcome(outcome)
                break
        self.ledger.error("stream_abandoned", tasks[0].task_id)
        for task in tasks:
            if self.ledger.tasks[task.task_id].result is None:
                self.read_later(task.task_id)

    def stream_outcome(self, outcome: TaskOutcome) -> None:
        if outcome.result is not None:
            self.ledger.ended(outcome.task_id, outcome.result)
        else:
            assert outcome.error is not None  # a TaskOutcome holds one of the two
            self.ledger.refused(outcome.task_id)
            self.ledger.error(
                error_kind("stream", outcome.error), f"{outcome.task_id}: {outcome.error}"
            )

    async def failing(self) -> None:
        expected = Expected(state=pb.TaskState.FAILED, failure_code="CALL_RAISED")
        task = self.calls_task("failing", [("demo.fail", ["on purpose"])], expected)
        self.sending(task)
        ended = await self.worker.run_task(task)
        self.ledger.ended(task.task_id, ended)

    async def timeout(self) -> None:
        expected = Expected(state=pb.TaskState.FAILED, failure_code="TIMED_OUT")
        calls = [("demo.sleep", [TIMEOUT_CALL_S])]
        task = self.calls_task("timeout", calls, expected, timeout_ms=TIMEOUT_TASK_MS)
        self.sending(task)
        ended = await self.worker.run_task(task)
        self.ledger.ended(task.task_id, ended)


OPS: dict[str, tuple[int, Callable[[Client], Awaitable[None]]]] = {
    "reserved": (20, Client.reserved),
    "inline": (20, Client.inline),
    "reserve_twice": (8, Client.reserve_twice),
    "lapse": (4, Client.lapse),
    "abandon_watch": (12, Client.abandon_watch),
    "batch": (8, Client.batch),
    "abandon_stream": (4, Client.abandon_stream),
    "failing": (6, Client.failing),
    "timeout": (2, Client.timeout),
}
"""Each operation's weight in a client's random mix, and the operation."""


# ------------------------------------------------------------------ samples


@attrs.frozen(kw_only=True)
class Sample:
    t_s: float
    tasks: int
    rss_mb: float


async def sample_loop(
    worker: WorkerProcess,
    ledger: Ledger,
    status: WorkerClient,
    *,
    every_s: float,
    samples: list[Sample],
    started: float,
) -> None:
    """A SAMPLE line every `every_s` seconds, until cancelled."""
    previous = Sample(t_s=0.0, tasks=0, rss_mb=rss_mib(worker.process.pid))
    ticks = 1
    while True:
        await trio.sleep_until(started + ticks * every_s)
        ticks += 1
        now = await status.status()
        executors_mb = sum(executor.rss_bytes for executor in now.executors) / 2**20
        sample = Sample(
            t_s=trio.current_time() - started,
            tasks=ledger.tasks_ended,
            rss_mb=rss_mib(worker.process.pid),
        )
        rate = (sample.tasks - previous.tasks) / (sample.t_s - previous.t_s)
        print(
            f"SAMPLE t={sample.t_s:.0f} tasks={sample.tasks} tasks_per_s={rate:.1f}"
            f" rss_mb={sample.rss_mb:.1f} executors_rss_mb={executors_mb:.1f}"
            f" busy_slots={now.slots_total - now.free_slots} errors={ledger.unexpected_errors}"
            f" expected_errors={ledger.expected_errors}",
            flush=True,
        )
        samples.append(sample)
        previous = sample


def slope_per_min(samples: list[Sample]) -> float:
    """Least-squares slope of RSS over time, MiB per minute (0 for fewer than 2 samples)."""
    if len(samples) < 2:  # a line needs two points
        return 0.0
    mean_t = sum(s.t_s for s in samples) / len(samples)
    mean_rss = sum(s.rss_mb for s in samples) / len(samples)
    covariance = sum((s.t_s - mean_t) * (s.rss_mb - mean_rss) for s in samples)
    variance = sum((s.t_s - mean_t) ** 2 for s in samples)
    return covariance / variance * 60


# ------------------------------------------------------------------ the end


async def close_ledger(ledger: Ledger, client: WorkerClient) -> None:
    """Fetch every end not read yet; re-read the most recent ones."""
    for task_id, record in list(ledger.tasks.items()):
        if not ledger.open(task_id):
            continue
        try:
            answer = await client.result(task_id)
        except WorkerCallError as error:
            if error.status != Status.NOT_FOUND:
                raise
            ledger.unknown(task_id, error.message)
            continue
        if answer.result is None:
            ledger.unaccounted.add(task_id)
            ledger.error("unaccounted", f"{task_id} ({record.op}) still {answer.state.name}")
        else:
            ledger.ended(task_id, answer.result)
    retained_since_ms = time.time() * 1000 - RETENTION_MS + RETENTION_MARGIN_MS
    recent = sorted(
        (record.result.finished_at_ms, task_id)
        for task_id, record in ledger.tasks.items()
        if record.result is not None and record.result.finished_at_ms > retained_since_ms
    )[-RECHECK_TASKS:]
    for _, task_id in recent:
        answer = await client.result(task_id)
        if answer.result is None:
            ledger.error("ended_twice", f"{task_id} is {answer.state.name} again")
        else:
            ledger.ended(task_id, answer.result)


async def settled_status(client: WorkerClient) -> pb.GetWorkerStatusResponse:
    """The worker's status once nothing holds a slot, or after SETTLE_TIMEOUT_S."""
    with trio.move_on_after(SETTLE_TIMEOUT_S):
        while True:
            status = await client.status()
            if status.free_slots == status.slots_total and not status.waiting_submits:
                return status
            await trio.sleep(0.1)
    return await client.status()


async def health(port: int) -> int:
    async def check() -> HealthCheckResponse:
        channel = Channel(HOST, port)
        try:
            return await HealthStub(channel).Check(HealthCheckRequest())
        finally:
            channel.close()

    answer: HealthCheckResponse = await trio_asyncio.aio_as_trio(check)()
    return answer.status


@attrs.frozen(kw_only=True)
class Verdict:
    unaccounted: int
    not_admitted: int
    leaked_slots: int
    executor_restarts: int
    healthy: bool


async def verify(ledger: Ledger, address: str, port: int) -> Verdict:
    async with WorkerClient.connect(address) as client:
        await close_ledger(ledger, client)
        status = await settled_status(client)
        serving = await health(port) == HealthCheckResponse.SERVING
    taken = [slot for slot in status.slots if slot.state != "FREE"]
    for slot in taken[:10]:
        print(f"detail: slot still taken: {slot}", flush=True)
    executors = [f"{e.executor_id} {e.state} restarts={e.restarts}" for e in status.executors]
    print(f"detail: executors: {', '.join(executors)}", flush=True)
    ready = all(executor.state == "READY" for executor in status.executors)
    healthy = serving and status.ready and not status.draining and ready
    if not healthy:
        print(f"detail: unhealthy: health serving={serving}, {status}", flush=True)
    return Verdict(
        unaccounted=len(ledger.unaccounted),
        not_admitted=len(ledger.not_admitted),
        leaked_slots=max(status.slots_total - status.free_slots, len(taken)),
        executor_restarts=sum(executor.restarts for executor in status.executors),
        healthy=healthy,
    )


# ------------------------------------------------------------------ the run


@attrs.frozen(kw_only=True)
class Load:
    samples: list[Sample]
    ledger: Ledger
    elapsed_s: float
    """From the clients' start until the last of them read the results it owed."""


async def drive(args: argparse.Namespace, worker: WorkerProcess) -> Load:
    """The clients for `args.duration` seconds beside the sampler."""
    address = f"{HOST}:{worker.port}"
    ledger = Ledger()
    stop = trio.Event()
    samples: list[Sample] = []
    clients = [Client(index, address, ledger, stop) for index in range(args.clients)]
    started = trio.current_time()
    async with WorkerClient.connect(address) as status, trio.open_nursery() as nursery:
        sampling = functools.partial(
            sample_loop, every_s=args.sample_every, samples=samples, started=started
        )
        nursery.start_soon(sampling, worker, ledger, status)
        async with trio.open_nursery() as load:
            for client in clients:
                load.start_soon(client.run)
            await trio.sleep(args.duration)
            stop.set()
        nursery.cancel_scope.cancel()
    elapsed = trio.current_time() - started
    print(f"detail: clients stopped after {elapsed:.1f} s", flush=True)
    per_op = collections.Counter(record.op for record in ledger.tasks.values())
    print(f"detail: tasks sent by operation: {dict(sorted(per_op.items()))}", flush=True)
    return Load(samples=samples, ledger=ledger, elapsed_s=elapsed)


def report(
    args: argparse.Namespace, load: Load, verdict: Verdict, exit_status: int, log_errors: int
) -> bool:
    """The RESULT lines; True if the run passed."""
    ledger, samples = load.ledger, load.samples
    result("tasks_per_s", ledger.tasks_ended / load.elapsed_s, 1)
    result("tasks_total", ledger.tasks_ended, 0)
    result("errors_total", sum(ledger.errors.values()), 0)
    for kind in EXPECTED_ERRORS:
        result(f"errors_{kind}", ledger.errors[kind], 0)
    for kind, count in sorted(ledger.errors.items()):
        if kind not in EXPECTED_ERRORS:
            result(f"errors_{kind}", count, 0)
            print(f"detail: {kind}, first: {ledger.first_message[kind]}", flush=True)
    result("errors_unexpected", ledger.unexpected_errors, 0)
    result("unaccounted_tasks", verdict.unaccounted, 0)
    result("stream_tasks_not_admitted", verdict.not_admitted, 0)
    result("leaked_slots", verdict.leaked_slots, 0)
    result("executor_restarts", verdict.executor_restarts, 0)
    result("worker_log_errors", log_errors, 0)
    failures = {
        "unexpected errors": ledger.unexpected_errors,
        "unaccounted tasks": verdict.unaccounted,
        "leaked slots": verdict.leaked_slots,
        "executor restarts": verdict.executor_restarts,
        "worker unhealthy": not verdict.healthy,
        "worker exit status": exit_status,
        "worker log errors": log_errors,
        **rss_failures(args, samples),
    }
    failed = [what for what, value in failures.items() if value]
    print(f"detail: {'FAILED: ' + ', '.join(failed) if failed else 'passed'}", flush=True)
    return not failed


def rss_failures(args: argparse.Namespace, samples: list[Sample]) -> dict[str, bool]:
    """The RSS figures' RESULT lines; which of the two bounds of "flat" they break."""
    after_warmup = [sample for sample in samples if sample.t_s >= args.warmup] or samples[-1:]
    if not after_warmup:
        return {}
    start = statistics.mean(s.rss_mb for s in after_warmup[:RSS_END_SAMPLES])
    end = statistics.mean(s.rss_mb for s in after_warmup[-RSS_END_SAMPLES:])
    slope = slope_per_min(after_warmup)
    result("rss_start_mb", start, 1)
    result("rss_end_mb", end, 1)
    result("rss_growth_mb", end - start, 1)
    result("rss_slope_mb_per_min", slope, 2)
    window_s = after_warmup[-1].t_s - after_warmup[0].t_s
    return {
        f"RSS growth over {args.max_rss_growth_mb:g} MiB": end - start > args.max_rss_growth_mb,
        f"RSS slope over {args.max_rss_slope_mb_per_min:g} MiB/min": (
            window_s >= SLOPE_WINDOW_S and slope > args.max_rss_slope_mb_per_min
        ),
    }


async def soak(args: argparse.Namespace) -> bool:
    slots = max(SLOTS, 4 * args.clients)
    env = {"RESULT_RETENTION_MS": str(RETENTION_MS)}
    async with trio_asyncio.open_loop():
        worker, ready_s, _ = await trio_asyncio.aio_as_trio(start_worker)(
            args.executors, slots=slots, env=env
        )
        print(
            f"detail: worker pid {worker.process.pid} ready in {ready_s:.2f} s; {slots} slots,"
            f" {args.executors} executors, {args.clients} clients for {args.duration:.0f} s,"
            f" a sample every {args.sample_every:g} s, warm-up {args.warmup:g} s",
            flush=True,
        )
        try:
            load = await drive(args, worker)
            verdict = await verify(load.ledger, f"{HOST}:{worker.port}", worker.port)
        finally:
            exit_status = await trio_asyncio.aio_as_trio(stop_worker)(worker, args.worker_log)
    log_errors = sum(1 for line in worker.log if WORKER_LOG_ERROR.search(line))
    return report(args, load, verdict, exit_status, log_errors)


def main() -> None:
    tune_gc()  # as the worker process does
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=float, default=300.0, help="seconds of load")
    parser.add_argument("--clients", type=int, default=32, help="concurrent clients")
    parser.add_argument("--sample-every", type=float, default=10.0, help="seconds per SAMPLE")
    parser.add_argument(
        "--warmup", type=float, default=120.0, help="seconds before RSS counts (<= duration / 2)"
    )
    parser.add_argument("--executors", type=int, default=2)
    parser.add_argument(
        "--max-rss-growth-mb", type=float, default=10.0, help="RSS growth that fails the run"
    )
    parser.add_argument(
        "--max-rss-slope-mb-per-min", type=float, default=1.5, help="RSS trend that fails it"
    )
    parser.add_argument("--worker-log", metavar="PATH", help="write the worker's stderr here")
    args = parser.parse_args()
    args.warmup = min(args.warmup, args.duration / 2)
    args.sample_every = min(args.sample_every, args.duration / 5)
    passed = trio.run(soak, args)
    sys.exit(0 if passed else 1)


if __name__ == "__main__":
    main()
