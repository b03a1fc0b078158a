"""Retained results bounded in bytes: the size of a result, eviction oldest first, the
newest kept even alone past the bound, and the "evicted" answer until the evicted
result's retention would have ended."""

from __future__ import annotations

import attrs
import pytest

from blockx.api import result_message
from blockx.calls import CallStats, FailureCode
from blockx.slots import (
    ConvergeTask,
    ForgetReason,
    ForgetTask,
    NotFound,
    PhaseOutcome,
    PhaseTimings,
    PluginResult,
    SlotMachine,
    Step,
    TaskPhase,
    TaskResult,
    TaskState,
    TimerKind,
    WorkerReady,
)
from tests.core.slots_helpers import (
    CONFIG,
    MachineFactory,
    fail_builder,
    finished,
    fired,
    start_task,
    timer_of,
)

ONE_RESULT = 132
"""What a result of `fail_builder` on "tN" costs: 128 fixed, the id, the epoch "e1"."""


def _end(machine: SlotMachine, task_id: str, *, now_ms: int) -> Step:
    start_task(machine, task_id, now_ms=now_ms)
    return machine.handle(
        finished(
            task_id,
            TaskPhase.BUILDER,
            now_ms=now_ms,
            outcome=PhaseOutcome(ok=False),
            stimulus_id=f"end-{task_id}",
        )
    )


def _evicted(task_id: str, *, by: str) -> ForgetTask:
    """The command evicting `task_id` in the step that ended task `by`."""
    return ForgetTask(task_id=task_id, reason=ForgetReason.RESULT_EVICTED, stimulus_id=f"end-{by}")


def test_a_results_size_is_its_texts_plus_fixed_parts() -> None:
    result = TaskResult(
        task_id="t1",
        slot_id="slot-0",
        state=TaskState.SUCCEEDED,
        phase=TaskPhase.PLUGIN,
        message="done",
        task_code_epoch="e1",
        plugin_results=(PluginResult(plugin_type="result", ok=True, outputs_json="[1,2]"),),
    )

    assert result.retained_bytes == 128 + 2 + 4 + 2 + 16 + 6 + 5


_BIG = 2**40
"""A figure that takes the most bytes a result's numbers take in practice."""


@pytest.mark.parametrize(
    "result",
    [
        TaskResult(task_id="t", slot_id="slot-0", state=TaskState.FAILED, phase=TaskPhase.BUILDER),
        TaskResult(
            task_id="task-" + "x" * 200,
            slot_id="slot-49",
            state=TaskState.FAILED,
            phase=TaskPhase.CALLS,
            failure_code=FailureCode.CALL_RAISED,
            message="RuntimeError: no luck " * 20,
            retryable=True,
            output_count=_BIG,
            output_bytes=_BIG,
            call_stats=CallStats(
                calls_total=_BIG, calls_succeeded=_BIG, calls_failed=_BIG, calls_retried=_BIG
            ),
            timings=PhaseTimings(
                preparing_ms=_BIG, builder_ms=_BIG, calls_ms=_BIG, plugin_ms=_BIG, total_ms=_BIG
            ),
            task_code_epoch="epoch-20261205-0001",
            accepted_at_ms=1_800_000_000_000,
            finished_at_ms=1_800_000_300_000,
            plugin_results=(
                PluginResult(plugin_type="jsonl", ok=True, records_written=_BIG, detail="/x/y"),
                PluginResult(plugin_type="result", ok=True, outputs_json="[" + "1," * 5000 + "1]"),
            ),
        ),
    ],
    ids=["bare", "full"],
)
def test_a_results_size_is_close_above_its_encoded_size(result: TaskResult) -> None:
    encoded = len(result_message(result).SerializeToString())

    assert encoded <= result.retained_bytes <= encoded + 128


def test_results_past_the_bound_evict_the_oldest_first(make_machine: MachineFactory) -> None:
    machine = make_machine(result_retention_bytes=2 * ONE_RESULT + 10)
    _end(machine, "t1", now_ms=100)
    _end(machine, "t2", now_ms=200)
    assert machine.retained() == (2, 2 * ONE_RESULT)

    step = _end(machine, "t3", now_ms=300)

    (converge, forget) = step.commands
    assert isinstance(converge, ConvergeTask)
    assert converge.task_id == "t3"
    assert forget == _evicted("t1", by="t3")
    assert machine.retained() == (2, 2 * ONE_RESULT)
    assert machine.get_result("t2").state is TaskState.FAILED
    assert machine.get_result("t3").state is TaskState.FAILED
    with pytest.raises(NotFound) as exc:
        machine.get_result("t1")
    assert exc.value.evicted
    assert "evicted" in str(exc.value)
    assert "worker.resultRetentionBytes" in str(exc.value)


def test_an_evicted_id_answers_evicted_until_its_retention_would_have_ended(
    make_machine: MachineFactory,
) -> None:
    machine = make_machine(result_retention_bytes=ONE_RESULT)
    _end(machine, "t1", now_ms=100)
    retention = timer_of(machine, TimerKind.RESULT_RETENTION, "t1")
    _end(machine, "t2", now_ms=200)
    assert machine.due_timers(30_100) == (retention,)

    step = machine.handle(fired(retention, now_ms=30_100, stimulus_id="purge"))

    assert step.commands == (
        ForgetTask(task_id="t1", reason=ForgetReason.RESULT_PURGED, stimulus_id="purge"),
    )
    with pytest.raises(NotFound) as exc:
        machine.get_result("t1")
    assert not exc.value.evicted
    assert "unknown" in str(exc.value)
    assert machine.get_results(["t2"])[0].state is TaskState.FAILED


def test_a_watch_on_an_evicted_task_is_told_it_was_evicted(make_machine: MachineFactory) -> None:
    machine = make_machine(result_retention_bytes=ONE_RESULT)
    _end(machine, "t1", now_ms=100)
    _end(machine, "t2", now_ms=200)

    with pytest.raises(NotFound) as exc:
        machine.get_results(["t2", "t1"])

    assert exc.value.task_id == "t1"
    assert exc.value.evicted


def test_a_result_larger_than_the_bound_is_kept_alone(make_machine: MachineFactory) -> None:
    machine = make_machine(result_retention_bytes=ONE_RESULT - 1)

    assert _end(machine, "t1", now_ms=100).commands[1:] == ()
    assert machine.retained() == (1, ONE_RESULT)
    assert _end(machine, "t2", now_ms=200).commands[1:] == (_evicted("t1", by="t2"),)
    assert machine.retained() == (1, ONE_RESULT)


def test_a_purge_by_time_gives_back_the_results_bytes(make_machine: MachineFactory) -> None:
    machine = make_machine(result_retention_bytes=10 * ONE_RESULT)
    _end(machine, "t1", now_ms=100)
    _end(machine, "t2", now_ms=200)
    retention = timer_of(machine, TimerKind.RESULT_RETENTION, "t1")

    step = machine.handle(fired(retention, now_ms=30_100, stimulus_id="purge"))

    assert step.commands == (
        ForgetTask(task_id="t1", reason=ForgetReason.RESULT_PURGED, stimulus_id="purge"),
    )
    assert machine.retained() == (1, ONE_RESULT)


def test_an_evicted_id_may_run_again_and_its_old_timer_is_stale(
    make_machine: MachineFactory,
) -> None:
    machine = make_machine(result_retention_bytes=ONE_RESULT)
    _end(machine, "t1", now_ms=100)
    old = timer_of(machine, TimerKind.RESULT_RETENTION, "t1")
    _end(machine, "t2", now_ms=200)

    start_task(machine, "t1", now_ms=300)

    assert machine.get_result("t1").state is TaskState.RUNNING
    assert old not in machine.due_timers(10**12)
    assert machine.handle(fired(old, now_ms=30_100)) == Step()
    fail_builder(machine, "t1", now_ms=400)
    assert machine.get_result("t1").result is not None


def test_evicted_ids_are_remembered_up_to_a_count_oldest_forgotten_first() -> None:
    machine = SlotMachine(attrs.evolve(CONFIG, result_retention_bytes=1), evicted_remembered=1)
    machine.handle(WorkerReady(now_ms=0, stimulus_id="ready"))
    for index, task_id in enumerate(("t1", "t2", "t3")):
        _end(machine, task_id, now_ms=100 * (index + 1))

    with pytest.raises(NotFound) as forgotten:
        machine.get_result("t1")
    with pytest.raises(NotFound) as remembered:
        machine.get_result("t2")
    assert (forgotten.value.evicted, remembered.value.evicted) == (False, True)
    assert [timer.key for timer in machine.due_timers(10**12)] == ["t2", "t3"]
    machine.check_invariants()
