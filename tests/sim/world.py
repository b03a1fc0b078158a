"""What one simulated run shares: its random source, its clock, its trace and its ledger.

Everything random in a run is drawn from `World.rng`, one `random.Random(seed)`
(the dispatcher's draws and Trio's scheduler are seeded from it too), so a
seed names one run exactly. The trace is what happened, in order, with the
simulated time of each event; two runs of a seed give equal traces. The
ledger is what the fake executors did and what the fake clients were told,
for the checks at the end (`tests.sim.checks`); a check that can be judged
on the spot is recorded as a violation at once, with its time.
"""

from __future__ import annotations

import enum
import random

import attrs
import trio

from blockx.calls import CallOutcome, RetryPolicy
from blockx.executors import DownReason
from blockx.process.clock import EpochClock
from blockx.slots import TaskResult, TaskSnapshot, TaskSpec

EPOCH_MS = 1_700_000_000_000
"""The worker clock's reading at the start of every run: its figures never depend on
the day the run happens."""

TraceEvent = tuple[object, ...]
"""(simulated ms since the start, who, what, details...): plain values, so traces compare."""


class Fault(enum.Enum):
    """The faults a run may inject; each run draws when and where from its seed."""

    EXECUTOR_CRASH = "executor-crash"
    """An executor process dies mid-call: its calls are never answered."""
    EXECUTOR_HANG = "executor-hang"
    """An executor stops answering and heartbeating until it is declared lost."""
    SLOW_CALL = "slow-call"
    """A call runs past its call deadline."""
    STUCK_CALL = "stuck-call"
    """A slow call ignores its cancel, so its executor must be replaced."""
    CALL_FAILURE = "call-failure"
    """A call raises, retryably or not."""
    WATCH_ABANDON = "watch-abandon"
    """A client goes away from its watch before the task ends."""
    LEASE_LAPSE = "lease-lapse"
    """A client submits into its reservation after the lease ran out, or never submits."""
    TASK_TIMEOUT = "task-timeout"
    """A task's deadline is shorter than its calls may take."""
    PLUGIN_FAILURE = "plugin-failure"
    """A task's plugin fails."""
    SLOW_PLUGIN = "slow-plugin"
    """A task's plugin takes longer than the phase IO timeout."""
    DRAIN = "drain"
    """The worker is stopped at a random time (drain, then the drain timeout)."""


ALL_FAULTS = frozenset(Fault)


@attrs.define(eq=False)
class Attempt:
    """One attempt of a call as an executor saw it, from the frame that brought it."""

    call_id: str
    """The dispatcher's id: `<task id>#<run>:<index>`."""
    attempt: int
    task_id: str
    epoch: str
    """The function code it runs (the epoch its task pinned)."""
    index: int
    """The call's place among its task's calls; -1 for a subcall."""
    executor_id: str
    pid: int
    received_ms: int
    deadline_ms: int
    """When the dispatcher gives up on it (the frame's deadline, as an absolute time)."""
    started_ms: int | None = None
    answered_ms: int | None = None
    outcome: CallOutcome | None = None
    """What the executor answered, if it did."""
    lost: DownReason | None = None
    """Why its executor went down before it answered, if it did."""

    @property
    def subcall(self) -> bool:
        return self.index < 0

    @property
    def run(self) -> str:
        """`<task id>#<run>`: which run of the task's calls it belongs to."""
        return self.call_id.partition(":")[0]

    def succeeded_in_time(self) -> bool:
        """Answered with success before its deadline (at the deadline, the dispatcher has
        given up: its deadline wins a tie)."""
        return (
            self.outcome is not None
            and self.outcome.error_code is None
            and self.answered_ms is not None
            and self.answered_ms < self.deadline_ms
        )


@attrs.define(eq=False)
class TaskRecord:
    """A task a client submitted, and what became of the submit."""

    spec: TaskSpec
    call_count: int
    short_timeout: bool
    plugin_fails: bool
    plugin_delay_ms: int
    """How long its plugin takes (0 without one)."""
    accepted_ms: int | None = None
    """When the worker accepted it (None: every submit was refused)."""
    watch_left_ms: list[int] = attrs.Factory(list)
    """When a client went away from a watch of it before it ended."""
    answer_unknown: bool = False
    """Submitted on a stream the client went away from before the answer came: it may
    have been accepted."""
    terminal_seen: list[TaskSnapshot] = attrs.Factory(list)
    """Every terminal snapshot a client was given of it (watch, result, submit again)."""


@attrs.define(eq=False)
class World:
    """The run's shared state; see the module docstring."""

    rng: random.Random
    faults: frozenset[Fault]
    clock: EpochClock
    faults_until_ms: int
    """After this, no new fault is injected (so the worker can show it still serves)."""
    phase_io_timeout_ms: int
    task_deadline_ms: int
    """The deadline of a task that names no timeout (`worker.taskDeadlineMs`)."""
    result_retention_ms: int
    watch_grace_ms: int
    drain_timeout_ms: int
    default_retry: RetryPolicy
    """The worker's retry policy, for a task that names none."""
    trace: list[TraceEvent] = attrs.Factory(list)
    violations: list[str] = attrs.Factory(list)
    attempts: list[Attempt] = attrs.Factory(list)
    tasks: dict[str, TaskRecord] = attrs.Factory(dict)
    results: dict[str, list[TaskResult]] = attrs.Factory(dict)
    """Every terminal result the worker reported (`on_finished`), by task id."""
    draining_since_ms: int | None = None
    drain_forced: bool = False
    last_lease_ms: int = 0
    """When the last reservation a client made expires (or expired)."""

    def now_ms(self) -> int:
        """Simulated milliseconds since the run started."""
        return self.clock.now_ms() - EPOCH_MS

    def trio_time(self, at_ms: int) -> float:
        """The Trio time at which `now_ms()` reads `at_ms`."""
        return self.clock.trio_time(at_ms + EPOCH_MS)

    async def sleep_ms(self, duration_ms: int) -> None:
        await trio.sleep_until(self.trio_time(self.now_ms() + duration_ms))

    def forgotten(self, task_id: str, margin_ms: int = 0) -> bool:
        """Whether the worker may have forgotten the task's result (its retention ran out,
        or runs out within `margin_ms`)."""
        results = self.results.get(task_id)
        if not results:
            return False
        forget_at_ms = results[-1].finished_at_ms + self.result_retention_ms
        return self.clock.now_ms() + margin_ms >= forget_at_ms

    def has(self, fault: Fault) -> bool:
        """Whether `fault` may be injected now."""
        return fault in self.faults and self.now_ms() < self.faults_until_ms

    def chance(self, fault: Fault, probability: float) -> bool:
        """True with `probability` while `fault` may be injected; draws only then."""
        return self.has(fault) and self.rng.random() < probability

    def record(self, who: str, what: str, *details: object) -> None:
        self.trace.append((self.now_ms(), who, what, *details))

    def violation(self, text: str) -> None:
        self.violations.append(f"at {self.now_ms()} ms: {text}")
        self.record("check", "violation", text)

    def finished(self, result: TaskResult) -> None:
        """The worker's `on_finished` hook: every terminal result it reports."""
        self.results.setdefault(result.task_id, []).append(result)
        code = result.failure_code.value if result.failure_code else ""
        self.record("worker", "finished", result.task_id, result.state.value, code)
