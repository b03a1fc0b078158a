"""The two cores back to back under random traffic: every task ends exactly once, and its
call statistics agree with how it ended.

Rules are what happens to a worker: a task is submitted, an executor answers
(a value, a failure, a retryable failure), an executor dies and another
joins, time passes, the worker drains. `CorePair` checks both cores'
invariants and "ends at most once" on every step; the invariants here check
each result, and the teardown ends the run with a forced drain, after which
every task submitted has exactly one result and neither core holds anything.
"""

from __future__ import annotations

import itertools

from hypothesis import note
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from blockx.calls import CallFailurePolicy, FailureCode
from blockx.slots import TaskPhase, TaskResult, TaskState
from tests.core.core_pair import RETRY, CorePair, pair_config

OUTCOMES = st.sampled_from(
    [
        (None, False),
        (FailureCode.CALL_RAISED, False),
        (FailureCode.CALL_RAISED_RETRYABLE, True),
    ]
)


class CoresBackToBack(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.pair = CorePair(
            pair_config(task_slots=3, task_deadline_ms=5_000), executors={"e0": 2, "e1": 1}
        )
        self.task_ids = (f"t{n}" for n in itertools.count())
        self.executor_ids = (f"e{n}" for n in itertools.count(2))
        self.submitted: list[str] = []
        self.draining = False

    @precondition(lambda self: not self.draining)
    @rule(
        calls=st.integers(min_value=1, max_value=4),
        best_effort=st.booleans(),
    )
    def submit_a_task(self, calls: int, best_effort: bool) -> None:
        if self.pair.machine.free_capacity() == 0:
            return  # a client would be told NoSlot; nothing to follow
        task_id = next(self.task_ids)
        policy = CallFailurePolicy.BEST_EFFORT if best_effort else CallFailurePolicy.FAIL_FAST
        note(f"submit {task_id}: {calls} calls, {policy.value}")
        self.pair.submit(task_id, [f"work.f{n}" for n in range(calls)], failure_policy=policy)
        self.submitted.append(task_id)

    @precondition(lambda self: bool(self.pair.running_call_ids()))
    @rule(data=st.data(), outcome=OUTCOMES)
    def an_executor_answers(
        self, data: st.DataObject, outcome: tuple[FailureCode | None, bool]
    ) -> None:
        call_id = data.draw(st.sampled_from(self.pair.running_call_ids()))
        fail, retryable = outcome
        note(f"answer {call_id}: {fail or 'value'}")
        self.pair.answer(call_id, fail=fail, retryable=retryable)

    @precondition(lambda self: len(self.pair.running) > 0)
    @rule(data=st.data())
    def an_executor_dies_and_another_joins(self, data: st.DataObject) -> None:
        gone = data.draw(st.sampled_from(sorted(self.pair.running)))
        self.pair.leave(gone)
        self.pair.join(next(self.executor_ids), capacity=2)

    @rule(by_ms=st.sampled_from([1, 10, 40, 1_000, 6_000]))
    def time_passes(self, by_ms: int) -> None:
        self.pair.advance(self.pair.now_ms + by_ms)

    @precondition(lambda self: not self.draining)
    @rule()
    def the_worker_drains(self) -> None:
        self.draining = True
        self.pair.start_drain()

    @invariant()
    def every_result_agrees_with_its_call_statistics(self) -> None:
        for task_id, result in self.pair.results.items():
            _check_result(result, self.pair.calls_of[task_id])

    @invariant()
    def the_dispatch_core_holds_no_task_that_has_ended(self) -> None:
        assert not set(self.pair.core.task_ids()) & set(self.pair.results)

    def teardown(self) -> None:
        self.pair.force_drain()
        assert sorted(self.pair.results) == sorted(self.submitted)
        assert self.pair.core.task_ids() == ()
        assert self.pair.machine.active_task_count() == 0
        for task_id, result in self.pair.results.items():
            _check_result(result, self.pair.calls_of[task_id])


def _check_result(result: TaskResult, calls: int) -> None:
    stats = result.call_stats
    assert stats.calls_retried <= calls * (RETRY.max_attempts - 1)
    assert stats.subcalls == 0
    if result.phase is TaskPhase.PLUGIN:  # the calls phase ended as it should
        assert stats.calls_total == calls
        assert stats.calls_succeeded + stats.calls_failed == calls
        assert result.output_count == stats.calls_succeeded
        assert result.state is TaskState.SUCCEEDED
        assert result.plugin_results[0].records_written == stats.calls_succeeded
        assert (stats.calls_failed > 0) == bool(result.message)
    elif result.phase is TaskPhase.CALLS and result.failure_code not in _ENDED_FROM_OUTSIDE:
        # fail fast: the first call that failed for good ended the phase
        assert result.state is TaskState.FAILED
        assert stats.calls_total == calls
        assert stats.calls_failed == 1
        assert stats.calls_succeeded + stats.calls_failed <= calls
        assert result.output_count == 0  # a failed phase hands no outputs on
    else:  # ended from outside before its calls phase could report
        assert result.state is TaskState.FAILED
        assert result.failure_code in _ENDED_FROM_OUTSIDE
        assert stats.calls_total == 0
        assert result.output_count == 0


_ENDED_FROM_OUTSIDE = frozenset({FailureCode.TIMED_OUT, FailureCode.WORKER_SHUTDOWN})

TestCoresBackToBack = CoresBackToBack.TestCase
