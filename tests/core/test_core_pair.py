"""The slot machine and the dispatch core back to back (`CorePair`): whole tasks, exact figures."""

from __future__ import annotations

from blockx.calls import CallFailurePolicy, CallStats, FailureCode
from blockx.slots import PhaseTimings, PluginResult, TaskPhase, TaskResult, TaskState
from tests.core.core_pair import EPOCH, VALUE, CorePair, pair_config


def test_a_task_runs_its_calls_on_both_executors_and_stores_every_output() -> None:
    pair = CorePair(pair_config(), executors={"e0": 2, "e1": 2})
    pair.submit("t1", ["work.a", "work.b", "work.c"])
    assert pair.running_call_ids() == ["t1:0", "t1:1", "t1:2"]
    assert {len(held) for held in pair.running.values()} == {1, 2}  # spread over both
    pair.advance(5)
    for call_id in ("t1:2", "t1:0", "t1:1"):
        pair.answer(call_id)
    assert pair.results["t1"] == TaskResult(
        task_id="t1",
        slot_id="slot-0",
        state=TaskState.SUCCEEDED,
        phase=TaskPhase.PLUGIN,
        output_count=3,
        output_bytes=3 * len(VALUE),
        plugin_results=(PluginResult(plugin_type="test", ok=True, records_written=3),),
        call_stats=CallStats(calls_total=3, calls_succeeded=3),
        timings=PhaseTimings(calls_ms=5, total_ms=5),
        task_code_epoch=EPOCH,
        accepted_at_ms=0,
        finished_at_ms=5,
    )
    assert pair.core.task_ids() == ()


def test_a_retryable_failure_runs_again_after_its_back_off_and_counts_as_a_retry() -> None:
    pair = CorePair(pair_config(), executors={"e0": 1})
    pair.submit("t1", ["work.flaky"])
    pair.advance(10)
    pair.answer("t1:0", fail=FailureCode.CALL_RAISED_RETRYABLE, retryable=True)
    assert pair.running_call_ids() == []
    pair.advance(19)
    assert pair.running_call_ids() == []  # back-off: 10 ms, no jitter
    pair.advance(20)
    assert pair.running_call_ids() == ["t1:0"]
    pair.answer("t1:0")
    result = pair.results["t1"]
    assert (result.state, result.call_stats) == (
        TaskState.SUCCEEDED,
        CallStats(calls_total=1, calls_succeeded=1, calls_retried=1),
    )
    assert result.timings == PhaseTimings(calls_ms=20, total_ms=20)


def test_fail_fast_ends_the_task_at_the_first_failure_and_cancels_its_other_calls() -> None:
    pair = CorePair(pair_config(), executors={"e0": 4})
    pair.submit("t1", ["work.a", "work.boom", "work.c"])
    pair.advance(3)
    pair.answer("t1:0")
    pair.answer("t1:1", fail=FailureCode.CALL_RAISED)
    result = pair.results["t1"]
    assert (result.state, result.phase, result.failure_code, result.retryable) == (
        TaskState.FAILED,
        TaskPhase.CALLS,
        FailureCode.CALL_RAISED,
        False,
    )
    assert result.message == "call t1:1 (work.boom) failed after 1 attempt(s): t1:1 failed"
    assert result.call_stats == CallStats(calls_total=3, calls_succeeded=1, calls_failed=1)
    assert pair.cancels == [("e0", ("t1:2", 1))]
    assert pair.running_call_ids() == []
    assert pair.core.task_ids() == ()


def test_best_effort_runs_every_call_and_names_the_first_failure() -> None:
    pair = CorePair(pair_config(), executors={"e0": 4})
    pair.submit(
        "t1", ["work.a", "work.boom", "work.c"], failure_policy=CallFailurePolicy.BEST_EFFORT
    )
    pair.answer("t1:1", fail=FailureCode.CALL_RAISED)
    pair.answer("t1:0")
    pair.answer("t1:2")
    result = pair.results["t1"]
    assert (result.state, result.phase, result.failure_code) == (
        TaskState.SUCCEEDED,
        TaskPhase.PLUGIN,
        None,
    )
    assert result.message == "1 call(s) failed; first: t1:1 work.boom CALL_RAISED: t1:1 failed"
    assert result.call_stats == CallStats(calls_total=3, calls_succeeded=2, calls_failed=1)
    assert (result.output_count, result.plugin_results[0].records_written) == (2, 2)


def test_a_task_past_its_deadline_times_out_and_its_calls_are_cancelled() -> None:
    pair = CorePair(pair_config(), executors={"e0": 2})
    pair.submit("t1", ["work.hang", "work.hang"], timeout_ms=1_000)
    pair.advance(999)
    assert "t1" not in pair.results
    pair.advance(1_000)
    result = pair.results["t1"]
    assert (result.state, result.phase, result.failure_code, result.retryable) == (
        TaskState.FAILED,
        TaskPhase.CALLS,
        FailureCode.TIMED_OUT,
        True,
    )
    assert sorted(pair.cancels) == [("e0", ("t1:0", 1)), ("e0", ("t1:1", 1))]
    assert pair.core.task_ids() == ()
    assert pair.machine.free_capacity() == pair.machine.config.task_slots


def test_a_call_whose_executor_leaves_runs_again_on_another() -> None:
    pair = CorePair(pair_config(), executors={"e0": 1})
    pair.submit("t1", ["work.a"])
    pair.join("e1", capacity=1)
    pair.advance(7)
    pair.leave("e0")
    assert pair.running_call_ids() == []  # the retry waits out its back-off
    pair.advance(17)
    assert [list(held) for held in pair.running.values()] == [[("t1:0", 2)]]
    assert "e1" in pair.running
    pair.answer("t1:0")
    assert pair.results["t1"].call_stats == CallStats(
        calls_total=1, calls_succeeded=1, calls_retried=1
    )


def test_the_drain_deadline_ends_every_live_task_once() -> None:
    pair = CorePair(pair_config(), executors={"e0": 1})
    pair.submit("t1", ["work.hang"])
    pair.submit("t2", ["work.queued"])
    pair.start_drain()
    pair.advance(50)
    pair.force_drain()
    assert {task_id: result.failure_code for task_id, result in pair.results.items()} == {
        "t1": FailureCode.WORKER_SHUTDOWN,
        "t2": FailureCode.WORKER_SHUTDOWN,
    }
    assert pair.core.task_ids() == ()
    assert pair.machine.active_task_count() == 0
