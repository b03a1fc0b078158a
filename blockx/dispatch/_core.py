"""The call-dispatch core: which call runs where and when, and what a failure means.

Theory of operation
-------------------
One mutator, `handle(event) -> Step`; every event carries the id of the
stimulus behind it and the core keeps a bounded log of recent ones. Tasks
open with a `CallPolicy` and receive calls (possibly in several batches,
the last one `sealed`). Executors join with a capacity: how many calls may be
queued on them at once, which keeps their pipe full.

1. Fairness: tasks with dispatchable calls sit in a round-robin ring; each turn
   dispatches one call of the task at the front, so no task starves while
   others progress. A task never has more than `window` top-level calls
   running. Each call goes to an executor that has nothing, else to the one
   with the most room.
2. Retries: a retryable failure with attempts left waits
   `base * 2**(attempt-1)` plus up to `jitter_percent` of that (scaled by the
   event's `draw`) and runs again, ahead of the task's fresh calls. A call
   ends exactly once: succeeded, or failed for good. An attempt that was
   running when its executor left or its deadline passed may have had
   effects: it runs again (at least once) unless the task's retry policy is
   `at_most_once`, which fails the call with that code.
3. Failure policy: fail fast ends the calls phase at the first call that
   failed for good and cancels the task's other calls; best effort runs every
   call and reports the failures.
4. Subcalls: a running call may ask for a call and wait. Its executor gets one
   extra unit of room per outstanding subcall (it runs calls nested while it
   waits) that only subcalls may use, and subcalls go ahead of the task's
   window, so calls waiting on subcalls never starve the subcalls they wait
   for, however deep the chain.
5. Cancellation: a cancelled or finished task's running calls are cancelled on
   their executors; nothing of that task is ever dispatched again. An
   executor holding a cancelled call (a zombie: no answer yet) gets no new
   call of any task, and the calls queued on it are taken back at once
   (rule 7's revocation), so no task waits behind a call that should stop.
   One that still holds it `cancel_grace_ms` later is replaced
   (`ReplaceExecutor`): its calls then fail as its leaving says. A call whose
   executor leaves or whose deadline passes fails retryably, and its
   outstanding subcalls are abandoned.
6. Pure: no clock, no randomness, no IO. Time and draws come in on events.
7. Idle executors take queued calls back: an executor runs its calls in the
   order it got them, so all but the oldest of an executor's calls may still
   be queued behind a long one. Whenever an executor has nothing at all, the
   newest half of the queued top-level calls of the executor holding the most
   is revoked; an executor gives back what has not started (CALL_REVOKED, the
   attempt does not count) and those calls run next, on the idle one. What
   had started runs on. So no queued call waits behind another while an
   executor is idle, and pipelining stays deep for short calls.
8. Paced queues (when the core is made with `queue_ms`): an executor's queue
   holds as many calls as it runs in `queue_ms` at the pace its results came
   back at (time between two of its result events while it was busy, over the
   attempts they ended, averaged with the pace before), at least 2 and at
   most its capacity; 64 until a pace is known, and again once it has been
   idle longer than `queue_ms`. Short calls travel in deep batches, while a
   call of another task never waits behind more than about `queue_ms` of
   queued work.
"""

from __future__ import annotations

import collections
import heapq
import itertools
from collections.abc import Iterable
from typing import Final, TypeAlias, assert_never

import attrs

from blockx.calls import (
    CallFailure,
    CallOutcome,
    CallPhaseOutcome,
    CallSpec,
    CallStats,
    FailureCode,
)
from blockx.dispatch._commands import (
    CallDispatch,
    CancelCalls,
    DeliverSubcallResult,
    DispatchCommand,
    FinishCallPhase,
    ReplaceExecutor,
    RevokeCalls,
    RunCalls,
)
from blockx.dispatch._events import (
    CallResultsArrived,
    CallsAdded,
    ClockTicked,
    DispatchEvent,
    ExecutorJoined,
    ExecutorLeft,
    SubcallRequested,
    TaskCancelled,
    TaskOpened,
)
from blockx.dispatch._model import CallPolicy
from blockx.errors import Misuse
from blockx.steps import LoggedStimulus, StimulusLog
from blockx.steps import Step as CoreStep

Step: TypeAlias = CoreStep[None, DispatchCommand]
"""For annotations; steps are made with `CoreStep(...)`: calling the parameterized alias
costs a failed attribute write on the frozen instance per step."""
"""What one event produced: commands for the dispatcher actor (a core has no reply)."""


_UNPACED_DEPTH: Final = 64
"""Calls an executor's queue holds before its pace is known (rule 8)."""
_MIN_DEPTH: Final = 2
"""The least a paced queue holds: one call running, one waiting to."""


@attrs.define(eq=False)
class _Call:
    spec: CallSpec
    call_id: str  # the core's id: the spec's, after the batch's `id_prefix`
    task_id: str
    index: int  # position among the task's calls; -1 for a subcall
    parent: _Call | None = None
    attempts: int = 0
    executor_id: str | None = None  # set while an attempt runs
    deadline_ms: int = 0
    ended: bool = False
    waiting_on: int = 0  # outstanding subcalls of the running attempt
    children: list[_Call] = attrs.Factory(list)
    revoking: bool = False  # asked back from its executor, no answer yet
    revoked: int = 0  # attempts given back: they do not count against the retry policy

    @property
    def tries(self) -> int:
        """Attempts that count: those that ran, or may have."""
        return self.attempts - self.revoked


@attrs.define(eq=False)
class _Task:
    task_id: str
    policy: CallPolicy
    ready: collections.deque[_Call] = attrs.Factory(collections.deque)
    sub_ready: collections.deque[_Call] = attrs.Factory(collections.deque)
    calls: dict[str, _Call] = attrs.Factory(dict)
    running_top: int = 0
    total: int = 0
    ended_top: int = 0
    sealed: bool = False
    in_ring: bool = False
    outputs: dict[int, bytes] = attrs.Factory(dict)
    failures: list[CallFailure] = attrs.Factory(list)
    succeeded: int = 0
    retried: int = 0
    subcalls: int = 0


@attrs.define(eq=False)
class _Executor:
    executor_id: str
    capacity: int
    running: dict[str, _Call] = attrs.Factory(dict)
    # Cancelled (call id, attempt) pairs whose answer has not been seen: they
    # still occupy the executor until it answers or leaves.
    zombies: set[tuple[str, int]] = attrs.Factory(set)
    zombie_since_ms: int | None = None  # since when it has had a zombie without a break
    replacing: bool = False  # ReplaceExecutor was sent: it is on its way out
    waiting: int = 0  # outstanding subcalls of its running calls
    leaving: bool = False
    depth: int = 0  # calls its queue may hold now: its capacity, or its paced depth (rule 8)
    pace_us: float | None = None  # time per attempt ended, while busy (rule 8)
    busy_since_ms: int | None = None  # its last result event while busy, or its start
    idle_since_ms: int | None = None

    def room(self) -> int:
        """Room for fresh calls and retries: none while it holds a cancelled call (rule 5)."""
        if self.zombies or self.replacing:
            return 0
        return self.depth - len(self.running)

    def subcall_room(self) -> int:
        """Room for subcalls: one more unit per subcall its calls wait for."""
        if self.zombies or self.replacing:
            return 0
        return self.room() + self.waiting


@attrs.define
class _Room:
    """The room executors have during one `_pump`: plain (fresh calls and retries),
    for subcalls, and which executors have nothing at all."""

    plain: dict[str, int]
    subcall: dict[str, int]
    idle: dict[str, None]  # served first, in the executors' order (a set would hash)

    @classmethod
    def of(cls, executors: dict[str, _Executor]) -> _Room:
        plain = {e: room for e, x in executors.items() if (room := x.room()) > 0}
        subcall = {e: room for e, x in executors.items() if (room := x.subcall_room()) > 0}
        return cls(plain, subcall, dict.fromkeys(e for e in plain if not executors[e].running))

    def fresh_choice(self) -> str:
        """Where a fresh call goes: an executor with nothing, else the most plain room."""
        return max(self.idle or self.plain, key=self.plain.__getitem__)

    def take(self, executor_id: str) -> None:
        """One call was placed on `executor_id`: one unit less of each room it had."""
        for pool in (self.plain, self.subcall):
            if executor_id in pool:
                pool[executor_id] -= 1
                if not pool[executor_id]:
                    del pool[executor_id]
        self.idle.pop(executor_id, None)


class DispatchCore:
    """Runs the calls of many tasks on many executors. See the module docstring."""

    def __init__(self, *, cancel_grace_ms: int = 2_000, queue_ms: int | None = None) -> None:
        """`queue_ms`: pace executors' queues (rule 8); None: each holds its capacity."""
        if queue_ms is not None and queue_ms < 1:
            raise Misuse(what=f"queue_ms must be >= 1, got {queue_ms}")
        self._cancel_grace_ms = cancel_grace_ms
        self._queue_ms = queue_ms
        self._tasks: dict[str, _Task] = {}
        self._executors: dict[str, _Executor] = {}
        self._ring: collections.deque[_Task] = collections.deque()
        self._seq = itertools.count()
        self._backoffs: list[tuple[int, int, _Call]] = []
        self._deadlines: list[tuple[int, int, _Call, int]] = []
        # Call ids of open tasks: executors answer by id, so ids are unique
        # across every task the core knows.
        self._call_owner: dict[str, str] = {}
        self._log = StimulusLog()

    # ---------------------------------------------------------------- queries

    @property
    def recent_stimuli(self) -> tuple[LoggedStimulus, ...]:
        """The last events handled, oldest first, with what came of each."""
        return self._log.recent

    def task_ids(self) -> tuple[str, ...]:
        return tuple(self._tasks)

    def executor_ids(self) -> tuple[str, ...]:
        return tuple(self._executors)

    def running_calls(self, executor_id: str) -> tuple[str, ...]:
        return tuple(self._executors[executor_id].running)

    def executor_depth(self, executor_id: str) -> int:
        """Calls `executor_id`'s queue may hold now: its capacity, or as paced (rule 8)."""
        return self._executors[executor_id].depth

    def next_deadline_ms(self) -> int | None:
        """When a back-off ends or a call deadline passes next (None: nothing armed)."""
        while self._backoffs and self._backoffs[0][2].ended:
            heapq.heappop(self._backoffs)
        while self._deadlines and not self._deadline_current(self._deadlines[0]):
            heapq.heappop(self._deadlines)
        dues = [heap[0][0] for heap in (self._backoffs, self._deadlines) if heap]
        dues.extend(
            since + self._cancel_grace_ms
            for executor in self._executors.values()
            if (since := executor.zombie_since_ms) is not None and not executor.replacing
        )
        return min(dues, default=None)

    # ---------------------------------------------------------------- mutator

    def handle(self, event: DispatchEvent) -> Step:
        """Apply one event. Raises `Misuse` (state unchanged) on an event it never allows."""
        return self._log.apply(event, self._dispatch)

    def _dispatch(self, event: DispatchEvent) -> Step:
        commands: list[DispatchCommand] = []
        match event:
            case ExecutorJoined():
                if event.executor_id in self._executors or event.capacity < 1:
                    raise Misuse(what=f"cannot join {event!r}")
                executor = _Executor(executor_id=event.executor_id, capacity=event.capacity)
                self._unpace(executor)
                self._executors[event.executor_id] = executor
            case ExecutorLeft():
                self._on_executor_left(event, commands)
            case TaskOpened():
                if event.task_id in self._tasks:
                    raise Misuse(what=f"task {event.task_id!r} is already open")
                self._tasks[event.task_id] = _Task(task_id=event.task_id, policy=event.policy)
            case CallsAdded():
                self._on_calls_added(event, commands)
            case CallResultsArrived():
                self._on_results(event, commands)
            case SubcallRequested():
                self._on_subcall(event, commands)
            case TaskCancelled():
                task = self._tasks.get(event.task_id)
                if task is not None:
                    self._end_task(task, commands)
            case ClockTicked():
                self._on_tick(event, commands)
            case _:
                assert_never(event)
        self._pump(event.now_ms, commands)
        self._steal(commands)
        self._watch_zombies(event.now_ms, commands)
        return CoreStep(commands=tuple(commands))

    # ----------------------------------------------------------------- events

    def _on_calls_added(self, event: CallsAdded, commands: list[DispatchCommand]) -> None:
        task = self._tasks.get(event.task_id)
        if task is None or task.sealed:
            raise Misuse(what=f"calls added to a closed or unknown task {event.task_id!r}")
        prefix = event.id_prefix
        call_ids = [prefix + spec.call_id for spec in event.calls]
        if len(set(call_ids)) < len(call_ids) or not self._call_owner.keys().isdisjoint(call_ids):
            # All checked before any is queued.
            raise Misuse(what=f"call id {self._repeated(call_ids)!r} used twice")
        for spec, call_id in zip(event.calls, call_ids, strict=True):
            call = _Call(spec, call_id, task.task_id, task.total)  # positional: cheaper
            task.total += 1
            task.calls[call_id] = call
            self._call_owner[call_id] = task.task_id
            task.ready.append(call)
        task.sealed = event.sealed
        self._ring_in(task)
        self._maybe_finish(task, commands)

    def _unpace(self, executor: _Executor) -> None:
        """Forget `executor`'s pace: its queue holds what it may before one is known."""
        executor.pace_us = None
        if self._queue_ms is None:
            executor.depth = executor.capacity
        else:
            executor.depth = min(executor.capacity, _UNPACED_DEPTH)

    def _pace(self, executor: _Executor, ended: int, now_ms: int) -> None:
        """Rule 8: `ended` attempts of `executor` ended at `now_ms`; its depth follows."""
        assert self._queue_ms is not None
        since = executor.busy_since_ms
        if ended > 0 and since is not None:
            sample = (now_ms - since) * 1000 / ended
            pace = sample if executor.pace_us is None else (executor.pace_us + sample) / 2
            executor.pace_us = pace
            paced = int(self._queue_ms * 1000 / max(pace, 1.0))
            executor.depth = min(executor.capacity, max(_MIN_DEPTH, paced))
        if executor.running:
            executor.busy_since_ms = now_ms
        else:
            executor.busy_since_ms, executor.idle_since_ms = None, now_ms

    def _repeated(self, call_ids: list[str]) -> str:
        """The first of `call_ids` that is another call's, or earlier in the list."""
        seen: set[str] = set()
        for call_id in call_ids:
            if call_id in seen or call_id in self._call_owner:
                return call_id
            seen.add(call_id)
        raise AssertionError("no id repeats")

    def _on_results(self, event: CallResultsArrived, commands: list[DispatchCommand]) -> None:
        executor = self._executors.get(event.executor_id)
        if executor is None:
            return  # answers of an executor that has since left
        self._book_results(executor, event, commands)
        if self._queue_ms is not None:
            revoked = sum(o.error_code is FailureCode.CALL_REVOKED for o in event.outcomes)
            self._pace(executor, len(event.succeeded) + len(event.outcomes) - revoked, event.now_ms)

    def _book_results(
        self, executor: _Executor, event: CallResultsArrived, commands: list[DispatchCommand]
    ) -> None:
        zombies, running = executor.zombies, executor.running
        for call_id, number, value in event.succeeded:
            if zombies and (call_id, number) in zombies:
                zombies.discard((call_id, number))
                continue
            call = running.get(call_id)
            if call is not None and call.attempts == number:
                self._take_off(call, commands)
                self._succeed(call, value, commands)
        for outcome in event.outcomes:
            attempt = (outcome.call_id, outcome.attempt)
            if attempt in executor.zombies:
                executor.zombies.discard(attempt)
                continue
            call = executor.running.get(outcome.call_id)
            if call is None or call.attempts != outcome.attempt:
                continue
            if call.revoking and outcome.error_code is FailureCode.CALL_REVOKED:
                self._take_off(call, commands)
                call.revoked += 1
                self._requeue(self._tasks[call.task_id], call)
                continue
            self._take_off(call, commands)
            if outcome.error_code is None:
                self._succeed(call, outcome.value, commands)
            else:
                self._attempt_failed(
                    call,
                    error_code=outcome.error_code,
                    message=outcome.error_message,
                    retryable=outcome.retryable,
                    now_ms=event.now_ms,
                    draw=event.draw,
                    commands=commands,
                )

    def _on_subcall(self, event: SubcallRequested, commands: list[DispatchCommand]) -> None:
        executor = self._executors.get(event.executor_id)
        parent = None if executor is None else executor.running.get(event.parent_call_id)
        if parent is not None and parent.attempts != event.parent_attempt:
            parent = None
        if executor is None or parent is None:
            # The parent attempt is gone (cancelled, timed out): unblock it if
            # its executor is still there, and run nothing.
            if executor is not None:
                refused = CallOutcome.failure(
                    call_id=event.subcall.call_id,
                    attempt=0,
                    error_code=FailureCode.CALL_RAISED,
                    error_message="the calling attempt was cancelled",
                    retryable=False,
                )
                commands.append(
                    DeliverSubcallResult(
                        executor_id=executor.executor_id,
                        parent_call_id=event.parent_call_id,
                        parent_attempt=event.parent_attempt,
                        outcome=refused,
                    )
                )
            return
        task = self._tasks[parent.task_id]
        if event.subcall.call_id in self._call_owner:
            raise Misuse(what=f"call id {event.subcall.call_id!r} used twice")
        child = _Call(
            spec=event.subcall,
            call_id=event.subcall.call_id,
            task_id=task.task_id,
            index=-1,
            parent=parent,
        )
        task.calls[child.call_id] = child
        self._call_owner[child.call_id] = task.task_id
        task.sub_ready.append(child)
        task.subcalls += 1
        parent.children.append(child)
        parent.waiting_on += 1
        executor.waiting += 1
        self._ring_in(task)

    def _on_executor_left(self, event: ExecutorLeft, commands: list[DispatchCommand]) -> None:
        executor = self._executors.get(event.executor_id)
        if executor is None:
            return
        executor.leaving = True
        for call in list(executor.running.values()):
            if call.executor_id != executor.executor_id:
                continue  # a subcall abandoned with its parent just before
            self._take_off(call, commands)
            self._attempt_failed(
                call,
                error_code=event.error_code,
                message=f"executor {event.executor_id} left during the call",
                retryable=True,
                may_have_run=True,
                now_ms=event.now_ms,
                draw=event.draw,
                commands=commands,
            )
        del self._executors[event.executor_id]

    def _on_tick(self, event: ClockTicked, commands: list[DispatchCommand]) -> None:
        now_ms = event.now_ms
        while self._backoffs and self._backoffs[0][0] <= now_ms:
            _, _, call = heapq.heappop(self._backoffs)
            if not call.ended:
                task = self._tasks[call.task_id]
                self._requeue(task, call)
        while self._deadlines and self._deadlines[0][0] <= now_ms:
            entry = heapq.heappop(self._deadlines)
            if not self._deadline_current(entry):
                continue
            call = entry[2]
            self._cancel(call, commands)
            self._attempt_failed(
                call,
                error_code=FailureCode.DEADLINE_EXCEEDED,
                message=f"call deadline {call.deadline_ms} ms passed",
                retryable=True,
                may_have_run=True,
                now_ms=now_ms,
                draw=event.draw,
                commands=commands,
            )

    # ----------------------------------------------------------- call endings

    def _take_off(self, call: _Call, commands: list[DispatchCommand]) -> None:
        """Remove a running attempt from its executor; abandon its subcalls."""
        assert call.executor_id is not None
        executor = self._executors[call.executor_id]
        del executor.running[call.call_id]
        executor.waiting -= call.waiting_on
        call.waiting_on = 0
        call.executor_id = None
        call.revoking = False
        if call.parent is None:
            self._tasks[call.task_id].running_top -= 1
        for child in call.children:
            self._abandon(child, commands)
        call.children.clear()

    def _cancel(self, call: _Call, commands: list[DispatchCommand]) -> None:
        """Take a running attempt off its executor and tell the executor to stop it."""
        assert call.executor_id is not None
        executor = self._executors[call.executor_id]
        attempt = (call.call_id, call.attempts)
        self._take_off(call, commands)
        if not executor.leaving:
            executor.zombies.add(attempt)
            commands.append(CancelCalls(executor_id=executor.executor_id, attempts=(attempt,)))

    def _abandon(self, call: _Call, commands: list[DispatchCommand]) -> None:
        """End a call silently (its result is no longer wanted)."""
        if call.ended:
            return
        if call.executor_id is not None:
            self._cancel(call, commands)
        call.ended = True

    def _succeed(self, call: _Call, value: bytes, commands: list[DispatchCommand]) -> None:
        call.ended = True
        task = self._tasks[call.task_id]
        if call.parent is not None:
            succeeded = CallOutcome.success(
                call_id=call.call_id, attempt=call.attempts, value=value
            )
            self._deliver(call, succeeded, commands)
            return
        task.outputs[call.index] = value
        task.succeeded += 1
        task.ended_top += 1
        self._forget(task, call)
        self._ring_in(task)
        self._maybe_finish(task, commands)

    def _attempt_failed(
        self,
        call: _Call,
        *,
        error_code: FailureCode,
        message: str,
        retryable: bool,
        now_ms: int,
        draw: float,
        commands: list[DispatchCommand],
        may_have_run: bool = False,
    ) -> None:
        """`may_have_run`: the attempt was running when the core gave up on it (its
        executor left, its deadline passed), so it may have had effects."""
        task = self._tasks[call.task_id]
        policy = task.policy
        if may_have_run and policy.retry.at_most_once:
            retryable = False
            message += "; not run again: the task's retry policy is at most once"
        if retryable and call.tries < policy.retry.max_attempts:
            self._retry_later(task, call, now_ms, policy.retry.backoff_ms(call.tries, draw))
            return
        call.ended = True
        if call.parent is not None:
            failed = CallOutcome.failure(
                call_id=call.call_id,
                attempt=call.attempts,
                error_code=error_code,
                error_message=message,
                retryable=retryable,
            )
            self._deliver(call, failed, commands)
            return
        task.failures.append(
            CallFailure(
                call_id=call.call_id,
                function=call.spec.function,
                attempts=call.tries,
                error_code=error_code,
                error_message=message,
            )
        )
        task.ended_top += 1
        self._forget(task, call)
        if policy.fail_fast:
            outcome = CallPhaseOutcome(
                ok=False,
                failure_code=error_code,
                message=f"call {call.call_id} ({call.spec.function}) failed after "
                f"{call.tries} attempt(s): {message}",
                retryable=retryable,
                stats=self._stats(task),
            )
            self._end_task(task, commands)
            commands.append(FinishCallPhase(task_id=task.task_id, outcome=outcome))
            return
        self._ring_in(task)
        self._maybe_finish(task, commands)

    def _retry_later(self, task: _Task, call: _Call, now_ms: int, backoff_ms: int) -> None:
        task.retried += 1
        due_ms = now_ms + backoff_ms
        if due_ms <= now_ms:
            self._requeue(task, call)
        else:
            heapq.heappush(self._backoffs, (due_ms, next(self._seq), call))
            self._ring_in(task)  # the window may have room for other calls now

    def _forget(self, task: _Task, call: _Call) -> None:
        """A top-level call ended: drop it (and its arguments), so a task streaming many
        calls holds only those not yet ended; its id may be used again."""
        del task.calls[call.call_id]
        del self._call_owner[call.call_id]

    def _requeue(self, task: _Task, call: _Call) -> None:
        """A retry runs ahead of the task's fresh calls."""
        (task.ready if call.parent is None else task.sub_ready).appendleft(call)
        self._ring_in(task)

    def _deliver(self, call: _Call, outcome: CallOutcome, commands: list[DispatchCommand]) -> None:
        """Hand a subcall's final outcome to the attempt waiting for it."""
        parent = call.parent
        assert parent is not None
        if parent.executor_id is None or call not in parent.children:
            return
        parent.children.remove(call)
        parent.waiting_on -= 1
        self._executors[parent.executor_id].waiting -= 1
        commands.append(
            DeliverSubcallResult(
                executor_id=parent.executor_id,
                parent_call_id=parent.call_id,
                parent_attempt=parent.attempts,
                outcome=outcome,
            )
        )

    def _maybe_finish(self, task: _Task, commands: list[DispatchCommand]) -> None:
        if not task.sealed or task.ended_top < task.total:
            return
        outputs = tuple(task.outputs[index] for index in sorted(task.outputs))
        message = ""
        if task.failures:
            first = task.failures[0]
            message = (
                f"{len(task.failures)} call(s) failed; first: {first.call_id} "
                f"{first.function} {first.error_code}: {first.error_message}"
            )
        outcome = CallPhaseOutcome(
            ok=True,
            message=message,
            stats=self._stats(task),
            outputs=outputs,
            failures=tuple(task.failures),
        )
        self._end_task(task, commands)
        commands.append(FinishCallPhase(task_id=task.task_id, outcome=outcome))

    def _end_task(self, task: _Task, commands: list[DispatchCommand]) -> None:
        """Forget the task; cancel whatever of it still runs."""
        running = [c for c in task.calls.values() if not c.ended and c.executor_id is not None]
        for call in task.calls.values():
            call.ended = True  # first, so that taking calls off abandons nothing twice
        cancels: dict[str, list[tuple[str, int]]] = {}
        for call in running:
            assert call.executor_id is not None
            executor = self._executors[call.executor_id]
            attempt = (call.call_id, call.attempts)
            self._take_off(call, commands)
            if not executor.leaving:
                executor.zombies.add(attempt)
                cancels.setdefault(executor.executor_id, []).append(attempt)
        commands.extend(
            CancelCalls(executor_id=executor_id, attempts=tuple(attempts))
            for executor_id, attempts in cancels.items()
        )
        for call_id in task.calls:
            del self._call_owner[call_id]
        del self._tasks[task.task_id]

    @staticmethod
    def _stats(task: _Task) -> CallStats:
        return CallStats(
            calls_total=task.total,
            calls_succeeded=task.succeeded,
            calls_failed=len(task.failures),
            calls_retried=task.retried,
            subcalls=task.subcalls,
        )

    # ------------------------------------------------------------- dispatching

    def _ring_in(self, task: _Task) -> None:
        if not task.in_ring and task.task_id in self._tasks and self._dispatchable(task):
            task.in_ring = True
            self._ring.append(task)

    @staticmethod
    def _dispatchable(task: _Task) -> bool:
        return bool(task.sub_ready) or (bool(task.ready) and task.running_top < task.policy.window)

    @staticmethod
    def _next_subcall(task: _Task) -> _Call | None:
        while task.sub_ready:
            call = task.sub_ready.popleft()
            if not call.ended:
                return call
        return None

    @staticmethod
    def _wants_fresh_room(task: _Task) -> bool:
        while task.ready and task.ready[0].ended:
            task.ready.popleft()
        return bool(task.ready) and task.running_top < task.policy.window

    def _pump(self, now_ms: int, commands: list[DispatchCommand]) -> None:
        """Dispatch round-robin over tasks while executors have room.

        Fresh calls and retries need an executor's plain room; subcalls may
        also use the extra room of executors whose calls wait on subcalls, and
        nothing else may take that room.
        """
        if self._queue_ms is not None:
            for executor in self._executors.values():
                idle = executor.idle_since_ms
                if not executor.running and idle is not None and now_ms - idle > self._queue_ms:
                    self._unpace(executor)  # its pace is stale (rule 8)
                    executor.idle_since_ms = None
        if not self._ring:
            return
        room = _Room.of(self._executors)
        batches: dict[str, list[CallDispatch]] = {}
        deferred: list[_Task] = []  # fresh work waiting for plain room only
        while self._ring and room.subcall:
            task = self._ring.popleft()
            if task.task_id not in self._tasks:
                continue
            call = self._next_subcall(task)
            if call is not None:
                executor_id = max(room.subcall, key=room.subcall.__getitem__)
                room.take(executor_id)
                self._start(call, self._executors[executor_id], now_ms, task, batches)
            elif not self._wants_fresh_room(task):
                task.in_ring = False
                continue
            elif not room.plain:
                deferred.append(task)
                continue
            elif not self._ring:
                # The lone task in the ring: its turns follow one another, so they are
                # taken in one go (the same calls on the same executors, far cheaper).
                self._fill(task, room, now_ms, batches)
            else:
                executor_id = room.fresh_choice()
                room.take(executor_id)
                self._start(
                    task.ready.popleft(), self._executors[executor_id], now_ms, task, batches
                )
            if self._dispatchable(task):
                self._ring.append(task)
            else:
                task.in_ring = False
        self._ring.extendleft(reversed(deferred))
        commands.extend(
            RunCalls(executor_id=executor_id, calls=tuple(calls))
            for executor_id, calls in batches.items()
        )

    def _fill(
        self, task: _Task, room: _Room, now_ms: int, batches: dict[str, list[CallDispatch]]
    ) -> None:
        """Turn after turn of `task`, alone in the ring, each placing one fresh call as
        `_pump` would, until its window, its calls or the room run out."""
        ready, window = task.ready, task.policy.window
        while room.plain and ready and task.running_top < window:
            call = ready.popleft()
            if call.ended:
                continue
            executor_id = room.fresh_choice()
            room.take(executor_id)
            self._start(call, self._executors[executor_id], now_ms, task, batches)

    def _steal(self, commands: list[DispatchCommand]) -> None:
        """Revoke queued calls for each executor that has nothing (rule 7)."""
        for executor in self._executors.values():
            if executor.running or executor.zombies or executor.leaving:
                continue
            queued = max(
                (self._stealable(victim) for victim in self._executors.values()),
                key=len,
                default=[],
            )
            if not queued:
                return
            taken = queued[len(queued) // 2 :][-executor.capacity :]
            assert taken[0].executor_id is not None
            self._revoke(taken[0].executor_id, taken, commands)

    def _watch_zombies(self, now_ms: int, commands: list[DispatchCommand]) -> None:
        """Executors holding cancelled calls (rule 5): take back what is queued on them at
        once; replace one that has held a cancelled call for `cancel_grace_ms`."""
        for executor in self._executors.values():
            if not executor.zombies:
                executor.zombie_since_ms = None
                continue
            if executor.zombie_since_ms is None:
                executor.zombie_since_ms = now_ms
            queued = self._revocable(executor.running.values())
            if queued and not executor.replacing:
                self._revoke(executor.executor_id, queued, commands)
            if (
                not executor.replacing
                and now_ms >= executor.zombie_since_ms + self._cancel_grace_ms
            ):
                executor.replacing = True
                commands.append(
                    ReplaceExecutor(
                        executor_id=executor.executor_id,
                        why=f"it held a cancelled call for {now_ms - executor.zombie_since_ms} ms "
                        f"(the cancel grace is {self._cancel_grace_ms} ms)",
                    )
                )

    @staticmethod
    def _stealable(executor: _Executor) -> list[_Call]:
        """Its top-level calls that may still be queued, oldest first: all but its oldest
        (which it runs, or has run), neither waiting on subcalls nor being revoked."""
        return DispatchCore._revocable(list(executor.running.values())[1:])

    @staticmethod
    def _revocable(calls: Iterable[_Call]) -> list[_Call]:
        """Those of `calls` an executor may give back: top-level, not waiting on subcalls
        (so not started), not being revoked already."""
        return [c for c in calls if c.parent is None and not c.revoking and not c.waiting_on]

    @staticmethod
    def _revoke(executor_id: str, calls: list[_Call], commands: list[DispatchCommand]) -> None:
        """Ask `executor_id` to give `calls` back (those it has not started)."""
        for call in calls:
            call.revoking = True
        commands.append(
            RevokeCalls(
                executor_id=executor_id,
                attempts=tuple((call.call_id, call.attempts) for call in calls),
            )
        )

    def _start(
        self,
        call: _Call,
        executor: _Executor,
        now_ms: int,
        task: _Task,
        batches: dict[str, list[CallDispatch]],
    ) -> None:
        if not executor.running and executor.busy_since_ms is None:
            executor.busy_since_ms = now_ms  # busy from now on (rule 8)
        call.attempts += 1
        call.executor_id = executor.executor_id
        call.deadline_ms = now_ms + task.policy.call_deadline_ms
        executor.running[call.call_id] = call
        if call.parent is None:
            task.running_top += 1
        heapq.heappush(self._deadlines, (call.deadline_ms, next(self._seq), call, call.attempts))
        batches.setdefault(executor.executor_id, []).append(
            CallDispatch(
                call_id=call.call_id,
                task_id=call.task_id,
                function=call.spec.function,
                args=call.spec.args,
                attempt=call.attempts,
                deadline_ms=call.deadline_ms,
            )
        )

    @staticmethod
    def _deadline_current(entry: tuple[int, int, _Call, int]) -> bool:
        _, _, call, attempt = entry
        return not call.ended and call.executor_id is not None and call.attempts == attempt

    # -------------------------------------------------------------- invariants

    def calls_ended(self, task_id: str) -> int:
        """How many of the task's top-level calls have ended (0 once the task is gone)."""
        task = self._tasks.get(task_id)
        return 0 if task is None else task.ended_top

    def check_invariants(self) -> None:
        """Raise AssertionError if any rule of the module docstring is broken."""
        placed: dict[str, str] = {}
        for executor_id, executor in self._executors.items():
            live = {(call_id, call.attempts) for call_id, call in executor.running.items()}
            assert not (live & executor.zombies)
            assert executor.waiting == sum(c.waiting_on for c in executor.running.values())
            # Room may be negative through cancellation (zombies outstay the subcall
            # room they were dispatched into) or a depth paced down (rule 8) below
            # what was queued; _pump never overfills.
            assert not executor.leaving
            assert 1 <= executor.depth <= executor.capacity
            if self._queue_ms is None:
                assert executor.depth == executor.capacity
            for call_id, call in executor.running.items():
                assert call.executor_id == executor_id
                assert not call.ended
                assert call.task_id in self._tasks
                assert call_id not in placed, f"{call_id} runs on two executors"
                placed[call_id] = executor_id
        for task in self._tasks.values():
            top_running = 0
            for call in task.calls.values():
                assert call.tries <= task.policy.retry.max_attempts
                assert not call.revoking or call.executor_id is not None
                if call.executor_id is not None:
                    assert placed.get(call.call_id) == call.executor_id
                    top_running += call.parent is None
                if call.ended:
                    assert call.executor_id is None
            assert task.running_top == top_running
            assert task.running_top <= task.policy.window
            assert task.ended_top <= task.total
        # Work-conserving: no runnable call waits while room for it is idle.
        executors = self._executors.values()
        plain_room = any(executor.room() > 0 for executor in executors)
        subcall_room = any(executor.subcall_room() > 0 for executor in executors)
        for task in self._tasks.values():
            waiting = [c for c in (*task.ready, *task.sub_ready) if not c.ended]
            if subcall_room and any(c.parent is not None for c in waiting):
                raise AssertionError(f"{task.task_id} has a subcall waiting and room is idle")
            fresh = [c for c in waiting if c.parent is None]
            if plain_room and fresh and task.running_top < task.policy.window:
                raise AssertionError(f"{task.task_id} has runnable calls and room is idle")
        owners = {call_id: t.task_id for t in self._tasks.values() for call_id in t.calls}
        assert owners == self._call_owner
        # Rule 7: while an executor has nothing, queued calls are being taken back.
        if any(not e.running and not e.zombies for e in executors):
            revoking = any(c.revoking for e in executors for c in e.running.values())
            stealable = [e.executor_id for e in executors if self._stealable(e)]
            assert revoking or not stealable, f"{stealable} keep queued calls from an idle one"
