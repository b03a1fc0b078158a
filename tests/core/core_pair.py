"""The two pure cores back to back, with a fake executor, driven by events at explicit times.

`CorePair` plays the runtime between a `SlotMachine` and a `DispatchCore` the
way h11's `ConnectionPair` plays the wire between two connections: every
command one core answers with becomes the event the other (or the fake
executor) would see, until nothing is left to do. Builders and plugins are
played by their pure parts (`call_list_calls`; a plugin that stores every
output). Time moves only through `advance`, and the executor answers only
when a test says so, so every figure a test asserts is exact.

What the pair checks on every step: both cores' invariants, that each
command carries the stimulus id of the event that caused it, and that a
task ends exactly once (`results` never gets a second result for one id).
"""

from __future__ import annotations

import collections
import itertools
import json

import attrs

from blockx.calls import (
    CallFailurePolicy,
    CallOutcome,
    FailureCode,
    RetryPolicy,
    encode_value,
)
from blockx.config import default_config
from blockx.dispatch import (
    CallDispatch,
    CallPolicy,
    CallResultsArrived,
    CallsAdded,
    CancelCalls,
    ClockTicked,
    DeliverSubcallResult,
    DispatchCore,
    DispatchEvent,
    ExecutorJoined,
    ExecutorLeft,
    FinishCallPhase,
    RevokeCalls,
    RunCalls,
    SubcallRequested,
    TaskCancelled,
    TaskOpened,
)
from blockx.phases.builders import BuildRequest, call_list_calls
from blockx.slots import (
    ActivationPrepared,
    CallsFinished,
    ConvergeTask,
    DrainDeadlinePassed,
    DrainStarted,
    Event,
    ForgetTask,
    FunctionCall,
    PhaseFinished,
    PhaseOutcome,
    PluginResult,
    PrepareTaskActivation,
    ResultHandler,
    SlotConfig,
    SlotMachine,
    StartBuilderPhase,
    StartCallPhase,
    StartPluginPhase,
    TaskPhase,
    TaskResult,
    TaskSpec,
    TaskSubmitted,
    TimerFired,
    WorkerReady,
)

EPOCH = "e1"
VALUE = encode_value("done")
"""What every call that succeeds returns."""
WINDOW = 64
CALL_DEADLINE_MS = 60_000
RETRY = RetryPolicy(max_attempts=3, base_backoff_ms=10, jitter_percent=0)


def pair_config(**changes: object) -> SlotConfig:
    """The worker's default slot-table settings, with `changes`."""
    return attrs.evolve(default_config().worker.slot_config(), **changes)  # type: ignore[arg-type]


class CorePair:
    def __init__(self, config: SlotConfig, *, executors: dict[str, int]) -> None:
        self.machine = SlotMachine(config)
        self.machine.handle(WorkerReady(now_ms=0, stimulus_id="ready"))
        self.core = DispatchCore()
        self.now_ms = 0
        self.results: dict[str, TaskResult] = {}
        self.calls_of: dict[str, int] = {}
        """How many calls each submitted task was built with."""
        self.running: dict[str, dict[tuple[str, int], CallDispatch]] = {}
        """The fake executor: attempts each executor holds and has not answered."""
        self.cancels: list[tuple[str, tuple[str, int]]] = []
        """Every (executor, attempt) the dispatch core cancelled."""
        self._stimuli = itertools.count(1)
        self._queue: collections.deque[Event | DispatchEvent] = collections.deque()
        self._specs: dict[str, TaskSpec] = {}
        self._retry: dict[str, RetryPolicy] = {}
        for executor_id, capacity in executors.items():
            self.join(executor_id, capacity=capacity)

    # ------------------------------------------------------------------ stimuli

    def submit(
        self,
        task_id: str,
        functions: list[str],
        *,
        failure_policy: CallFailurePolicy = CallFailurePolicy.FAIL_FAST,
        timeout_ms: int = 0,
    ) -> None:
        payload = json.dumps({"calls": [{"function": f, "args": []} for f in functions]})
        spec = TaskSpec(
            task_id=task_id,
            function_call=FunctionCall(type="call_list"),
            payload=payload.encode(),
            result_handler=ResultHandler(type="test"),
            call_failure_policy=failure_policy,
            call_retry_policy=RETRY,
            task_timeout_ms=timeout_ms,
        )
        self._specs[task_id] = spec
        self.calls_of[task_id] = len(functions)
        self._push(TaskSubmitted(spec=spec, slot_id=None, now_ms=self.now_ms, stimulus_id=""))

    def answer(
        self,
        call_id: str,
        *,
        fail: FailureCode | None = None,
        retryable: bool = False,
    ) -> None:
        """The executor running `call_id` answers: its value, or the failure `fail`."""
        executor_id, attempt = self._holder(call_id)
        del self.running[executor_id][(call_id, attempt)]
        if fail is None:
            outcome = CallOutcome.success(call_id=call_id, attempt=attempt, value=VALUE)
        else:
            outcome = CallOutcome.failure(
                call_id=call_id,
                attempt=attempt,
                error_code=fail,
                error_message=f"{call_id} failed",
                retryable=retryable,
            )
        self._push(
            CallResultsArrived(
                executor_id=executor_id, outcomes=(outcome,), now_ms=self.now_ms, stimulus_id=""
            )
        )

    def join(self, executor_id: str, *, capacity: int) -> None:
        self.running[executor_id] = {}
        self._push(
            ExecutorJoined(
                executor_id=executor_id, capacity=capacity, now_ms=self.now_ms, stimulus_id=""
            )
        )

    def leave(self, executor_id: str) -> None:
        del self.running[executor_id]
        self._push(
            ExecutorLeft(
                executor_id=executor_id,
                error_code=FailureCode.EXECUTOR_LOST,
                now_ms=self.now_ms,
                stimulus_id="",
            )
        )

    def advance(self, to_ms: int) -> None:
        """Time passes to `to_ms`: due timers fire, the dispatch core looks at its clock."""
        assert to_ms >= self.now_ms
        self.now_ms = to_ms
        for timer in self.machine.due_timers(to_ms):
            self._push(TimerFired(timer=timer, now_ms=to_ms, stimulus_id=""))
        self._push(ClockTicked(now_ms=to_ms, stimulus_id=""))

    def start_drain(self) -> None:
        self._push(DrainStarted(now_ms=self.now_ms, stimulus_id=""))

    def force_drain(self) -> None:
        self._push(DrainDeadlinePassed(now_ms=self.now_ms, stimulus_id=""))

    # ------------------------------------------------------------------ queries

    def running_call_ids(self) -> list[str]:
        return sorted(call_id for held in self.running.values() for call_id, _ in held)

    # --------------------------------------------------------------- the wiring

    def _holder(self, call_id: str) -> tuple[str, int]:
        for executor_id, held in self.running.items():
            for held_id, attempt in held:
                if held_id == call_id:
                    return executor_id, attempt
        raise AssertionError(f"no executor runs {call_id}")

    def _push(self, event: Event | DispatchEvent) -> None:
        """Stamp `event` and carry out everything that follows from it."""
        stamped = attrs.evolve(event, stimulus_id=f"s{next(self._stimuli)}")
        self._queue.append(stamped)
        while self._queue:
            self._handle(self._queue.popleft())

    def _handle(self, event: Event | DispatchEvent) -> None:
        if isinstance(event, _DISPATCH_EVENTS):
            step = self.core.handle(event)
            for command in step.commands:
                self._dispatch_command(command, event.stimulus_id)
        else:
            slot_step = self.machine.handle(event)
            for slot_command in slot_step.commands:
                assert slot_command.stimulus_id == event.stimulus_id
                self._slot_command(slot_command, event.stimulus_id)
        self.machine.check_invariants()
        self.core.check_invariants()

    def _then(self, event: Event | DispatchEvent) -> None:
        self._queue.append(event)

    def _slot_command(self, command: object, stimulus_id: str) -> None:
        now_ms = self.now_ms
        match command:
            case PrepareTaskActivation(task_id=task_id, slot_id=slot_id, retry_policy=retry):
                self._retry[task_id] = retry
                self._then(
                    ActivationPrepared(
                        task_id=task_id,
                        slot_id=slot_id,
                        task_code_epoch=EPOCH,
                        now_ms=now_ms,
                        stimulus_id=stimulus_id,
                    )
                )
            case StartBuilderPhase(task_id=task_id):
                calls = call_list_calls(self._request(task_id))
                outcome = PhaseOutcome(ok=True, call_count=len(calls))
                self._then(
                    PhaseFinished(
                        task_id=task_id,
                        phase=TaskPhase.BUILDER,
                        outcome=outcome,
                        now_ms=now_ms,
                        stimulus_id=stimulus_id,
                    )
                )
            case StartCallPhase(task_id=task_id):
                self._open_calls(task_id, stimulus_id)
            case StartPluginPhase(task_id=task_id, outputs=outputs):
                stored = PluginResult(plugin_type="test", ok=True, records_written=len(outputs))
                self._then(
                    PhaseFinished(
                        task_id=task_id,
                        phase=TaskPhase.PLUGIN,
                        outcome=PhaseOutcome(ok=True, plugin_results=(stored,)),
                        now_ms=now_ms,
                        stimulus_id=stimulus_id,
                    )
                )
            case ConvergeTask(task_id=task_id, result=result):
                assert task_id not in self.results, f"{task_id} ended twice"
                self.results[task_id] = result
                if task_id in self.core.task_ids():
                    self._then(
                        TaskCancelled(task_id=task_id, now_ms=now_ms, stimulus_id=stimulus_id)
                    )
            case ForgetTask():
                pass
            case _:
                raise AssertionError(f"unexpected command {command!r}")

    def _request(self, task_id: str) -> BuildRequest:
        spec = self._specs[task_id]
        return BuildRequest(
            task_id=task_id,
            function_call=spec.function_call,
            payload=spec.payload,
            task_code_epoch=EPOCH,
        )

    def _open_calls(self, task_id: str, stimulus_id: str) -> None:
        retry = self._retry[task_id]
        policy = self._specs[task_id].call_failure_policy
        calls = tuple(
            attrs.evolve(call, call_id=f"{task_id}:{call.call_id}")
            for call in call_list_calls(self._request(task_id))
        )
        call_policy = CallPolicy(
            retry=retry, failure_policy=policy, window=WINDOW, call_deadline_ms=CALL_DEADLINE_MS
        )
        now_ms = self.now_ms
        self._then(
            TaskOpened(task_id=task_id, policy=call_policy, now_ms=now_ms, stimulus_id=stimulus_id)
        )
        self._then(
            CallsAdded(
                task_id=task_id, calls=calls, sealed=True, now_ms=now_ms, stimulus_id=stimulus_id
            )
        )

    def _give_back(
        self,
        executor_id: str,
        attempts: tuple[tuple[str, int], ...],
        code: FailureCode,
        stimulus_id: str,
    ) -> None:
        """The executor drops those of `attempts` it holds and answers each with `code`."""
        held = self.running.get(executor_id, {})
        outcomes = tuple(
            CallOutcome.failure(
                call_id=call_id,
                attempt=attempt,
                error_code=code,
                error_message="given back",
                retryable=code is FailureCode.CALL_REVOKED,
            )
            for call_id, attempt in attempts
            if held.pop((call_id, attempt), None) is not None
        )
        if outcomes:
            self._then(
                CallResultsArrived(
                    executor_id=executor_id,
                    outcomes=outcomes,
                    now_ms=self.now_ms,
                    stimulus_id=stimulus_id,
                )
            )

    def _dispatch_command(self, command: object, stimulus_id: str) -> None:
        match command:
            case RunCalls(executor_id=executor_id, calls=calls):
                held = self.running[executor_id]
                for call in calls:
                    held[(call.call_id, call.attempt)] = call
            case CancelCalls(executor_id=executor_id, attempts=attempts):
                # The executor drops each attempt and says so, as a child does.
                self.cancels.extend((executor_id, attempt) for attempt in attempts)
                self._give_back(executor_id, attempts, FailureCode.CALL_CANCELLED, stimulus_id)
            case RevokeCalls(executor_id=executor_id, attempts=attempts):
                # The executor runs its oldest attempt; it gives back any other it holds.
                held = self.running.get(executor_id, {})
                oldest = next(iter(held), None)
                queued = tuple(attempt for attempt in attempts if attempt != oldest)
                self._give_back(executor_id, queued, FailureCode.CALL_REVOKED, stimulus_id)
            case FinishCallPhase(task_id=task_id, outcome=outcome):
                self._then(
                    CallsFinished(
                        task_id=task_id,
                        outcome=outcome,
                        now_ms=self.now_ms,
                        stimulus_id=stimulus_id,
                    )
                )
            case DeliverSubcallResult():
                raise AssertionError("no call of the pair makes subcalls")
            case _:
                raise AssertionError(f"unexpected command {command!r}")


_DISPATCH_EVENTS = (
    ExecutorJoined,
    ExecutorLeft,
    TaskOpened,
    CallsAdded,
    CallResultsArrived,
    SubcallRequested,
    TaskCancelled,
    ClockTicked,
)
