"""Timers of the slot machine: leases, result retention and purge, tickets that
make stale timers harmless, watch grace, and `next_deadline_ms`/`due_timers`.
"""

from __future__ import annotations

import pytest

from blockx.calls import FailureCode
from blockx.slots import (
    ConvergeTask,
    Event,
    ForgetReason,
    ForgetTask,
    NotFound,
    PhaseTimings,
    SlotMachine,
    SlotState,
    SlotView,
    Step,
    TaskPhase,
    TaskResult,
    TaskSnapshot,
    TaskState,
    TimerKind,
    WatchAttached,
    WatchDetached,
    WatchDisconnected,
)
from tests.core.slots_helpers import (
    FAR_FUTURE_MS,
    MachineFactory,
    current_timers,
    fail_builder,
    fired,
    observe,
    prepared,
    requested,
    start_task,
    submitted,
    timer_of,
)


@pytest.fixture
def watched(make_machine: MachineFactory) -> SlotMachine:
    """A machine with a watch disconnect grace of 1000 ms."""
    return make_machine(watch_disconnect_grace_ms=1_000)


def _state(machine: SlotMachine, task_id: str) -> tuple[TaskState, TaskPhase | None]:
    snapshot = machine.get_result(task_id)
    return snapshot.state, snapshot.phase


# ------------------------------------------------------------------ leases


def test_an_unsubmitted_reservation_is_forgotten_when_its_lease_expires(
    machine: SlotMachine,
) -> None:
    machine.handle(requested("t1", now_ms=0, ttl_ms=2_000))
    lease = timer_of(machine, TimerKind.SLOT_LEASE, "slot-0")
    assert lease.due_ms == 2_000
    before = observe(machine, "t1")

    assert machine.handle(fired(lease, now_ms=1_999)) == Step()
    assert observe(machine, "t1") == before

    step = machine.handle(fired(lease, now_ms=2_000, stimulus_id="s2"))

    assert step == Step(
        commands=(ForgetTask(task_id="t1", reason=ForgetReason.LEASE_EXPIRED, stimulus_id="s2"),)
    )
    assert machine.slot_views()[0] == SlotView(
        slot_id="slot-0", state=SlotState.FREE, task_id=None, lease_expires_at_ms=None
    )
    with pytest.raises(NotFound) as exc:
        machine.get_result("t1")
    assert exc.value.task_id == "t1"
    assert machine.next_deadline_ms() is None
    assert machine.heartbeat(2_000).reserved_slots == 0


def test_a_lease_timer_fed_back_late_still_expires_the_reservation(machine: SlotMachine) -> None:
    machine.handle(requested("t1", now_ms=0, ttl_ms=2_000))
    lease = timer_of(machine, TimerKind.SLOT_LEASE, "slot-0")

    step = machine.handle(fired(lease, now_ms=7_000, stimulus_id="s2"))

    assert step.commands == (
        ForgetTask(task_id="t1", reason=ForgetReason.LEASE_EXPIRED, stimulus_id="s2"),
    )
    assert machine.free_capacity() == 3


# --------------------------------------------------------------- retention


def test_a_result_is_readable_until_its_retention_timer_purges_it(machine: SlotMachine) -> None:
    start_task(machine, "t1", now_ms=0)
    fail_builder(machine, "t1", now_ms=500)
    terminal = machine.get_result("t1")
    retention = timer_of(machine, TimerKind.RESULT_RETENTION, "t1")
    assert retention.due_ms == 30_500
    assert machine.due_timers(30_499) == ()
    before = observe(machine, "t1")

    assert machine.handle(fired(retention, now_ms=30_499)) == Step()
    assert machine.get_result("t1") == terminal
    assert observe(machine, "t1") == before

    step = machine.handle(fired(retention, now_ms=30_500, stimulus_id="s5"))

    assert step == Step(
        commands=(ForgetTask(task_id="t1", reason=ForgetReason.RESULT_PURGED, stimulus_id="s5"),)
    )
    with pytest.raises(NotFound):
        machine.get_result("t1")
    assert machine.next_deadline_ms() is None
    machine.check_invariants()
    # Fed back a second time the purge timer is stale.
    assert machine.handle(fired(retention, now_ms=30_600)) == Step()


def test_retention_0_makes_the_purge_due_at_once(make_machine: MachineFactory) -> None:
    machine = make_machine(result_retention_ms=0)
    start_task(machine, "t1", now_ms=0)
    fail_builder(machine, "t1", now_ms=500)

    (retention,) = machine.due_timers(500)
    assert (retention.kind, retention.key, retention.due_ms) == (
        TimerKind.RESULT_RETENTION,
        "t1",
        500,
    )
    assert machine.next_deadline_ms() == 500
    # Until the runtime feeds the timer back, the result is still there.
    assert machine.get_result("t1").state is TaskState.FAILED

    step = machine.handle(fired(retention, now_ms=500, stimulus_id="s3"))

    assert step.commands == (
        ForgetTask(task_id="t1", reason=ForgetReason.RESULT_PURGED, stimulus_id="s3"),
    )
    with pytest.raises(NotFound):
        machine.get_result("t1")


# ------------------------------------------------------------ stale timers


def test_a_lease_timer_of_a_slot_since_given_to_another_task_does_nothing(
    machine: SlotMachine,
) -> None:
    machine.handle(requested("t1", now_ms=0, ttl_ms=1_000))
    old_lease = timer_of(machine, TimerKind.SLOT_LEASE, "slot-0")
    machine.handle(submitted("t1", now_ms=100, slot_id="slot-0"))
    machine.handle(prepared("t1", slot_id="slot-0", now_ms=200))
    fail_builder(machine, "t1", now_ms=300)
    machine.handle(requested("t2", now_ms=400, ttl_ms=5_000))
    assert machine.slot_views()[0] == SlotView(
        slot_id="slot-0", state=SlotState.ALLOCATED, task_id="t2", lease_expires_at_ms=5_400
    )
    before = observe(machine, "t1", "t2")

    assert machine.handle(fired(old_lease, now_ms=1_000)) == Step()

    assert observe(machine, "t1", "t2") == before
    assert timer_of(machine, TimerKind.SLOT_LEASE, "slot-0").due_ms == 5_400


def test_an_already_fired_lease_timer_does_nothing_to_the_next_reservation(
    machine: SlotMachine,
) -> None:
    machine.handle(requested("t1", now_ms=0, ttl_ms=1_000))
    lease = timer_of(machine, TimerKind.SLOT_LEASE, "slot-0")
    machine.handle(fired(lease, now_ms=1_000))
    machine.handle(requested("t2", now_ms=1_000, ttl_ms=1_000))
    before = observe(machine, "t1", "t2")

    # Same slot, same due time, but the ticket belongs to the old reservation.
    assert machine.handle(fired(lease, now_ms=2_000)) == Step()

    assert observe(machine, "t1", "t2") == before
    assert _state(machine, "t2") == (TaskState.ALLOCATED, None)


def test_a_deadline_timer_of_a_task_since_ended_does_nothing(machine: SlotMachine) -> None:
    start_task(machine, "t1", now_ms=0)
    deadline = timer_of(machine, TimerKind.TASK_DEADLINE, "t1")
    fail_builder(machine, "t1", now_ms=500)
    before = observe(machine, "t1")

    assert machine.handle(fired(deadline, now_ms=60_000)) == Step()

    assert observe(machine, "t1") == before
    result = machine.get_result("t1").result
    assert result is not None
    assert result.failure_code == FailureCode.BUILDER_FAILED


def test_a_deadline_timer_from_before_a_purge_does_nothing_to_the_reused_id(
    machine: SlotMachine,
) -> None:
    start_task(machine, "t1", now_ms=0)
    old_deadline = timer_of(machine, TimerKind.TASK_DEADLINE, "t1")
    fail_builder(machine, "t1", now_ms=500)
    machine.handle(fired(timer_of(machine, TimerKind.RESULT_RETENTION, "t1"), now_ms=30_500))
    start_task(machine, "t1", now_ms=40_000)
    assert timer_of(machine, TimerKind.TASK_DEADLINE, "t1").due_ms == 100_000
    before = observe(machine, "t1")

    assert machine.handle(fired(old_deadline, now_ms=60_000)) == Step()

    assert observe(machine, "t1") == before
    assert _state(machine, "t1") == (TaskState.RUNNING, TaskPhase.BUILDER)


# ------------------------------------------------------------------- watch


def test_with_grace_0_a_disconnect_never_fails_the_task(machine: SlotMachine) -> None:
    start_task(machine, "t1", now_ms=0)
    assert machine.handle(WatchAttached(task_id="t1", now_ms=100, stimulus_id="w1")) == Step()
    before = observe(machine, "t1")

    assert machine.handle(WatchDisconnected(task_id="t1", now_ms=200, stimulus_id="w2")) == Step()

    assert observe(machine, "t1") == before
    assert current_timers(machine) == ((TimerKind.TASK_DEADLINE, "t1", 60_000),)
    assert machine.due_timers(59_999) == ()


def test_a_disconnect_arms_the_grace_and_its_timer_fails_the_task(watched: SlotMachine) -> None:
    start_task(watched, "t1", now_ms=0)
    watched.handle(WatchAttached(task_id="t1", now_ms=100, stimulus_id="w1"))

    assert watched.handle(WatchDisconnected(task_id="t1", now_ms=500, stimulus_id="w2")) == Step()

    assert current_timers(watched) == (
        (TimerKind.WATCH_GRACE, "t1", 1_500),
        (TimerKind.TASK_DEADLINE, "t1", 60_000),
    )
    assert watched.next_deadline_ms() == 1_500
    grace = timer_of(watched, TimerKind.WATCH_GRACE, "t1")
    before = observe(watched, "t1")
    assert watched.handle(fired(grace, now_ms=1_499)) == Step()
    assert observe(watched, "t1") == before

    step = watched.handle(fired(grace, now_ms=1_500, stimulus_id="s6"))

    result = TaskResult(
        task_id="t1",
        slot_id="slot-0",
        state=TaskState.FAILED,
        phase=TaskPhase.BUILDER,
        failure_code=FailureCode.WATCH_DISCONNECTED,
        message="no watcher reattached within 1000 ms",
        retryable=False,
        timings=PhaseTimings(preparing_ms=0, builder_ms=1_500, total_ms=1_500),
        task_code_epoch="e1",
        accepted_at_ms=0,
        finished_at_ms=1_500,
    )
    assert step == Step(
        reply=TaskSnapshot(
            task_id="t1",
            slot_id="slot-0",
            state=TaskState.FAILED,
            phase=TaskPhase.TERMINAL,
            result=result,
        ),
        commands=(ConvergeTask(task_id="t1", result=result, stimulus_id="s6"),),
    )
    assert watched.slot_views()[0].state is SlotState.FREE


def test_reattaching_within_the_grace_makes_the_grace_timer_stale(watched: SlotMachine) -> None:
    start_task(watched, "t1", now_ms=0)
    watched.handle(WatchAttached(task_id="t1", now_ms=100, stimulus_id="w1"))
    watched.handle(WatchDisconnected(task_id="t1", now_ms=500, stimulus_id="w2"))
    old_grace = timer_of(watched, TimerKind.WATCH_GRACE, "t1")

    assert watched.handle(WatchAttached(task_id="t1", now_ms=900, stimulus_id="w3")) == Step()

    assert current_timers(watched) == ((TimerKind.TASK_DEADLINE, "t1", 60_000),)
    before = observe(watched, "t1")
    assert watched.handle(fired(old_grace, now_ms=1_500)) == Step()
    assert observe(watched, "t1") == before
    assert _state(watched, "t1") == (TaskState.RUNNING, TaskPhase.BUILDER)

    # A second disconnect arms a fresh grace; the first timer stays stale.
    watched.handle(WatchDisconnected(task_id="t1", now_ms=2_000, stimulus_id="w4"))
    assert timer_of(watched, TimerKind.WATCH_GRACE, "t1").due_ms == 3_000
    assert watched.handle(fired(old_grace, now_ms=2_500)) == Step()
    assert _state(watched, "t1") == (TaskState.RUNNING, TaskPhase.BUILDER)


def test_a_clean_detach_arms_nothing(watched: SlotMachine) -> None:
    start_task(watched, "t1", now_ms=0)
    watched.handle(WatchAttached(task_id="t1", now_ms=100, stimulus_id="w1"))
    before = observe(watched, "t1")

    assert watched.handle(WatchDetached(task_id="t1", now_ms=500, stimulus_id="w2")) == Step()

    assert observe(watched, "t1") == before
    assert current_timers(watched) == ((TimerKind.TASK_DEADLINE, "t1", 60_000),)


def test_a_disconnect_without_an_attached_watch_arms_nothing(watched: SlotMachine) -> None:
    start_task(watched, "t1", now_ms=0)
    before = observe(watched, "t1")

    assert watched.handle(WatchDisconnected(task_id="t1", now_ms=500, stimulus_id="w1")) == Step()

    assert observe(watched, "t1") == before


def test_a_reservation_disconnected_before_submit_arms_the_grace_at_submit(
    watched: SlotMachine,
) -> None:
    watched.handle(requested("t1", now_ms=0, ttl_ms=10_000))
    watched.handle(WatchAttached(task_id="t1", now_ms=100, stimulus_id="w1"))
    watched.handle(WatchDisconnected(task_id="t1", now_ms=200, stimulus_id="w2"))
    # Nothing to reclaim yet: an unsubmitted reservation only has its lease.
    assert current_timers(watched) == ((TimerKind.SLOT_LEASE, "slot-0", 10_000),)

    watched.handle(submitted("t1", now_ms=2_000, slot_id="slot-0"))

    assert current_timers(watched) == (
        (TimerKind.WATCH_GRACE, "t1", 3_000),
        (TimerKind.SLOT_LEASE, "slot-0", 10_000),
        (TimerKind.TASK_DEADLINE, "t1", 62_000),
    )
    step = watched.handle(fired(timer_of(watched, TimerKind.WATCH_GRACE, "t1"), now_ms=3_000))
    assert step.reply is not None
    assert step.reply.result is not None
    assert (
        step.reply.result.phase,
        step.reply.result.failure_code,
        step.reply.result.retryable,
    ) == (TaskPhase.PREPARING, FailureCode.WATCH_DISCONNECTED, False)


def test_a_reservation_detached_cleanly_before_submit_arms_nothing_at_submit(
    watched: SlotMachine,
) -> None:
    """A clean detach arms nothing, whether it comes before or after the submit.

    After the submit a clean detach disarms the grace; before it, the submit must
    not treat the cleanly ended watch as a broken one.
    """
    watched.handle(requested("t1", now_ms=0, ttl_ms=10_000))
    watched.handle(WatchAttached(task_id="t1", now_ms=100, stimulus_id="w1"))
    watched.handle(WatchDetached(task_id="t1", now_ms=200, stimulus_id="w2"))

    watched.handle(submitted("t1", now_ms=2_000, slot_id="slot-0"))

    # A clean detach is not a lost client: there is nothing to reclaim.
    assert current_timers(watched) == (
        (TimerKind.SLOT_LEASE, "slot-0", 10_000),
        (TimerKind.TASK_DEADLINE, "t1", 62_000),
    )


def test_a_reservation_still_watched_at_submit_arms_nothing(watched: SlotMachine) -> None:
    watched.handle(requested("t1", now_ms=0, ttl_ms=10_000))
    watched.handle(WatchAttached(task_id="t1", now_ms=100, stimulus_id="w1"))

    watched.handle(submitted("t1", now_ms=2_000, slot_id="slot-0"))

    assert current_timers(watched) == (
        (TimerKind.SLOT_LEASE, "slot-0", 10_000),
        (TimerKind.TASK_DEADLINE, "t1", 62_000),
    )


def test_watch_events_for_unknown_or_ended_tasks_are_ignored(watched: SlotMachine) -> None:
    start_task(watched, "t1", now_ms=0)
    fail_builder(watched, "t1", now_ms=100)
    before = observe(watched, "t1", "ghost")

    events: list[Event] = [
        WatchAttached(task_id="ghost", now_ms=200, stimulus_id="w1"),
        WatchDisconnected(task_id="ghost", now_ms=200, stimulus_id="w2"),
        WatchDetached(task_id="ghost", now_ms=200, stimulus_id="w3"),
        WatchAttached(task_id="t1", now_ms=200, stimulus_id="w4"),
        WatchDisconnected(task_id="t1", now_ms=300, stimulus_id="w5"),
        WatchDetached(task_id="t1", now_ms=300, stimulus_id="w6"),
    ]
    for event in events:
        assert watched.handle(event) == Step()

    assert observe(watched, "t1", "ghost") == before


# ------------------------------------------------- next_deadline / due_timers


def test_next_deadline_is_none_when_nothing_is_armed(machine: SlotMachine) -> None:
    assert machine.next_deadline_ms() is None
    assert machine.due_timers(FAR_FUTURE_MS) == ()


def test_next_deadline_is_the_earliest_current_timer_and_skips_stale_ones(
    machine: SlotMachine,
) -> None:
    machine.handle(requested("t1", now_ms=0, ttl_ms=1_000))  # slot-0 lease at 1000
    machine.handle(submitted("t2", now_ms=0))  # slot-1 lease at 5000, deadline 60000
    machine.handle(requested("t3", now_ms=0, ttl_ms=3_000))  # slot-2 lease at 3000
    assert machine.next_deadline_ms() == 1_000
    machine.handle(prepared("t2", slot_id="slot-1", now_ms=10))  # slot-1 lease now stale

    machine.handle(fired(timer_of(machine, TimerKind.SLOT_LEASE, "slot-0"), now_ms=1_000))
    assert machine.next_deadline_ms() == 3_000

    machine.handle(fired(timer_of(machine, TimerKind.SLOT_LEASE, "slot-2"), now_ms=3_000))
    # The stale lease of slot-1 (due at 5000) is skipped.
    assert machine.next_deadline_ms() == 60_000


def test_due_timers_lists_the_current_due_timers_earliest_first_and_changes_nothing(
    machine: SlotMachine,
) -> None:
    machine.handle(requested("t1", now_ms=0, ttl_ms=3_000))  # slot-0 lease at 3000
    machine.handle(submitted("t2", now_ms=0))  # slot-1 lease at 5000, deadline 60000
    machine.handle(requested("t3", now_ms=0, ttl_ms=1_000))  # slot-2 lease at 1000
    machine.handle(prepared("t2", slot_id="slot-1", now_ms=10))  # slot-1 lease now stale
    before = observe(machine, "t1", "t2", "t3")

    due = machine.due_timers(5_000)

    assert [(timer.kind, timer.key, timer.due_ms) for timer in due] == [
        (TimerKind.SLOT_LEASE, "slot-2", 1_000),
        (TimerKind.SLOT_LEASE, "slot-0", 3_000),
    ]
    assert machine.due_timers(5_000) == due
    assert machine.due_timers(999) == ()
    assert machine.due_timers(1_000) == due[:1]
    assert observe(machine, "t1", "t2", "t3") == before
    assert machine.next_deadline_ms() == 1_000

    # Fed back in order, each does what it says.
    for timer in due:
        step = machine.handle(fired(timer, now_ms=5_000))
        assert [type(command).__name__ for command in step.commands] == ["ForgetTask"]
    assert machine.due_timers(5_000) == ()
    assert current_timers(machine) == ((TimerKind.TASK_DEADLINE, "t2", 60_000),)
