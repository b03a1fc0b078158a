"""Task lifecycle of the slot machine: activation, phase progression, deadlines,
out-of-order reports, the drain deadline and the log of recent stimuli.
"""

from __future__ import annotations

import pytest

from blockx.calls import (
    CallFailure,
    CallFailurePolicy,
    CallPhaseOutcome,
    CallStats,
    FailureCode,
)
from blockx.errors import Misuse
from blockx.slots import (
    ActivationFailed,
    ConvergeTask,
    DrainDeadlinePassed,
    DrainStarted,
    Event,
    ForgetReason,
    ForgetTask,
    FunctionCall,
    Heartbeat,
    InvalidArgument,
    NotFound,
    PhaseFinished,
    PhaseOutcome,
    PhaseTimings,
    PluginResult,
    ResultHandler,
    SlotMachine,
    SlotState,
    SlotView,
    StartBuilderPhase,
    StartCallPhase,
    StartPluginPhase,
    Step,
    TaskPhase,
    TaskResult,
    TaskSnapshot,
    TaskSpec,
    TaskState,
    TimerKind,
    WatchAttached,
)
from blockx.steps import LoggedStimulus
from tests.core.slots_helpers import (
    OK,
    MachineFactory,
    calls_finished,
    current_timers,
    finished,
    fired,
    observe,
    outputs_of,
    prepared,
    requested,
    start_task,
    submitted,
    timer_of,
)


def _terminal(result: TaskResult) -> TaskSnapshot:
    return TaskSnapshot(
        task_id=result.task_id,
        slot_id=result.slot_id,
        state=result.state,
        phase=TaskPhase.TERMINAL,
        result=result,
    )


def _in_builder(machine: SlotMachine) -> None:
    """t1 submitted at 0 into slot-0 and activated at 100 with epoch e1."""
    machine.handle(submitted("t1", now_ms=0))
    machine.handle(prepared("t1", slot_id="slot-0", now_ms=100))


def _in_calls(machine: SlotMachine) -> None:
    """As `_in_builder`, then the builder reported 7 calls at 300."""
    _in_builder(machine)
    machine.handle(
        finished(
            "t1",
            TaskPhase.BUILDER,
            now_ms=300,
            outcome=PhaseOutcome(ok=True, call_count=7),
        )
    )


STATS = CallStats(calls_total=7, calls_succeeded=5, calls_failed=2, calls_retried=3, subcalls=4)
OUTPUTS = outputs_of(5, 512)
"""5 call values, 512 bytes in all."""


def _in_plugin(machine: SlotMachine) -> None:
    """As `_in_calls`, then the calls finished at 1300 with 5 outputs of 512 bytes."""
    _in_calls(machine)
    machine.handle(
        calls_finished(
            "t1", now_ms=1_300, outcome=CallPhaseOutcome(ok=True, stats=STATS, outputs=OUTPUTS)
        )
    )


# ------------------------------------------------------------- activation


def test_activation_prepared_runs_the_slot_and_starts_the_builder(machine: SlotMachine) -> None:
    machine.handle(submitted("t1", now_ms=0))

    step = machine.handle(
        prepared("t1", slot_id="slot-0", now_ms=200, epoch="e7", stimulus_id="s2")
    )

    assert step.reply == TaskSnapshot(
        task_id="t1",
        slot_id="slot-0",
        state=TaskState.RUNNING,
        phase=TaskPhase.BUILDER,
        lease_expires_at_ms=None,
        deadline_ms=60_000,
    )
    assert step.commands == (
        StartBuilderPhase(task_id="t1", task_code_epoch="e7", stimulus_id="s2"),
    )
    assert machine.slot_views()[0] == SlotView(
        slot_id="slot-0", state=SlotState.RUNNING, task_id="t1", lease_expires_at_ms=None
    )
    # The lease no longer matters once the task runs: only the deadline is armed.
    assert current_timers(machine) == ((TimerKind.TASK_DEADLINE, "t1", 60_000),)
    assert machine.heartbeat(200) == Heartbeat(
        at_ms=200,
        slots_total=3,
        reserved_slots=0,
        running_tasks=1,
        free_slots=2,
        active_tasks=1,
        draining=False,
        ready=True,
        slots_granted=1,
    )


@pytest.mark.parametrize(
    ("reported_code", "failure_code"),
    [
        pytest.param(FailureCode.ACTIVATION_FAILED, FailureCode.ACTIVATION_FAILED, id="activation"),
        pytest.param(FailureCode.IO_SCOPE_FAILED, FailureCode.IO_SCOPE_FAILED, id="io-scope"),
        pytest.param(None, FailureCode.ACTIVATION_FAILED, id="no-code-means-activation"),
    ],
)
def test_activation_failed_ends_the_task_and_frees_the_slot(
    machine: SlotMachine, reported_code: FailureCode | None, failure_code: FailureCode
) -> None:
    machine.handle(submitted("t1", now_ms=100))

    step = machine.handle(
        ActivationFailed(
            task_id="t1",
            failure_code=reported_code,
            message="could not pin epoch",
            retryable=True,
            now_ms=300,
            stimulus_id="s2",
        )
    )

    result = TaskResult(
        task_id="t1",
        slot_id="slot-0",
        state=TaskState.FAILED,
        phase=TaskPhase.PREPARING,
        failure_code=failure_code,
        message="could not pin epoch",
        retryable=True,
        timings=PhaseTimings(preparing_ms=200, total_ms=200),
        accepted_at_ms=100,
        finished_at_ms=300,
    )
    assert step == Step(
        reply=_terminal(result),
        commands=(ConvergeTask(task_id="t1", result=result, stimulus_id="s2"),),
    )
    assert machine.slot_views()[0] == SlotView(
        slot_id="slot-0", state=SlotState.FREE, task_id=None, lease_expires_at_ms=None
    )
    assert machine.get_result("t1") == _terminal(result)
    assert machine.active_task_count() == 0
    assert current_timers(machine) == ((TimerKind.RESULT_RETENTION, "t1", 30_300),)


def test_lease_timer_firing_while_preparing_fails_the_task_with_slot_lost(
    machine: SlotMachine,
) -> None:
    machine.handle(requested("t1", now_ms=0, ttl_ms=1_000))
    machine.handle(submitted("t1", now_ms=100, slot_id="slot-0"))
    lease = timer_of(machine, TimerKind.SLOT_LEASE, "slot-0")

    step = machine.handle(fired(lease, now_ms=1_000, stimulus_id="s3"))

    result = TaskResult(
        task_id="t1",
        slot_id="slot-0",
        state=TaskState.FAILED,
        phase=TaskPhase.PREPARING,
        failure_code=FailureCode.SLOT_LOST,
        message="the lease of slot-0 expired before activation",
        retryable=True,
        timings=PhaseTimings(preparing_ms=900, total_ms=900),
        accepted_at_ms=100,
        finished_at_ms=1_000,
    )
    assert step == Step(
        reply=_terminal(result),
        commands=(ConvergeTask(task_id="t1", result=result, stimulus_id="s3"),),
    )
    assert machine.slot_views()[0].state is SlotState.FREE
    machine.check_invariants()
    before = observe(machine, "t1")

    # The runtime's late report and a second delivery of the timer change nothing.
    assert machine.handle(prepared("t1", slot_id="slot-0", now_ms=1_100)) == Step()
    assert machine.handle(fired(lease, now_ms=1_100)) == Step()
    assert observe(machine, "t1") == before


@pytest.mark.parametrize("reported_at_ms", [1_000, 1_500])
def test_activation_reported_at_or_after_lease_expiry_fails_with_slot_lost(
    machine: SlotMachine, reported_at_ms: int
) -> None:
    machine.handle(requested("t1", now_ms=0, ttl_ms=1_000))
    machine.handle(submitted("t1", now_ms=100, slot_id="slot-0"))
    lease = timer_of(machine, TimerKind.SLOT_LEASE, "slot-0")

    step = machine.handle(prepared("t1", slot_id="slot-0", now_ms=reported_at_ms, stimulus_id="s3"))

    result = TaskResult(
        task_id="t1",
        slot_id="slot-0",
        state=TaskState.FAILED,
        phase=TaskPhase.PREPARING,
        failure_code=FailureCode.SLOT_LOST,
        message="the lease of slot-0 expired at 1000 ms, before activation",
        retryable=True,
        timings=PhaseTimings(preparing_ms=reported_at_ms - 100, total_ms=reported_at_ms - 100),
        accepted_at_ms=100,
        finished_at_ms=reported_at_ms,
    )
    assert step == Step(
        reply=_terminal(result),
        commands=(ConvergeTask(task_id="t1", result=result, stimulus_id="s3"),),
    )
    assert machine.slot_views()[0].state is SlotState.FREE
    machine.check_invariants()
    before = observe(machine, "t1")

    assert machine.handle(fired(lease, now_ms=reported_at_ms)) == Step()
    assert observe(machine, "t1") == before


def test_activation_one_ms_before_lease_expiry_is_honoured(machine: SlotMachine) -> None:
    machine.handle(requested("t1", now_ms=0, ttl_ms=1_000))
    machine.handle(submitted("t1", now_ms=100, slot_id="slot-0"))

    step = machine.handle(prepared("t1", slot_id="slot-0", now_ms=999, stimulus_id="s3"))

    assert step.commands == (
        StartBuilderPhase(task_id="t1", task_code_epoch="e1", stimulus_id="s3"),
    )


def test_activation_reported_for_the_wrong_slot_is_machine_misuse(machine: SlotMachine) -> None:
    machine.handle(submitted("t1", now_ms=0))
    before = observe(machine, "t1")

    with pytest.raises(Misuse) as exc:
        machine.handle(prepared("t1", slot_id="slot-2", now_ms=100))

    assert exc.value.what == (
        "activation of task 't1' reported slot 'slot-2', but the task holds 'slot-0'"
    )
    assert observe(machine, "t1") == before
    assert machine.recent_stimuli[-1].outcome == "Misuse"


# ----------------------------------------------------------------- phases


def test_builder_success_starts_the_call_phase(machine: SlotMachine) -> None:
    _in_builder(machine)

    step = machine.handle(
        finished(
            "t1",
            TaskPhase.BUILDER,
            now_ms=300,
            outcome=PhaseOutcome(ok=True, call_count=7, streaming=True),
            stimulus_id="s3",
        )
    )

    assert step == Step(
        reply=TaskSnapshot(
            task_id="t1",
            slot_id="slot-0",
            state=TaskState.RUNNING,
            phase=TaskPhase.CALLS,
            deadline_ms=60_000,
        ),
        commands=(StartCallPhase(task_id="t1", call_count=7, streaming=True, stimulus_id="s3"),),
    )
    assert machine.slot_views()[0].state is SlotState.RUNNING


@pytest.mark.parametrize(
    ("reported_code", "failure_code"),
    [
        pytest.param(None, FailureCode.BUILDER_FAILED, id="default"),
        pytest.param(FailureCode.BUILDER_NOT_FOUND, FailureCode.BUILDER_NOT_FOUND, id="not-found"),
    ],
)
def test_builder_failure_ends_the_task(
    machine: SlotMachine, reported_code: FailureCode | None, failure_code: FailureCode
) -> None:
    _in_builder(machine)

    step = machine.handle(
        finished(
            "t1",
            TaskPhase.BUILDER,
            now_ms=300,
            outcome=PhaseOutcome(ok=False, failure_code=reported_code, message="no builder csv"),
            stimulus_id="s3",
        )
    )

    result = TaskResult(
        task_id="t1",
        slot_id="slot-0",
        state=TaskState.FAILED,
        phase=TaskPhase.BUILDER,
        failure_code=failure_code,
        message="no builder csv",
        retryable=False,
        timings=PhaseTimings(preparing_ms=100, builder_ms=200, total_ms=300),
        task_code_epoch="e1",
        accepted_at_ms=0,
        finished_at_ms=300,
    )
    assert step == Step(
        reply=_terminal(result),
        commands=(ConvergeTask(task_id="t1", result=result, stimulus_id="s3"),),
    )
    assert machine.slot_views()[0].state is SlotState.FREE


def test_calls_failure_defaults_to_calls_failed_and_keeps_the_call_stats(
    machine: SlotMachine,
) -> None:
    _in_calls(machine)

    step = machine.handle(
        calls_finished(
            "t1",
            now_ms=1_300,
            outcome=CallPhaseOutcome(
                ok=False,
                message="call 3 failed",
                retryable=True,
                stats=STATS,
                outputs=outputs_of(2, 64),
            ),
            stimulus_id="s4",
        )
    )

    result = TaskResult(
        task_id="t1",
        slot_id="slot-0",
        state=TaskState.FAILED,
        phase=TaskPhase.CALLS,
        failure_code=FailureCode.CALLS_FAILED,
        message="call 3 failed",
        retryable=True,
        output_count=2,
        output_bytes=64,
        call_stats=STATS,
        timings=PhaseTimings(preparing_ms=100, builder_ms=200, calls_ms=1_000, total_ms=1_300),
        task_code_epoch="e1",
        accepted_at_ms=0,
        finished_at_ms=1_300,
    )
    assert step == Step(
        reply=_terminal(result),
        commands=(ConvergeTask(task_id="t1", result=result, stimulus_id="s4"),),
    )


def test_calls_success_with_failed_calls_still_starts_the_plugin(machine: SlotMachine) -> None:
    spec = TaskSpec(
        task_id="t1",
        function_call=FunctionCall(type="csv"),
        result_handler=ResultHandler(type="s3"),
        call_failure_policy=CallFailurePolicy.BEST_EFFORT,
    )
    machine.handle(submitted(spec, now_ms=0))
    machine.handle(prepared("t1", slot_id="slot-0", now_ms=100))
    machine.handle(
        finished("t1", TaskPhase.BUILDER, now_ms=300, outcome=PhaseOutcome(ok=True, call_count=7))
    )

    failures = tuple(
        CallFailure(
            call_id=f"c{i}",
            function="mod.fn",
            attempts=3,
            error_code=FailureCode.CALL_RAISED,
            error_message="boom",
        )
        for i in (3, 6)
    )
    step = machine.handle(
        calls_finished(
            "t1",
            now_ms=1_300,
            outcome=CallPhaseOutcome(
                ok=True,
                message="2 call(s) failed; first: c3 mod.fn CALL_RAISED: boom",
                stats=STATS,
                outputs=OUTPUTS,
                failures=failures,
            ),
            stimulus_id="s4",
        )
    )

    assert step == Step(
        reply=TaskSnapshot(
            task_id="t1",
            slot_id="slot-0",
            state=TaskState.RUNNING,
            phase=TaskPhase.PLUGIN,
            deadline_ms=60_000,
        ),
        commands=(StartPluginPhase(task_id="t1", outputs=OUTPUTS, stimulus_id="s4"),),
    )


def test_plugin_success_ends_the_task_succeeded_with_everything_recorded(
    machine: SlotMachine,
) -> None:
    _in_plugin(machine)
    plugin_results = (
        PluginResult(plugin_type="s3", ok=True, records_written=5),
        PluginResult(plugin_type="audit", ok=True, records_written=1, detail="logged"),
    )

    step = machine.handle(
        finished(
            "t1",
            TaskPhase.PLUGIN,
            now_ms=1_700,
            outcome=PhaseOutcome(ok=True, plugin_results=plugin_results),
            stimulus_id="s5",
        )
    )

    result = TaskResult(
        task_id="t1",
        slot_id="slot-0",
        state=TaskState.SUCCEEDED,
        phase=TaskPhase.PLUGIN,
        failure_code=None,
        message="",
        retryable=False,
        output_count=5,
        output_bytes=512,
        plugin_results=plugin_results,
        call_stats=STATS,
        timings=PhaseTimings(
            preparing_ms=100, builder_ms=200, calls_ms=1_000, plugin_ms=400, total_ms=1_700
        ),
        task_code_epoch="e1",
        accepted_at_ms=0,
        finished_at_ms=1_700,
    )
    assert step == Step(
        reply=_terminal(result),
        commands=(ConvergeTask(task_id="t1", result=result, stimulus_id="s5"),),
    )
    assert machine.get_result("t1") == _terminal(result)
    assert machine.slot_views()[0].state is SlotState.FREE
    assert machine.active_task_count() == 0
    assert current_timers(machine) == ((TimerKind.RESULT_RETENTION, "t1", 31_700),)


def test_plugin_failure_defaults_to_plugin_failed_with_plugin_results_recorded(
    machine: SlotMachine,
) -> None:
    _in_plugin(machine)
    plugin_results = (PluginResult(plugin_type="s3", ok=False, detail="bucket missing"),)

    step = machine.handle(
        finished(
            "t1",
            TaskPhase.PLUGIN,
            now_ms=1_700,
            outcome=PhaseOutcome(
                ok=False, message="writer failed", retryable=True, plugin_results=plugin_results
            ),
            stimulus_id="s5",
        )
    )

    result = TaskResult(
        task_id="t1",
        slot_id="slot-0",
        state=TaskState.FAILED,
        phase=TaskPhase.PLUGIN,
        failure_code=FailureCode.PLUGIN_FAILED,
        message="writer failed",
        retryable=True,
        output_count=5,
        output_bytes=512,
        plugin_results=plugin_results,
        call_stats=STATS,
        timings=PhaseTimings(
            preparing_ms=100, builder_ms=200, calls_ms=1_000, plugin_ms=400, total_ms=1_700
        ),
        task_code_epoch="e1",
        accepted_at_ms=0,
        finished_at_ms=1_700,
    )
    assert step == Step(
        reply=_terminal(result),
        commands=(ConvergeTask(task_id="t1", result=result, stimulus_id="s5"),),
    )


def test_timings_are_the_time_spent_in_each_phase(machine: SlotMachine) -> None:
    machine.handle(requested("t1", now_ms=0, ttl_ms=2_000))
    machine.handle(submitted("t1", now_ms=1_000, slot_id="slot-0"))
    machine.handle(prepared("t1", slot_id="slot-0", now_ms=1_250))
    machine.handle(finished("t1", TaskPhase.BUILDER, now_ms=1_600, outcome=PhaseOutcome(ok=True)))
    machine.handle(calls_finished("t1", now_ms=4_600))

    step = machine.handle(finished("t1", TaskPhase.PLUGIN, now_ms=4_700))

    assert step.reply is not None
    assert step.reply.result is not None
    # Time spent reserved before the submit is not the task's: it starts at accept.
    assert step.reply.result.timings == PhaseTimings(
        preparing_ms=250, builder_ms=350, calls_ms=3_000, plugin_ms=100, total_ms=3_700
    )
    assert (step.reply.result.accepted_at_ms, step.reply.result.finished_at_ms) == (1_000, 4_700)


# ------------------------------------------------------- out-of-order reports


def test_reports_for_other_phases_while_in_builder_are_ignored(machine: SlotMachine) -> None:
    _in_builder(machine)
    before = observe(machine, "t1")

    ignored: list[Event] = [
        calls_finished("t1", now_ms=200),
        finished("t1", TaskPhase.PLUGIN, now_ms=200),
        prepared("t1", slot_id="slot-0", now_ms=200, epoch="e2"),
        ActivationFailed(
            task_id="t1",
            failure_code=None,
            message="late",
            retryable=False,
            now_ms=200,
            stimulus_id="s4",
        ),
    ]
    for event in ignored:
        assert machine.handle(event) == Step()
    assert observe(machine, "t1") == before

    # The task still answers the report for the phase it is in.
    step = machine.handle(finished("t1", TaskPhase.BUILDER, now_ms=300, stimulus_id="s9"))
    assert step.commands == (
        StartCallPhase(task_id="t1", call_count=0, streaming=False, stimulus_id="s9"),
    )


def test_a_repeated_builder_report_while_in_calls_is_ignored(machine: SlotMachine) -> None:
    _in_calls(machine)
    before = observe(machine, "t1")

    failed_again = finished("t1", TaskPhase.BUILDER, now_ms=400, outcome=PhaseOutcome(ok=False))
    assert machine.handle(failed_again) == Step()
    assert machine.handle(finished("t1", TaskPhase.BUILDER, now_ms=400)) == Step()
    assert observe(machine, "t1") == before


def test_phase_reports_before_activation_are_ignored(machine: SlotMachine) -> None:
    machine.handle(requested("t0", now_ms=0))  # reserved, never submitted
    machine.handle(submitted("t1", now_ms=0))  # submitted, still preparing
    before = observe(machine, "t0", "t1")

    for task_id in ("t0", "t1"):
        assert machine.handle(finished(task_id, TaskPhase.BUILDER, now_ms=100)) == Step()
    assert machine.handle(prepared("t0", slot_id="slot-0", now_ms=100)) == Step()
    assert (
        machine.handle(
            ActivationFailed(
                task_id="t0",
                failure_code=None,
                message="",
                retryable=False,
                now_ms=100,
                stimulus_id="s3",
            )
        )
        == Step()
    )
    assert observe(machine, "t0", "t1") == before


def test_reports_after_the_task_ended_are_ignored(machine: SlotMachine) -> None:
    _in_builder(machine)
    machine.handle(finished("t1", TaskPhase.BUILDER, now_ms=300, outcome=PhaseOutcome(ok=False)))
    before = observe(machine, "t1")

    late: list[Event] = [
        finished("t1", TaskPhase.BUILDER, now_ms=400),
        calls_finished("t1", now_ms=400),
        finished("t1", TaskPhase.PLUGIN, now_ms=400),
        prepared("t1", slot_id="slot-0", now_ms=400),
        ActivationFailed(
            task_id="t1",
            failure_code=None,
            message="",
            retryable=False,
            now_ms=400,
            stimulus_id="s5",
        ),
    ]
    for event in late:
        assert machine.handle(event) == Step()
    assert observe(machine, "t1") == before


def test_reports_for_unknown_task_ids_are_ignored(machine: SlotMachine) -> None:
    _in_builder(machine)
    before = observe(machine, "t1", "ghost")

    unknown: list[Event] = [
        prepared("ghost", slot_id="slot-0", now_ms=200),
        ActivationFailed(
            task_id="ghost",
            failure_code=None,
            message="",
            retryable=False,
            now_ms=200,
            stimulus_id="s3",
        ),
        finished("ghost", TaskPhase.BUILDER, now_ms=200),
        calls_finished("ghost", now_ms=200),
        finished("ghost", TaskPhase.PLUGIN, now_ms=200),
    ]
    for event in unknown:
        assert machine.handle(event) == Step()
    assert observe(machine, "t1", "ghost") == before


@pytest.mark.parametrize("phase", [TaskPhase.PREPARING, TaskPhase.CALLS, TaskPhase.TERMINAL])
def test_phase_finished_for_a_phase_no_runtime_reports_is_misuse(phase: TaskPhase) -> None:
    with pytest.raises(Misuse) as exc:
        PhaseFinished(task_id="t1", phase=phase, outcome=OK, now_ms=0, stimulus_id="s1")

    assert exc.value.what == (
        f"phase {phase.value} is not reported with a PhaseOutcome "
        "(the calls phase ends with CallsFinished)"
    )


# --------------------------------------------------------------- deadline


def test_deadline_timer_fails_the_task_as_timed_out(machine: SlotMachine) -> None:
    spec = TaskSpec(task_id="t1", function_call=FunctionCall(type="csv"), task_timeout_ms=8_000)
    machine.handle(submitted(spec, now_ms=1_000))
    machine.handle(prepared("t1", slot_id="slot-0", now_ms=1_100))
    deadline = timer_of(machine, TimerKind.TASK_DEADLINE, "t1")
    assert deadline.due_ms == 9_000
    before = observe(machine, "t1")

    assert machine.handle(fired(deadline, now_ms=8_999)) == Step()
    assert observe(machine, "t1") == before

    step = machine.handle(fired(deadline, now_ms=9_000, stimulus_id="s9"))

    result = TaskResult(
        task_id="t1",
        slot_id="slot-0",
        state=TaskState.FAILED,
        phase=TaskPhase.BUILDER,
        failure_code=FailureCode.TIMED_OUT,
        message="task deadline 9000 ms passed",
        retryable=True,
        timings=PhaseTimings(preparing_ms=100, builder_ms=7_900, total_ms=8_000),
        task_code_epoch="e1",
        accepted_at_ms=1_000,
        finished_at_ms=9_000,
    )
    assert step == Step(
        reply=_terminal(result),
        commands=(ConvergeTask(task_id="t1", result=result, stimulus_id="s9"),),
    )
    assert machine.slot_views()[0].state is SlotState.FREE


def test_deadline_while_preparing_times_the_task_out(machine: SlotMachine) -> None:
    spec = TaskSpec(task_id="t1", function_call=FunctionCall(type="csv"), task_timeout_ms=3_000)
    machine.handle(requested("t1", now_ms=0, ttl_ms=20_000))
    machine.handle(submitted(spec, now_ms=500, slot_id="slot-0"))
    deadline = timer_of(machine, TimerKind.TASK_DEADLINE, "t1")

    step = machine.handle(fired(deadline, now_ms=3_500, stimulus_id="s9"))

    assert step.reply is not None
    assert step.reply.result == TaskResult(
        task_id="t1",
        slot_id="slot-0",
        state=TaskState.FAILED,
        phase=TaskPhase.PREPARING,
        failure_code=FailureCode.TIMED_OUT,
        message="task deadline 3500 ms passed",
        retryable=True,
        timings=PhaseTimings(preparing_ms=3_000, total_ms=3_000),
        accepted_at_ms=500,
        finished_at_ms=3_500,
    )
    assert machine.slot_views()[0].state is SlotState.FREE
    # The reservation's lease timer died with it.
    assert current_timers(machine) == ((TimerKind.RESULT_RETENTION, "t1", 33_500),)


# ----------------------------------------------------------------- drain


def test_activated_tasks_keep_progressing_while_draining(machine: SlotMachine) -> None:
    _in_builder(machine)
    machine.handle(DrainStarted(now_ms=200, stimulus_id="s2"))

    calls = machine.handle(finished("t1", TaskPhase.BUILDER, now_ms=300, stimulus_id="s3"))
    plugin = machine.handle(calls_finished("t1", now_ms=400, stimulus_id="s4"))
    done = machine.handle(finished("t1", TaskPhase.PLUGIN, now_ms=500, stimulus_id="s5"))

    assert calls.commands == (
        StartCallPhase(task_id="t1", call_count=0, streaming=False, stimulus_id="s3"),
    )
    assert plugin.commands == (StartPluginPhase(task_id="t1", outputs=(), stimulus_id="s4"),)
    assert done.reply is not None
    assert done.reply.state is TaskState.SUCCEEDED
    assert machine.draining is True


def test_drain_deadline_ends_every_live_task(make_machine: MachineFactory) -> None:
    machine = make_machine(task_slots=4)
    machine.handle(requested("t1", now_ms=0, ttl_ms=10_000))  # reserved only
    machine.handle(submitted("t2", now_ms=0))  # preparing
    start_task(machine, "t3", now_ms=0)  # running
    machine.handle(DrainStarted(now_ms=100, stimulus_id="s4"))
    machine.handle(finished("t3", TaskPhase.BUILDER, now_ms=200))

    step = machine.handle(DrainDeadlinePassed(now_ms=1_000, stimulus_id="s9"))

    t2_result = TaskResult(
        task_id="t2",
        slot_id="slot-1",
        state=TaskState.FAILED,
        phase=TaskPhase.PREPARING,
        failure_code=FailureCode.WORKER_SHUTDOWN,
        message="the worker shut down before the task finished",
        retryable=True,
        timings=PhaseTimings(preparing_ms=1_000, total_ms=1_000),
        accepted_at_ms=0,
        finished_at_ms=1_000,
    )
    t3_result = TaskResult(
        task_id="t3",
        slot_id="slot-2",
        state=TaskState.FAILED,
        phase=TaskPhase.CALLS,
        failure_code=FailureCode.WORKER_SHUTDOWN,
        message="the worker shut down before the task finished",
        retryable=True,
        timings=PhaseTimings(preparing_ms=0, builder_ms=200, calls_ms=800, total_ms=1_000),
        task_code_epoch="e1",
        accepted_at_ms=0,
        finished_at_ms=1_000,
    )
    assert step == Step(
        commands=(
            ForgetTask(task_id="t1", reason=ForgetReason.WORKER_SHUTDOWN, stimulus_id="s9"),
            ConvergeTask(task_id="t2", result=t2_result, stimulus_id="s9"),
            ConvergeTask(task_id="t3", result=t3_result, stimulus_id="s9"),
        )
    )
    assert all(view.state is SlotState.FREE for view in machine.slot_views())
    assert machine.heartbeat(1_000) == Heartbeat(
        at_ms=1_000,
        slots_total=4,
        reserved_slots=0,
        running_tasks=0,
        free_slots=4,
        active_tasks=0,
        draining=True,
        ready=True,
        slots_granted=3,
    )
    with pytest.raises(NotFound):
        machine.get_result("t1")
    assert machine.get_result("t2") == _terminal(t2_result)
    assert machine.get_result("t3") == _terminal(t3_result)
    assert current_timers(machine) == (
        (TimerKind.RESULT_RETENTION, "t2", 31_000),
        (TimerKind.RESULT_RETENTION, "t3", 31_000),
    )


def test_drain_deadline_without_drain_started_also_drains(machine: SlotMachine) -> None:
    step = machine.handle(DrainDeadlinePassed(now_ms=0, stimulus_id="s1"))

    assert step == Step()
    assert machine.draining is True
    assert machine.heartbeat(0).draining is True


# ------------------------------------------------------------ stimulus log


def test_recent_stimuli_record_each_event_with_its_outcome(machine: SlotMachine) -> None:
    events: list[Event] = [
        requested("t1", now_ms=0, stimulus_id="s1"),
        submitted("t1", now_ms=10, slot_id="slot-0", stimulus_id="s2"),
        prepared("t1", slot_id="slot-0", now_ms=20, stimulus_id="s3"),
        calls_finished("t1", now_ms=30, stimulus_id="s4"),  # out of order
        WatchAttached(task_id="t1", now_ms=40, stimulus_id="s5"),
        requested("t2", now_ms=50, ttl_ms=1_000, stimulus_id="s6"),
        DrainDeadlinePassed(now_ms=60, stimulus_id="s8"),
    ]
    refused = requested("", now_ms=55, stimulus_id="s7")
    for event in events[:-1]:
        machine.handle(event)
    with pytest.raises(InvalidArgument):
        machine.handle(refused)
    machine.handle(events[-1])

    assert machine.recent_stimuli[1:] == (  # the first is the helper's WorkerReady
        LoggedStimulus(stimulus_id="s1", event=events[0], outcome="-"),
        LoggedStimulus(stimulus_id="s2", event=events[1], outcome="PrepareTaskActivation"),
        LoggedStimulus(stimulus_id="s3", event=events[2], outcome="StartBuilderPhase"),
        LoggedStimulus(stimulus_id="s4", event=events[3], outcome="-"),
        LoggedStimulus(stimulus_id="s5", event=events[4], outcome="-"),
        LoggedStimulus(stimulus_id="s6", event=events[5], outcome="-"),
        LoggedStimulus(stimulus_id="s7", event=refused, outcome="InvalidArgument"),
        LoggedStimulus(stimulus_id="s8", event=events[6], outcome="ConvergeTask,ForgetTask"),
    )


def test_recent_stimuli_keep_only_the_latest_256(machine: SlotMachine) -> None:
    events = [
        WatchAttached(task_id=f"ghost-{i}", now_ms=i, stimulus_id=f"s{i}") for i in range(300)
    ]
    for event in events:
        machine.handle(event)

    assert machine.recent_stimuli == tuple(
        LoggedStimulus(stimulus_id=f"s{i}", event=event, outcome="-")
        for i, event in enumerate(events)
        if i >= 44
    )
