"""Hypothesis state machine over `DispatchCore`.

The test keeps its own record of what runs where (from the commands alone)
and checks the core's guarantees after every step: every call ends at most
once, attempts never exceed the maximum, nothing of an ended task starts,
in-flight never exceeds the window or an executor's room, one step shares
dispatches fairly between tasks, and (at teardown) every sealed task that was
not cancelled finishes once its calls can run.
"""

from __future__ import annotations

import collections
import itertools

import attrs
import hypothesis.strategies as st
from hypothesis import note
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from blockx.calls import (
    CallFailurePolicy,
    CallOutcome,
    CallSpec,
    FailureCode,
    RetryPolicy,
)
from blockx.dispatch import (
    CallPolicy,
    CallResultsArrived,
    CallsAdded,
    CancelCalls,
    ClockTicked,
    DeliverSubcallResult,
    DispatchCommand,
    DispatchCore,
    DispatchEvent,
    ExecutorJoined,
    ExecutorLeft,
    FinishCallPhase,
    ReplaceExecutor,
    RevokeCalls,
    RunCalls,
    SubcallRequested,
    TaskCancelled,
    TaskOpened,
)
from blockx.steps import StimulusIds

EXECUTOR_IDS = ["e0", "e1", "e2"]
DRAWS = st.sampled_from([0.0, 0.5, 0.999])


@attrs.define
class TaskRecord:
    policy: CallPolicy
    calls: list[str] = attrs.Factory(list)
    sealed: bool = False
    ended: bool = False  # finished or cancelled
    cancelled: bool = False
    finishes: int = 0


@attrs.define
class Running:
    executor_id: str
    task_id: str
    attempt: int
    subcall: bool


@attrs.define
class Pace:
    """The model's own account of an executor's paced queue (the core's rule 8)."""

    depth: int
    pace_us: float | None = None
    busy_since_ms: int | None = None
    idle_since_ms: int | None = None


UNPACED_DEPTH = 64


class DispatchTable(RuleBasedStateMachine):
    QUEUE_MS: int | None = None
    """The core's `queue_ms`: None, queues hold their capacity; else rule 8, mirrored."""

    def __init__(self) -> None:
        super().__init__()
        self.core = DispatchCore(queue_ms=self.QUEUE_MS)
        self.paces: dict[str, Pace] = {}
        self.now = 0
        self.ids = itertools.count()
        self.stimuli = StimulusIds()
        self.tasks: dict[str, TaskRecord] = {}
        self.capacity: dict[str, int] = {}
        self.running: dict[str, Running] = {}
        self.zombies: dict[tuple[str, int], str] = {}
        self.attempts: dict[str, int] = {}
        self.subcall_ids: set[str] = set()
        self.waiting: collections.Counter[str] = collections.Counter()  # parent -> subcalls
        self.call_task: dict[str, str] = {}
        self.revoking: dict[tuple[str, int], str] = {}  # asked back: (call, attempt) -> executor
        self.revoked: collections.Counter[str] = collections.Counter()  # attempts given back
        self.succeeded: set[str] = set()
        self.may_have_run: set[str] = set()  # attempts lost or cancelled while running
        self.replacing: set[str] = set()  # executors the core asked to replace

    # ---------------------------------------------------------------- driving

    def _send(self, event: DispatchEvent) -> tuple[DispatchCommand, ...]:
        note(repr(event))
        commands = self.core.handle(event).commands
        note(f"  -> {commands!r}")
        logged = self.core.recent_stimuli[-1]
        assert (logged.stimulus_id, logged.event) == (event.stimulus_id, event)
        assert logged.outcome == (",".join(type(c).__name__ for c in commands) or "-")
        per_task: collections.Counter[str] = collections.Counter()
        paced = False
        for command in commands:
            if not paced and isinstance(command, RunCalls | RevokeCalls | ReplaceExecutor):
                paced = True  # the core's pump begins: its queues are paced by now
                self._pace(event)
            match command:
                case RunCalls(executor_id=executor_id, calls=calls):
                    assert calls, "empty RunCalls"
                    assert executor_id in self.capacity, "dispatched to an absent executor"
                    pace = self.paces[executor_id]
                    if pace.busy_since_ms is None and not self._running_on(executor_id):
                        pace.busy_since_ms = self.now
                    for call in calls:
                        self._check_room_for(executor_id, call.call_id)
                        self._started(executor_id, call.call_id, call.task_id, call.attempt)
                        if call.call_id not in self.subcall_ids:  # subcalls go first (rule 4)
                            per_task[call.task_id] += 1
                case RevokeCalls(executor_id=executor_id, attempts=attempts):
                    assert attempts, "empty RevokeCalls"
                    for call_id, attempt in attempts:
                        running = self.running[call_id]
                        assert (running.executor_id, running.attempt) == (executor_id, attempt)
                        assert not running.subcall, "a subcall was revoked"
                        assert not self.waiting[call_id], "a call waiting on subcalls was revoked"
                        assert (call_id, attempt) not in self.revoking, "revoked twice"
                        self.revoking[call_id, attempt] = executor_id
                case CancelCalls(executor_id=executor_id, attempts=attempts):
                    for call_id, attempt in attempts:
                        self.may_have_run.add(call_id)
                        running = self.running.pop(call_id)
                        assert (running.executor_id, running.attempt) == (executor_id, attempt)
                        self.zombies[call_id, attempt] = executor_id
                        self.waiting.pop(call_id, None)
                case DeliverSubcallResult(parent_call_id=parent, parent_attempt=attempt):
                    if parent in self.running and self.running[parent].attempt == attempt:
                        self.waiting[parent] -= 1
                case ReplaceExecutor(executor_id=executor_id):
                    assert executor_id in self.capacity
                    assert any(e == executor_id for e in self.zombies.values())
                    self.replacing.add(executor_id)
                case FinishCallPhase(task_id=task_id, outcome=outcome):
                    record = self.tasks[task_id]
                    assert not record.ended, f"{task_id} finished twice"
                    record.ended = True
                    record.finishes += 1
                    if outcome.ok:
                        assert len(outcome.outputs) == sum(
                            c in self.succeeded for c in record.calls
                        )
                        assert len(outcome.outputs) + len(outcome.failures) == len(record.calls)
        if not paced:
            self._pace(event)
        self._check_fair(per_task)
        self.core.check_invariants()
        for executor_id, pace in self.paces.items():
            assert self.core.executor_depth(executor_id) == pace.depth, executor_id
        return commands

    def _running_on(self, executor_id: str) -> list[str]:
        return [c for c, r in self.running.items() if r.executor_id == executor_id]

    def _pace(self, event: DispatchEvent) -> None:
        """Rule 8 as the model sees it: the pace of the executor whose results came, then
        the executors idle for longer than QUEUE_MS forget theirs."""
        queue_ms = self.QUEUE_MS
        if queue_ms is None:
            return
        if isinstance(event, CallResultsArrived) and event.executor_id in self.paces:
            pace = self.paces[event.executor_id]
            revoked = sum(o.error_code is FailureCode.CALL_REVOKED for o in event.outcomes)
            ended = len(event.succeeded) + len(event.outcomes) - revoked
            if ended and pace.busy_since_ms is not None:
                sample = (self.now - pace.busy_since_ms) * 1000 / ended
                pace.pace_us = sample if pace.pace_us is None else (pace.pace_us + sample) / 2
                paced = int(queue_ms * 1000 / max(pace.pace_us, 1.0))
                pace.depth = min(self.capacity[event.executor_id], max(2, paced))
            if self._running_on(event.executor_id):
                pace.busy_since_ms = self.now
            else:
                pace.busy_since_ms, pace.idle_since_ms = None, self.now
        for executor_id, pace in self.paces.items():
            idle = pace.idle_since_ms
            if (
                not self._running_on(executor_id)
                and idle is not None
                and self.now - idle > queue_ms
            ):
                pace.pace_us, pace.idle_since_ms = None, None
                pace.depth = min(self.capacity[executor_id], UNPACED_DEPTH)

    def _started(self, executor_id: str, call_id: str, task_id: str, attempt: int) -> None:
        record = self.tasks[task_id]
        assert not record.ended, f"{call_id} started after {task_id} ended"
        assert call_id not in self.running, f"{call_id} runs twice at once"
        assert call_id not in self.succeeded, f"{call_id} ran again after it succeeded"
        assert attempt == self.attempts.get(call_id, 0) + 1
        assert attempt - self.revoked[call_id] <= record.policy.retry.max_attempts
        if record.policy.retry.at_most_once:
            assert call_id not in self.may_have_run, f"{call_id} may have run and ran again"
        self.attempts[call_id] = attempt
        self.running[call_id] = Running(
            executor_id=executor_id,
            task_id=task_id,
            attempt=attempt,
            subcall=call_id in self.subcall_ids,
        )
        top = sum(1 for r in self.running.values() if r.task_id == task_id and not r.subcall)
        assert top <= record.policy.window, f"{task_id} runs {top} > window"

    def _check_room_for(self, executor_id: str, call_id: str) -> None:
        """A call is dispatched only into room it may use.

        Fresh calls and retries need plain room (capacity); subcalls may also
        use the extra unit each subcall waited for brings to its executor.
        """
        here = [c for c, r in self.running.items() if r.executor_id == executor_id]
        occupied = len(here) + sum(1 for e in self.zombies.values() if e == executor_id)
        room = self.paces[executor_id].depth  # its capacity, or its paced depth (rule 8)
        if call_id in self.subcall_ids:
            room += sum(self.waiting[c] for c in here)
        assert occupied < room, f"{call_id} dispatched to a full {executor_id}"

    def _check_fair(self, per_task: collections.Counter[str]) -> None:
        """Tasks that still have runnable calls after a step got equal turns in it."""
        still_runnable = [t for t in per_task if self._runnable(t)]
        counts = [per_task[t] for t in still_runnable]
        assert not counts or max(counts) - min(counts) <= 1, f"unfair step {per_task}"

    def _runnable(self, task_id: str) -> bool:
        record = self.tasks[task_id]
        if record.ended:
            return False
        top = sum(1 for r in self.running.values() if r.task_id == task_id and not r.subcall)
        fresh = [c for c in record.calls if c not in self.attempts]
        return bool(fresh) and top < record.policy.window

    def _completable(self) -> list[str]:
        """Running calls that can answer: not blocked waiting on a subcall."""
        return sorted(c for c in self.running if not self.waiting[c])

    def _open_tasks(self) -> list[str]:
        return [t for t, r in self.tasks.items() if not r.ended and not r.sealed]

    # ----------------------------------------------------------------- rules

    @precondition(lambda self: len(self.tasks) < 4)
    @rule(
        max_attempts=st.integers(1, 3),
        base_backoff_ms=st.sampled_from([0, 10]),
        window=st.integers(1, 6),
        fail_fast=st.booleans(),
        call_deadline_ms=st.sampled_from([50, 1_000]),
        at_most_once=st.booleans(),
    )
    def open_task(
        self,
        *,
        max_attempts: int,
        base_backoff_ms: int,
        window: int,
        fail_fast: bool,
        call_deadline_ms: int,
        at_most_once: bool,
    ) -> None:
        task_id = f"t{len(self.tasks)}"
        policy = CallPolicy(
            retry=RetryPolicy(
                max_attempts=max_attempts,
                base_backoff_ms=base_backoff_ms,
                jitter_percent=5,
                at_most_once=at_most_once,
            ),
            failure_policy=CallFailurePolicy.FAIL_FAST
            if fail_fast
            else CallFailurePolicy.BEST_EFFORT,
            window=window,
            call_deadline_ms=call_deadline_ms,
        )
        self.tasks[task_id] = TaskRecord(policy=policy)
        self._send(
            TaskOpened(
                task_id=task_id,
                policy=policy,
                now_ms=self.now,
                stimulus_id=self.stimuli.stamp("opened"),
            )
        )

    @precondition(lambda self: self._open_tasks())
    @rule(data=st.data(), count=st.integers(0, 6), sealed=st.booleans())
    def add_calls(self, data: st.DataObject, count: int, sealed: bool) -> None:
        task_id = data.draw(st.sampled_from(self._open_tasks()), label="task_id")
        # Ids under a prefix (as the dispatcher sends a run's calls) or whole.
        prefix = data.draw(st.sampled_from(["", f"{task_id}#:"]), label="id_prefix")
        specs = []
        for _ in range(count):
            own_id = f"c{next(self.ids)}"
            specs.append(CallSpec(call_id=own_id, function="demo.add"))
            self.tasks[task_id].calls.append(prefix + own_id)
            self.call_task[prefix + own_id] = task_id
        self.tasks[task_id].sealed = sealed
        self._send(
            CallsAdded(
                task_id=task_id,
                calls=tuple(specs),
                sealed=sealed,
                now_ms=self.now,
                stimulus_id=self.stimuli.stamp("added"),
                id_prefix=prefix,
            )
        )

    @rule(executor_id=st.sampled_from(EXECUTOR_IDS), capacity=st.integers(1, 3))
    def join_executor(self, executor_id: str, capacity: int) -> None:
        if executor_id in self.capacity:
            return
        self.capacity[executor_id] = capacity
        unpaced = capacity if self.QUEUE_MS is None else min(capacity, UNPACED_DEPTH)
        self.paces[executor_id] = Pace(depth=unpaced)
        self._send(
            ExecutorJoined(
                executor_id=executor_id,
                capacity=capacity,
                now_ms=self.now,
                stimulus_id=self.stimuli.stamp("joined"),
            )
        )

    @precondition(lambda self: self.capacity)
    @rule(
        data=st.data(),
        code=st.sampled_from([FailureCode.EXECUTOR_LOST, FailureCode.EXECUTOR_WEDGED]),
        draw=DRAWS,
    )
    def lose_executor(self, data: st.DataObject, code: FailureCode, draw: float) -> None:
        executor_id = data.draw(st.sampled_from(sorted(self.capacity)), label="executor_id")
        self._lose(executor_id, code, draw)

    @precondition(lambda self: self.replacing)
    @rule(data=st.data())
    def replace_executor(self, data: st.DataObject) -> None:
        """The pool carries out a ReplaceExecutor: the process is killed and leaves."""
        executor_id = data.draw(st.sampled_from(sorted(self.replacing)), label="executor_id")
        self._lose(executor_id, FailureCode.EXECUTOR_WEDGED, 0.0)

    def _lose(self, executor_id: str, code: FailureCode, draw: float) -> None:
        self.replacing.discard(executor_id)
        del self.capacity[executor_id]
        del self.paces[executor_id]
        for call_id in [c for c, r in self.running.items() if r.executor_id == executor_id]:
            self.may_have_run.add(call_id)
            del self.running[call_id]
            self.waiting.pop(call_id, None)
        for attempt in [a for a, e in self.zombies.items() if e == executor_id]:
            del self.zombies[attempt]
        self._send(
            ExecutorLeft(
                executor_id=executor_id,
                error_code=code,
                now_ms=self.now,
                draw=draw,
                stimulus_id=self.stimuli.stamp("left"),
            )
        )
        assert executor_id not in self.core.executor_ids()

    @precondition(lambda self: self._completable())
    @rule(
        data=st.data(),
        kind=st.sampled_from(["ok", "ok", "ok", "retryable", "final"]),
        draw=DRAWS,
    )
    def finish_call(self, data: st.DataObject, kind: str, draw: float) -> None:
        call_id = data.draw(st.sampled_from(self._completable()), label="call_id")
        running = self.running.pop(call_id)
        self.waiting.pop(call_id, None)
        if kind == "ok":
            outcome = CallOutcome.success(
                call_id=call_id, attempt=running.attempt, value=call_id.encode()
            )
            self.succeeded.add(call_id)
        else:
            code = (
                FailureCode.CALL_RAISED_RETRYABLE
                if kind == "retryable"
                else FailureCode.CALL_RAISED
            )
            outcome = CallOutcome.failure(
                call_id=call_id,
                attempt=running.attempt,
                error_code=code,
                error_message="",
                retryable=kind == "retryable",
            )
        self._send(
            CallResultsArrived(
                executor_id=running.executor_id,
                outcomes=(outcome,),
                now_ms=self.now,
                draw=draw,
                stimulus_id=self.stimuli.stamp("arrived"),
            )
        )

    @precondition(lambda self: self._completable())
    @rule(data=st.data(), in_bulk=st.booleans())
    def finish_executor_batch(self, data: st.DataObject, in_bulk: bool) -> None:
        """Every call running on an executor succeeds in one frame: as outcomes, or as
        rows in bulk (`succeeded`), as executors send them."""
        executor_id = data.draw(
            st.sampled_from(sorted({self.running[c].executor_id for c in self._completable()})),
            label="executor_id",
        )
        self._succeed_all_on(executor_id, in_bulk=in_bulk)

    def _succeed_all_on(self, executor_id: str, *, in_bulk: bool = False) -> None:
        done = {
            c: self.running[c].attempt
            for c in self._completable()
            if self.running[c].executor_id == executor_id
        }
        for call_id in done:
            del self.running[call_id]
            self.waiting.pop(call_id, None)
            self.succeeded.add(call_id)
        rows = tuple((c, attempt, b"v") for c, attempt in done.items())
        outcomes = tuple(CallOutcome.success(call_id=c, attempt=a, value=v) for c, a, v in rows)
        self._send(
            CallResultsArrived(
                executor_id=executor_id,
                outcomes=() if in_bulk else outcomes,
                succeeded=rows if in_bulk else (),
                now_ms=self.now,
                stimulus_id=self.stimuli.stamp("arrived"),
            )
        )

    def _revocable(self) -> list[tuple[str, int]]:
        """Revocations whose attempt still runs on the executor asked."""
        return sorted(
            (call_id, attempt)
            for (call_id, attempt), executor_id in self.revoking.items()
            if call_id in self.running
            and (self.running[call_id].executor_id, self.running[call_id].attempt)
            == (executor_id, attempt)
        )

    @precondition(lambda self: self._revocable())
    @rule(data=st.data(), given_back=st.booleans())
    def answer_revoke(self, data: st.DataObject, given_back: bool) -> None:
        """The executor gives a queued attempt back, or had started it (and says nothing)."""
        call_id, attempt = data.draw(st.sampled_from(self._revocable()), label="attempt")
        executor_id = self.revoking.pop((call_id, attempt))
        if not given_back:
            return
        del self.running[call_id]
        self.revoked[call_id] += 1
        outcome = CallOutcome.failure(
            call_id=call_id,
            attempt=attempt,
            error_code=FailureCode.CALL_REVOKED,
            error_message="taken back",
            retryable=True,
        )
        commands = self._send(
            CallResultsArrived(
                executor_id=executor_id,
                outcomes=(outcome,),
                now_ms=self.now,
                stimulus_id=self.stimuli.stamp("revoked"),
            )
        )
        assert not any(isinstance(c, FinishCallPhase) for c in commands), "a revoke ended a task"

    @precondition(lambda self: self.zombies)
    @rule(data=st.data())
    def answer_cancelled_call(self, data: st.DataObject) -> None:
        attempt = data.draw(st.sampled_from(sorted(self.zombies)), label="attempt")
        commands = self._answer_zombie(attempt)
        assert not any(isinstance(c, FinishCallPhase | DeliverSubcallResult) for c in commands)

    def _answer_zombie(self, attempt: tuple[str, int]) -> tuple[DispatchCommand, ...]:
        executor_id = self.zombies.pop(attempt)
        outcome = CallOutcome.success(call_id=attempt[0], attempt=attempt[1], value=b"late")
        return self._send(
            CallResultsArrived(
                executor_id=executor_id,
                outcomes=(outcome,),
                now_ms=self.now,
                stimulus_id=self.stimuli.stamp("arrived"),
            )
        )

    @precondition(lambda self: self.running)
    @rule(data=st.data())
    def request_subcall(self, data: st.DataObject) -> None:
        parent = data.draw(st.sampled_from(sorted(self.running)), label="parent")
        running = self.running[parent]
        # It runs, so it has started: a revoke of it can no longer give it back.
        self.revoking.pop((parent, running.attempt), None)
        subcall_id = f"s{next(self.ids)}"
        self.subcall_ids.add(subcall_id)
        self.call_task[subcall_id] = running.task_id
        self.waiting[parent] += 1
        self._send(
            SubcallRequested(
                executor_id=running.executor_id,
                parent_call_id=parent,
                parent_attempt=running.attempt,
                subcall=CallSpec(call_id=subcall_id, function="demo.echo"),
                now_ms=self.now,
                stimulus_id=self.stimuli.stamp("subcall"),
            )
        )

    @precondition(lambda self: self.tasks)
    @rule(data=st.data())
    def cancel_task(self, data: st.DataObject) -> None:
        task_id = data.draw(st.sampled_from(sorted(self.tasks)), label="task_id")
        record = self.tasks[task_id]
        commands = self._send(
            TaskCancelled(
                task_id=task_id, now_ms=self.now, stimulus_id=self.stimuli.stamp("cancelled")
            )
        )
        assert not any(isinstance(c, FinishCallPhase) for c in commands)
        if not record.ended:
            record.ended = record.cancelled = True
        assert task_id not in self.core.task_ids()

    @rule(elapsed_ms=st.integers(0, 600), draw=DRAWS)
    def advance_clock(self, elapsed_ms: int, draw: float) -> None:
        self.now += elapsed_ms
        self._send(
            ClockTicked(now_ms=self.now, draw=draw, stimulus_id=self.stimuli.stamp("ticked"))
        )
        due = self.core.next_deadline_ms()
        assert due is None or due > self.now

    # ------------------------------------------------------------- invariants

    @invariant()
    def running_matches_the_core(self) -> None:
        for executor_id in self.core.executor_ids():
            ours = {c for c, r in self.running.items() if r.executor_id == executor_id}
            assert set(self.core.running_calls(executor_id)) == ours

    @invariant()
    def ended_tasks_are_forgotten(self) -> None:
        for task_id, record in self.tasks.items():
            assert (task_id in self.core.task_ids()) == (not record.ended)
            assert record.finishes <= 1

    # ---------------------------------------------------------------- liveness

    def teardown(self) -> None:
        """Let every call run and succeed: every sealed, uncancelled task finishes."""
        if not hasattr(self, "core"):
            return
        if not self.capacity:
            self.join_executor("e0", 2)
        for task_id in self._open_tasks():
            self.tasks[task_id].sealed = True
            self._send(
                CallsAdded(
                    task_id=task_id,
                    calls=(),
                    sealed=True,
                    now_ms=self.now,
                    stimulus_id=self.stimuli.stamp("added"),
                )
            )
        for _ in range(10_000):
            pending = [t for t, r in self.tasks.items() if not r.ended]
            if not pending:
                break
            if not self.capacity:  # the last one was replaced
                self.join_executor("e0", 2)
            if completable := self._completable():
                self._succeed_all_on(self.running[completable[0]].executor_id)
            elif self.replacing:
                self._lose(min(self.replacing), FailureCode.EXECUTOR_WEDGED, 0.0)
            elif self.zombies:
                self._answer_zombie(next(iter(self.zombies)))
            else:
                due = self.core.next_deadline_ms()
                assert due is not None, f"{pending} stuck with nothing running or armed"
                self.now = max(self.now, due)
                self._send(ClockTicked(now_ms=self.now, stimulus_id=self.stimuli.stamp("ticked")))
        else:
            raise AssertionError("tasks did not finish")
        for record in self.tasks.values():
            assert record.finishes == (0 if record.cancelled else 1)


TestDispatchTable = DispatchTable.TestCase


class PacedDispatchTable(DispatchTable):
    """The same machine with paced queues (rule 8) at a target the clock here crosses."""

    QUEUE_MS = 5


TestPacedDispatchTable = PacedDispatchTable.TestCase
