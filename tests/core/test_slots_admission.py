"""Admission rules of the slot machine: slots, capacity, idempotency, submit,
slot checks, validation, draining, SlotUncertain, heartbeat and config.
"""

from __future__ import annotations

from collections.abc import Callable

import attrs
import pytest

from blockx.calls import FailureCode, RetryPolicy
from blockx.slots import (
    MAX_TASK_ID_CHARS,
    DrainStarted,
    ErrorCode,
    ForgetReason,
    ForgetTask,
    Heartbeat,
    InvalidArgument,
    InvalidConfig,
    InvalidSlot,
    NoSlot,
    NotFound,
    PhaseTimings,
    PrepareTaskActivation,
    SlotConfig,
    SlotMachine,
    SlotRequested,
    SlotState,
    SlotUncertain,
    SlotView,
    Step,
    TaskPhase,
    TaskResult,
    TaskSnapshot,
    TaskSpec,
    TaskState,
    TaskSubmitted,
    TimerKind,
    Unavailable,
    WorkerReady,
)
from tests.core.slots_helpers import (
    CONFIG,
    DEFAULT_RETRY,
    MachineFactory,
    current_timers,
    fail_builder,
    fired,
    observe,
    prepared,
    requested,
    start_task,
    submitted,
    task_spec,
    timer_of,
)


def _free(slot_id: str) -> SlotView:
    return SlotView(slot_id=slot_id, state=SlotState.FREE, task_id=None, lease_expires_at_ms=None)


# ------------------------------------------------------------------ slots


def test_slots_are_numbered_from_zero_and_start_free(machine: SlotMachine) -> None:
    assert machine.slot_views() == (_free("slot-0"), _free("slot-1"), _free("slot-2"))
    assert machine.free_capacity() == 3
    assert machine.active_task_count() == 0
    assert machine.draining is False
    assert machine.next_deadline_ms() is None
    assert machine.heartbeat(0) == Heartbeat(
        at_ms=0,
        slots_total=3,
        reserved_slots=0,
        running_tasks=0,
        free_slots=3,
        active_tasks=0,
        draining=False,
        ready=True,
        slots_granted=0,
    )


def test_request_reserves_the_first_free_slot_under_a_lease(machine: SlotMachine) -> None:
    step = machine.handle(requested("t1", now_ms=1_000, ttl_ms=2_000, stimulus_id="s1"))

    assert step == Step(
        reply=TaskSnapshot(
            task_id="t1",
            slot_id="slot-0",
            state=TaskState.ALLOCATED,
            phase=None,
            lease_expires_at_ms=3_000,
        )
    )
    assert machine.slot_views() == (
        SlotView(
            slot_id="slot-0", state=SlotState.ALLOCATED, task_id="t1", lease_expires_at_ms=3_000
        ),
        _free("slot-1"),
        _free("slot-2"),
    )
    assert machine.get_result("t1") == step.reply
    assert current_timers(machine) == ((TimerKind.SLOT_LEASE, "slot-0", 3_000),)
    # A reservation is not an active task: nothing has been submitted.
    assert machine.active_task_count() == 0


def test_first_free_slot_wins_after_slot_0_is_freed(machine: SlotMachine) -> None:
    machine.handle(requested("t1", now_ms=0, ttl_ms=1_000))
    machine.handle(requested("t2", now_ms=0, ttl_ms=9_000))
    lease = timer_of(machine, TimerKind.SLOT_LEASE, "slot-0")
    forget = machine.handle(fired(lease, now_ms=1_000, stimulus_id="s3"))
    assert forget.commands == (
        ForgetTask(task_id="t1", reason=ForgetReason.LEASE_EXPIRED, stimulus_id="s3"),
    )
    machine.check_invariants()

    step = machine.handle(requested("t3", now_ms=1_000, ttl_ms=2_000))

    assert step.reply == TaskSnapshot(
        task_id="t3",
        slot_id="slot-0",
        state=TaskState.ALLOCATED,
        phase=None,
        lease_expires_at_ms=3_000,
    )
    assert [view.task_id for view in machine.slot_views()] == ["t3", "t2", None]


def test_a_freed_middle_slot_is_taken_before_a_higher_free_one(
    make_machine: MachineFactory,
) -> None:
    machine = make_machine(task_slots=4)
    start_task(machine, "t1", now_ms=0)
    start_task(machine, "t2", now_ms=0)
    start_task(machine, "t3", now_ms=0)
    fail_builder(machine, "t2", now_ms=100)
    assert [view.state for view in machine.slot_views()] == [
        SlotState.RUNNING,
        SlotState.FREE,
        SlotState.RUNNING,
        SlotState.FREE,
    ]

    step = machine.handle(requested("t4", now_ms=200, ttl_ms=1_000))

    assert step.reply is not None
    assert step.reply.slot_id == "slot-1"


def test_request_when_all_slots_are_held_is_refused_with_no_slot(machine: SlotMachine) -> None:
    machine.handle(requested("t1", now_ms=0))
    machine.handle(submitted("t2", now_ms=0))
    start_task(machine, "t3", now_ms=0)
    assert machine.free_capacity() == 0
    before = observe(machine, "t1", "t2", "t3", "t4")

    with pytest.raises(NoSlot) as exc:
        machine.handle(requested("t4", now_ms=100))

    assert exc.value.code is ErrorCode.NO_SLOT
    assert exc.value.task_id == "t4"
    assert exc.value.task_slots == 3
    assert observe(machine, "t1", "t2", "t3", "t4") == before


def test_inline_submit_when_all_slots_are_held_is_refused_with_no_slot(
    machine: SlotMachine,
) -> None:
    for task_id in ("t1", "t2", "t3"):
        machine.handle(requested(task_id, now_ms=0))
    before = observe(machine, "t1", "t2", "t3", "t4")

    with pytest.raises(NoSlot) as exc:
        machine.handle(submitted("t4", now_ms=100))

    assert (exc.value.task_id, exc.value.task_slots) == ("t4", 3)
    assert observe(machine, "t1", "t2", "t3", "t4") == before


def test_free_capacity_and_heartbeat_count_allocated_and_running_slots(
    make_machine: MachineFactory,
) -> None:
    machine = make_machine(task_slots=4)
    machine.handle(requested("t1", now_ms=0))  # ALLOCATED, not submitted
    machine.handle(submitted("t2", now_ms=100))  # ALLOCATED, submitted
    start_task(machine, "t3", now_ms=200)  # RUNNING

    assert machine.free_capacity() == 1
    assert machine.active_task_count() == 2
    assert machine.heartbeat(300) == Heartbeat(
        at_ms=300,
        slots_total=4,
        reserved_slots=2,
        running_tasks=1,
        free_slots=1,
        active_tasks=2,
        draining=False,
        ready=True,
        slots_granted=3,
    )

    fail_builder(machine, "t3", now_ms=400)

    assert machine.free_capacity() == 2
    assert machine.heartbeat(500) == Heartbeat(
        at_ms=500,
        slots_total=4,
        reserved_slots=2,
        running_tasks=0,
        free_slots=2,
        active_tasks=1,
        draining=False,
        ready=True,
        slots_granted=3,
    )


def test_a_reservation_changes_the_heartbeat_even_once_its_task_has_ended(
    make_machine: MachineFactory,
) -> None:
    machine = make_machine(task_slots=1)
    before = machine.heartbeat(0)
    start_task(machine, "t1", now_ms=100)
    fail_builder(machine, "t1", now_ms=200)
    after = machine.heartbeat(0)

    # The same capacity as before, but a heartbeat that differs: a coordinator that
    # placed t1 hears from the worker again.
    assert attrs.evolve(after, slots_granted=before.slots_granted) == before
    assert (before.slots_granted, after.slots_granted) == (0, 1)


# ------------------------------------------------------------ idempotency


def test_repeat_request_for_a_reservation_answers_the_same_snapshot_without_extending_the_lease(
    machine: SlotMachine,
) -> None:
    first = machine.handle(requested("t1", now_ms=1_000, ttl_ms=2_000))
    before = observe(machine, "t1")

    again = machine.handle(requested("t1", now_ms=2_500, ttl_ms=9_000))

    assert again == first
    assert again.reply is not None
    assert again.reply.lease_expires_at_ms == 3_000
    assert observe(machine, "t1") == before


def test_repeat_request_for_a_submitted_task_answers_its_running_snapshot(
    machine: SlotMachine,
) -> None:
    machine.handle(submitted("t1", now_ms=1_000))

    preparing = machine.handle(requested("t1", now_ms=1_100, ttl_ms=500))

    assert preparing == Step(
        reply=TaskSnapshot(
            task_id="t1",
            slot_id="slot-0",
            state=TaskState.RUNNING,
            phase=TaskPhase.PREPARING,
            lease_expires_at_ms=6_000,
            deadline_ms=61_000,
        )
    )

    machine.handle(prepared("t1", slot_id="slot-0", now_ms=1_200))
    before = observe(machine, "t1")

    running = machine.handle(requested("t1", now_ms=1_300))

    assert running == Step(
        reply=TaskSnapshot(
            task_id="t1",
            slot_id="slot-0",
            state=TaskState.RUNNING,
            phase=TaskPhase.BUILDER,
            lease_expires_at_ms=None,
            deadline_ms=61_000,
        )
    )
    assert observe(machine, "t1") == before


def test_repeat_request_for_a_terminal_task_answers_its_terminal_snapshot(
    machine: SlotMachine,
) -> None:
    start_task(machine, "t1", now_ms=0)
    fail_builder(machine, "t1", now_ms=500)
    before = observe(machine, "t1")

    step = machine.handle(requested("t1", now_ms=600))

    assert step == Step(
        reply=TaskSnapshot(
            task_id="t1",
            slot_id="slot-0",
            state=TaskState.FAILED,
            phase=TaskPhase.TERMINAL,
            result=TaskResult(
                task_id="t1",
                slot_id="slot-0",
                state=TaskState.FAILED,
                phase=TaskPhase.BUILDER,
                failure_code=FailureCode.BUILDER_FAILED,
                timings=PhaseTimings(builder_ms=500, total_ms=500),
                task_code_epoch="e1",
                accepted_at_ms=0,
                finished_at_ms=500,
            ),
        )
    )
    # Answering a retained id reserves nothing.
    assert observe(machine, "t1") == before
    assert machine.slot_views()[0] == _free("slot-0")


def test_a_purged_task_id_is_new_again(machine: SlotMachine) -> None:
    start_task(machine, "t1", now_ms=0)
    fail_builder(machine, "t1", now_ms=500)
    retention = timer_of(machine, TimerKind.RESULT_RETENTION, "t1")
    assert retention.due_ms == 30_500
    machine.handle(fired(retention, now_ms=30_500))
    with pytest.raises(NotFound):
        machine.get_result("t1")

    step = machine.handle(requested("t1", now_ms=30_500, ttl_ms=1_000))

    assert step == Step(
        reply=TaskSnapshot(
            task_id="t1",
            slot_id="slot-0",
            state=TaskState.ALLOCATED,
            phase=None,
            lease_expires_at_ms=31_500,
        )
    )


# ------------------------------------------------------------- validation


def test_ttl_0_means_the_default_ttl(machine: SlotMachine) -> None:
    step = machine.handle(requested("t1", now_ms=1_000, ttl_ms=0))

    assert step.reply is not None
    assert step.reply.lease_expires_at_ms == 6_000  # default_ttl_ms 5_000
    assert current_timers(machine) == ((TimerKind.SLOT_LEASE, "slot-0", 6_000),)


def test_ttl_equal_to_the_max_task_timeout_is_accepted(machine: SlotMachine) -> None:
    step = machine.handle(requested("t1", now_ms=1_000, ttl_ms=600_000))

    assert step.reply is not None
    assert step.reply.lease_expires_at_ms == 601_000


@pytest.mark.parametrize("ttl_ms", [-1, 600_001])
def test_ttl_out_of_range_is_an_invalid_argument(machine: SlotMachine, ttl_ms: int) -> None:
    before = observe(machine, "t1")

    with pytest.raises(InvalidArgument) as exc:
        machine.handle(requested("t1", now_ms=1_000, ttl_ms=ttl_ms))

    assert exc.value.code is ErrorCode.INVALID_ARGUMENT
    assert exc.value.field == "ttl_ms"
    assert exc.value.value == ttl_ms
    assert observe(machine, "t1") == before


@pytest.mark.parametrize(
    "task_id", ["", " t1", "t1 ", "\u3000t1", "t" * (MAX_TASK_ID_CHARS + 1), "t" * 1_000_000]
)
def test_request_with_an_empty_padded_or_overlong_task_id_is_an_invalid_argument(
    machine: SlotMachine, task_id: str
) -> None:
    before = observe(machine)

    with pytest.raises(InvalidArgument) as exc:
        machine.handle(requested(task_id, now_ms=0))

    assert exc.value.field == "task_id"
    assert exc.value.value == task_id
    assert len(str(exc.value)) < 200  # the value is quoted cut short: it travels in a header
    assert observe(machine) == before


def test_a_task_id_of_the_longest_length_is_reserved(machine: SlotMachine) -> None:
    task_id = "t" * MAX_TASK_ID_CHARS
    machine.handle(requested(task_id, now_ms=0))
    assert machine.get_result(task_id).task_id == task_id


@pytest.mark.parametrize("task_id", ["", " t1", "t" * (MAX_TASK_ID_CHARS + 1)])
def test_asking_for_the_result_of_an_id_no_task_can_have_is_an_invalid_argument(
    machine: SlotMachine, task_id: str
) -> None:
    with pytest.raises(InvalidArgument) as exc:
        machine.get_result(task_id)
    assert exc.value.field == "task_id"
    with pytest.raises(NotFound):
        machine.get_result("t" * MAX_TASK_ID_CHARS)


def test_a_watch_of_an_unknown_and_an_invalid_id_is_refused_for_the_invalid_one(
    machine: SlotMachine,
) -> None:
    with pytest.raises(InvalidArgument) as exc:
        machine.get_results(["unknown", ""])
    assert (exc.value.field, exc.value.value) == ("task_ids[1]", "")
    with pytest.raises(NotFound):
        machine.get_results(["t1", "unknown"])


@pytest.mark.parametrize(
    ("spec", "field", "value"),
    [
        pytest.param(task_spec(""), "task_id", "", id="empty-task-id"),
        pytest.param(
            task_spec(task_timeout_ms=-1), "task.task_timeout_ms", -1, id="negative-timeout"
        ),
        pytest.param(
            task_spec(task_timeout_ms=600_001),
            "task.task_timeout_ms",
            600_001,
            id="timeout-above-max",
        ),
        pytest.param(task_spec(builder=""), "task.function_call.type", "", id="no-builder"),
        pytest.param(
            task_spec(
                call_retry_policy=RetryPolicy(max_attempts=0, base_backoff_ms=10, jitter_percent=0)
            ),
            "task.call_retry_policy.max_attempts",
            0,
            id="max-attempts-0",
        ),
        pytest.param(
            task_spec(
                call_retry_policy=RetryPolicy(max_attempts=2, base_backoff_ms=-1, jitter_percent=0)
            ),
            "task.call_retry_policy.base_backoff_ms",
            -1,
            id="negative-backoff",
        ),
        pytest.param(
            task_spec(
                call_retry_policy=RetryPolicy(max_attempts=2, base_backoff_ms=10, jitter_percent=6)
            ),
            "task.call_retry_policy.jitter_percent",
            6,
            id="jitter-6",
        ),
    ],
)
def test_invalid_task_spec_is_refused_naming_the_field(
    machine: SlotMachine, spec: TaskSpec, field: str, value: object
) -> None:
    before = observe(machine, spec.task_id or "t1")

    with pytest.raises(InvalidArgument) as exc:
        machine.handle(submitted(spec, now_ms=1_000))

    assert exc.value.field == field
    assert exc.value.value == value
    assert observe(machine, spec.task_id or "t1") == before


def test_invalid_spec_for_a_reserved_task_leaves_the_reservation_as_it_was(
    machine: SlotMachine,
) -> None:
    machine.handle(requested("t1", now_ms=0, ttl_ms=2_000))
    before = observe(machine, "t1")

    with pytest.raises(InvalidArgument) as exc:
        machine.handle(submitted(task_spec(builder=""), now_ms=100, slot_id="slot-0"))

    assert exc.value.field == "task.function_call.type"
    assert observe(machine, "t1") == before


def test_a_valid_retry_policy_override_is_passed_through(machine: SlotMachine) -> None:
    override = RetryPolicy(max_attempts=1, base_backoff_ms=0, jitter_percent=5)
    spec = task_spec(call_retry_policy=override)

    step = machine.handle(submitted(spec, now_ms=0, stimulus_id="s1"))

    assert step.commands == (
        PrepareTaskActivation(
            task_id="t1",
            slot_id="slot-0",
            spec=spec,
            retry_policy=override,
            deadline_ms=60_000,
            stimulus_id="s1",
        ),
    )


@pytest.mark.parametrize(
    ("task_timeout_ms", "deadline_ms"),
    [
        pytest.param(0, 61_000, id="default-task-deadline"),
        pytest.param(7_000, 8_000, id="own-timeout"),
        pytest.param(600_000, 601_000, id="timeout-at-max"),
    ],
)
def test_effective_deadline_is_now_plus_the_task_timeout_or_the_default(
    machine: SlotMachine, task_timeout_ms: int, deadline_ms: int
) -> None:
    spec = task_spec(task_timeout_ms=task_timeout_ms)

    step = machine.handle(submitted(spec, now_ms=1_000, stimulus_id="s1"))

    assert step.reply is not None
    assert step.reply.deadline_ms == deadline_ms
    assert step.commands == (
        PrepareTaskActivation(
            task_id="t1",
            slot_id="slot-0",
            spec=spec,
            retry_policy=DEFAULT_RETRY,
            deadline_ms=deadline_ms,
            stimulus_id="s1",
        ),
    )
    assert timer_of(machine, TimerKind.TASK_DEADLINE, "t1").due_ms == deadline_ms


# ----------------------------------------------------------------- submit


def test_inline_submit_reserves_with_the_default_ttl_and_prepares_activation(
    machine: SlotMachine,
) -> None:
    spec = task_spec("t1")

    step = machine.handle(submitted(spec, now_ms=1_000, stimulus_id="s1"))

    assert step.reply == TaskSnapshot(
        task_id="t1",
        slot_id="slot-0",
        state=TaskState.RUNNING,
        phase=TaskPhase.PREPARING,
        lease_expires_at_ms=6_000,
        deadline_ms=61_000,
    )
    assert step.commands == (
        PrepareTaskActivation(
            task_id="t1",
            slot_id="slot-0",
            spec=spec,
            retry_policy=DEFAULT_RETRY,
            deadline_ms=61_000,
            stimulus_id="s1",
        ),
    )
    assert machine.slot_views()[0] == SlotView(
        slot_id="slot-0", state=SlotState.ALLOCATED, task_id="t1", lease_expires_at_ms=6_000
    )
    assert current_timers(machine) == (
        (TimerKind.SLOT_LEASE, "slot-0", 6_000),
        (TimerKind.TASK_DEADLINE, "t1", 61_000),
    )
    assert machine.heartbeat(1_000) == Heartbeat(
        at_ms=1_000,
        slots_total=3,
        reserved_slots=1,
        running_tasks=0,
        free_slots=2,
        active_tasks=1,
        draining=False,
        ready=True,
        slots_granted=1,
    )


def test_submit_into_the_reserved_slot_keeps_the_lease(machine: SlotMachine) -> None:
    machine.handle(requested("t0", now_ms=0, ttl_ms=9_000))
    machine.handle(requested("t1", now_ms=0, ttl_ms=2_000))
    spec = task_spec("t1")

    step = machine.handle(submitted(spec, now_ms=500, slot_id="slot-1", stimulus_id="s3"))

    assert step.reply == TaskSnapshot(
        task_id="t1",
        slot_id="slot-1",
        state=TaskState.RUNNING,
        phase=TaskPhase.PREPARING,
        lease_expires_at_ms=2_000,
        deadline_ms=60_500,
    )
    assert step.commands == (
        PrepareTaskActivation(
            task_id="t1",
            slot_id="slot-1",
            spec=spec,
            retry_policy=DEFAULT_RETRY,
            deadline_ms=60_500,
            stimulus_id="s3",
        ),
    )
    assert machine.slot_views()[1] == SlotView(
        slot_id="slot-1", state=SlotState.ALLOCATED, task_id="t1", lease_expires_at_ms=2_000
    )


def test_inline_submit_of_a_reserved_task_uses_its_reserved_slot(machine: SlotMachine) -> None:
    machine.handle(requested("t0", now_ms=0, ttl_ms=9_000))
    machine.handle(requested("t1", now_ms=0, ttl_ms=2_000))

    step = machine.handle(submitted("t1", now_ms=500))

    assert step.reply is not None
    assert (step.reply.slot_id, step.reply.lease_expires_at_ms) == ("slot-1", 2_000)
    assert machine.free_capacity() == 1


@pytest.mark.parametrize(
    ("task_id", "slot_id", "held_by", "known"),
    [
        pytest.param("t3", "slot-0", "t1", True, id="new-id-slot-held-by-another"),
        pytest.param("t3", "slot-2", None, True, id="new-id-free-slot"),
        pytest.param("t3", "slot-3", None, False, id="new-id-unknown-slot"),
        pytest.param("t2", "slot-0", "t1", True, id="reserved-id-slot-of-another"),
        pytest.param("t2", "slot-2", None, True, id="reserved-id-free-slot"),
        pytest.param("t2", "bogus", None, False, id="reserved-id-unknown-slot"),
    ],
)
def test_submit_naming_a_slot_the_task_does_not_hold_is_invalid_slot(
    machine: SlotMachine, task_id: str, slot_id: str, held_by: str | None, known: bool
) -> None:
    machine.handle(requested("t1", now_ms=0))
    machine.handle(requested("t2", now_ms=0))
    before = observe(machine, "t1", "t2", "t3")

    with pytest.raises(InvalidSlot) as exc:
        machine.handle(submitted(task_id, now_ms=100, slot_id=slot_id))

    assert exc.value.code is ErrorCode.INVALID_SLOT
    assert exc.value.task_id == task_id
    assert exc.value.slot_id == slot_id
    assert exc.value.held_by == held_by
    assert exc.value.known is known
    assert observe(machine, "t1", "t2", "t3") == before


def test_a_slot_id_no_slot_has_is_quoted_cut_short(machine: SlotMachine) -> None:
    slot_id = "s" * 1_000_000  # a client's: it travels back in a header
    with pytest.raises(InvalidSlot) as exc:
        machine.handle(submitted("t1", now_ms=0, slot_id=slot_id))
    assert exc.value.slot_id == slot_id
    assert str(exc.value) == (
        f"slot_id='{'s' * 76}... cannot be used by task 't1': no such slot on this worker"
    )


def test_duplicate_submit_of_a_live_task_answers_its_snapshot_and_commands_nothing(
    machine: SlotMachine,
) -> None:
    first = machine.handle(submitted("t1", now_ms=0, stimulus_id="s1"))
    assert len(first.commands) == 1
    before = observe(machine, "t1")

    inline_again = machine.handle(submitted("t1", now_ms=100, stimulus_id="s2"))
    named_again = machine.handle(submitted("t1", now_ms=100, slot_id="slot-0", stimulus_id="s3"))

    # A retried submit naming another slot is still the same task: idempotency
    # by task id wins over slot checks.
    other_slot_again = machine.handle(
        submitted("t1", now_ms=100, slot_id="slot-2", stimulus_id="s3b")
    )

    assert inline_again == Step(reply=first.reply)
    assert named_again == Step(reply=first.reply)
    assert other_slot_again == Step(reply=first.reply)
    assert observe(machine, "t1") == before

    machine.handle(prepared("t1", slot_id="slot-0", now_ms=200))
    before = observe(machine, "t1")

    after_activation = machine.handle(submitted("t1", now_ms=300, stimulus_id="s4"))

    assert after_activation == Step(
        reply=TaskSnapshot(
            task_id="t1",
            slot_id="slot-0",
            state=TaskState.RUNNING,
            phase=TaskPhase.BUILDER,
            deadline_ms=60_000,
        )
    )
    assert observe(machine, "t1") == before


def test_duplicate_submit_of_a_terminal_task_answers_its_terminal_snapshot(
    machine: SlotMachine,
) -> None:
    start_task(machine, "t1", now_ms=0)
    fail_builder(machine, "t1", now_ms=400)
    terminal = machine.get_result("t1")
    before = observe(machine, "t1")

    step = machine.handle(submitted("t1", now_ms=500, stimulus_id="s9"))

    assert step == Step(reply=terminal)
    assert terminal.state is TaskState.FAILED
    assert terminal.phase is TaskPhase.TERMINAL
    assert observe(machine, "t1") == before


# --------------------------------------------------------- slot uncertain


def test_a_reservation_past_its_lease_is_uncertain_until_its_timer_is_fed_back(
    machine: SlotMachine,
) -> None:
    machine.handle(requested("t1", now_ms=0, ttl_ms=1_000))
    # One millisecond before expiry the reservation is still honoured.
    assert machine.handle(requested("t1", now_ms=999)).reply == TaskSnapshot(
        task_id="t1",
        slot_id="slot-0",
        state=TaskState.ALLOCATED,
        phase=None,
        lease_expires_at_ms=1_000,
    )
    before = observe(machine, "t1")

    with pytest.raises(SlotUncertain) as on_request:
        machine.handle(requested("t1", now_ms=1_000))
    with pytest.raises(SlotUncertain) as on_submit:
        machine.handle(submitted("t1", now_ms=1_200, slot_id="slot-0"))
    with pytest.raises(SlotUncertain) as on_inline_submit:
        machine.handle(submitted("t1", now_ms=1_500))

    for exc in (on_request, on_submit, on_inline_submit):
        assert exc.value.code is ErrorCode.SLOT_UNCERTAIN
        assert exc.value.task_id == "t1"
        assert exc.value.slot_id == "slot-0"
        assert exc.value.lease_expired_at_ms == 1_000
    assert observe(machine, "t1") == before

    lease = timer_of(machine, TimerKind.SLOT_LEASE, "slot-0")
    machine.handle(fired(lease, now_ms=1_500))

    assert machine.handle(requested("t1", now_ms=1_500)).reply == TaskSnapshot(
        task_id="t1",
        slot_id="slot-0",
        state=TaskState.ALLOCATED,
        phase=None,
        lease_expires_at_ms=6_500,
    )


# --------------------------------------------------------------- readiness


def test_nothing_is_admitted_before_the_worker_is_ready() -> None:
    machine = SlotMachine(CONFIG)
    readiness = [machine.ready]

    for event in (requested("t1", now_ms=0), submitted("t1", now_ms=0)):
        with pytest.raises(Unavailable) as exc:
            machine.handle(event)
        assert exc.value.code is ErrorCode.UNAVAILABLE
        assert exc.value.ready is False
        assert "not ready" in str(exc.value)
    assert machine.free_capacity() == CONFIG.task_slots

    assert machine.handle(WorkerReady(now_ms=5, stimulus_id="ready")) == Step()
    readiness.append(machine.ready)
    assert readiness == [False, True]
    machine.handle(requested("t1", now_ms=10))
    step = machine.handle(submitted("t2", now_ms=10))
    assert [type(command) for command in step.commands] == [PrepareTaskActivation]
    machine.check_invariants()


def test_readiness_follows_the_executors_and_leaves_live_tasks_alone(machine: SlotMachine) -> None:
    machine.handle(requested("t1", now_ms=0, ttl_ms=10_000))
    start_task(machine, "t2", now_ms=0)

    assert machine.handle(WorkerReady(now_ms=10, stimulus_id="down", ready=False)) == Step()
    before = observe(machine, "t1", "t2")

    assert machine.ready is False
    assert machine.heartbeat(10).ready is False
    for event in (requested("t3", now_ms=20), submitted("t1", now_ms=20, slot_id="slot-0")):
        with pytest.raises(Unavailable) as exc:
            machine.handle(event)
        assert exc.value.ready is False
        assert "not ready (no executor is healthy)" in str(exc.value)
    assert observe(machine, "t1", "t2") == before  # the reservation and the task stand

    machine.handle(WorkerReady(now_ms=30, stimulus_id="up"))
    step = machine.handle(submitted("t1", now_ms=40, slot_id="slot-0"))
    assert [type(command) for command in step.commands] == [PrepareTaskActivation]
    machine.check_invariants()


# --------------------------------------------------------------- draining


def test_draining_refuses_new_work_with_unavailable(machine: SlotMachine) -> None:
    machine.handle(requested("t1", now_ms=0, ttl_ms=10_000))
    machine.handle(submitted("t2", now_ms=0))

    step = machine.handle(DrainStarted(now_ms=100, stimulus_id="s3"))

    assert step == Step()
    assert machine.draining is True
    assert machine.heartbeat(100).draining is True
    before = observe(machine, "t1", "t2", "t3")

    refusals: list[tuple[SlotRequested | TaskSubmitted, str]] = [
        (requested("t3", now_ms=200), "t3"),  # new id
        (submitted("t3", now_ms=200), "t3"),  # new id, inline
        (submitted("t1", now_ms=200, slot_id="slot-0"), "t1"),  # reserved, not submitted
        (submitted("t1", now_ms=200), "t1"),  # reserved, inline
    ]
    for event, task_id in refusals:
        with pytest.raises(Unavailable) as exc:
            machine.handle(event)
        assert exc.value.code is ErrorCode.UNAVAILABLE
        assert exc.value.task_id == task_id
        assert "draining" in str(exc.value)

    assert observe(machine, "t1", "t2", "t3") == before


def test_draining_still_answers_known_task_ids(machine: SlotMachine) -> None:
    machine.handle(requested("t1", now_ms=0, ttl_ms=10_000))
    machine.handle(submitted("t2", now_ms=0))
    start_task(machine, "t3", now_ms=0)
    fail_builder(machine, "t3", now_ms=50)
    machine.handle(DrainStarted(now_ms=100, stimulus_id="s4"))
    before = observe(machine, "t1", "t2", "t3")

    assert machine.handle(requested("t1", now_ms=200)) == Step(
        reply=TaskSnapshot(
            task_id="t1",
            slot_id="slot-0",
            state=TaskState.ALLOCATED,
            phase=None,
            lease_expires_at_ms=10_000,
        )
    )
    running = TaskSnapshot(
        task_id="t2",
        slot_id="slot-1",
        state=TaskState.RUNNING,
        phase=TaskPhase.PREPARING,
        lease_expires_at_ms=5_000,
        deadline_ms=60_000,
    )
    assert machine.handle(requested("t2", now_ms=200)) == Step(reply=running)
    assert machine.handle(submitted("t2", now_ms=200)) == Step(reply=running)
    terminal = machine.get_result("t3")
    assert terminal.state is TaskState.FAILED
    assert machine.handle(requested("t3", now_ms=200)) == Step(reply=terminal)
    assert machine.handle(submitted("t3", now_ms=200)) == Step(reply=terminal)
    assert observe(machine, "t1", "t2", "t3") == before


# ----------------------------------------------------------------- config


@pytest.mark.parametrize(
    ("make_config", "field", "value"),
    [
        pytest.param(
            lambda: attrs.evolve(CONFIG, task_slots=0), "worker.taskSlots", 0, id="slots-0"
        ),
        pytest.param(
            lambda: attrs.evolve(CONFIG, default_ttl_ms=0), "worker.defaultTTLMs", 0, id="ttl-0"
        ),
        pytest.param(
            lambda: attrs.evolve(CONFIG, max_task_timeout_ms=0, task_deadline_ms=0),
            "worker.maxTaskTimeoutMs",
            0,
            id="max-timeout-0",
        ),
        pytest.param(
            lambda: attrs.evolve(CONFIG, task_deadline_ms=1_001, max_task_timeout_ms=1_000),
            "worker.taskDeadlineMs",
            1_001,
            id="deadline-above-max",
        ),
        pytest.param(
            lambda: attrs.evolve(CONFIG, task_deadline_ms=0),
            "worker.taskDeadlineMs",
            0,
            id="deadline-0",
        ),
        pytest.param(
            lambda: attrs.evolve(CONFIG, result_retention_ms=-1),
            "worker.resultRetentionMs",
            -1,
            id="retention-negative",
        ),
        pytest.param(
            lambda: attrs.evolve(CONFIG, result_retention_bytes=0),
            "worker.resultRetentionBytes",
            0,
            id="retention-bytes-0",
        ),
        pytest.param(
            lambda: attrs.evolve(CONFIG, watch_disconnect_grace_ms=-1),
            "worker.watchDisconnectGraceMs",
            -1,
            id="grace-negative",
        ),
        pytest.param(
            lambda: attrs.evolve(
                CONFIG,
                default_retry_policy=RetryPolicy(
                    max_attempts=0, base_backoff_ms=10, jitter_percent=5
                ),
            ),
            "worker.defaultMaxAttempts",
            0,
            id="max-attempts-0",
        ),
        pytest.param(
            lambda: attrs.evolve(
                CONFIG,
                default_retry_policy=RetryPolicy(
                    max_attempts=3, base_backoff_ms=-1, jitter_percent=5
                ),
            ),
            "worker.defaultBaseBackoffMs",
            -1,
            id="backoff-negative",
        ),
        pytest.param(
            lambda: attrs.evolve(
                CONFIG,
                default_retry_policy=RetryPolicy(
                    max_attempts=3, base_backoff_ms=10, jitter_percent=6
                ),
            ),
            "worker.defaultRetryJitterPercent",
            6,
            id="jitter-6",
        ),
    ],
)
def test_slot_config_out_of_range_is_invalid_config_naming_the_field(
    make_config: Callable[[], SlotConfig], field: str, value: int
) -> None:
    with pytest.raises(InvalidConfig) as exc:
        make_config()

    assert exc.value.field == field
    assert exc.value.value == value


def test_slot_config_accepts_its_boundaries() -> None:
    config = SlotConfig(
        task_slots=1,
        default_ttl_ms=1,
        task_deadline_ms=1_000,
        max_task_timeout_ms=1_000,
        result_retention_ms=0,
        result_retention_bytes=1,
        watch_disconnect_grace_ms=0,
        default_retry_policy=RetryPolicy(max_attempts=1, base_backoff_ms=0, jitter_percent=0),
    )

    machine = SlotMachine(config)

    assert machine.config == config
    assert machine.slot_views() == (_free("slot-0"),)
    machine.check_invariants()


def test_a_submit_into_a_lapsed_reservation_is_told_when_its_lease_expired(
    machine: SlotMachine,
) -> None:
    machine.handle(requested("t1", now_ms=1_000_000, ttl_ms=1_500))
    lease = timer_of(machine, TimerKind.SLOT_LEASE, "slot-0")
    machine.handle(fired(lease, now_ms=1_001_500))

    with pytest.raises(InvalidSlot) as exc:
        machine.handle(submitted("t1", now_ms=1_002_000, slot_id="slot-0"))

    assert exc.value.lease_expired_at_ms == 1_001_500
    assert str(exc.value) == (
        "slot_id='slot-0' cannot be used by task 't1': its reservation lapsed: the lease "
        "expired at 1970-01-01T00:16:41.500Z (1001500 ms) before a task was "
        "submitted; reserve a slot again"
    )
    # Reserved again, the task id is an ordinary one: no word of the old lease.
    machine.handle(requested("t1", now_ms=1_003_000))
    with pytest.raises(InvalidSlot) as again:
        machine.handle(submitted("t1", now_ms=1_003_000, slot_id="slot-9"))
    assert again.value.lease_expired_at_ms is None
