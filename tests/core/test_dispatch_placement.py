"""Placement of calls by the dispatch core: most room first, executor capacity,
one batch per executor per step, the per-task window and round-robin fairness.
"""

from __future__ import annotations

import pytest

from blockx.calls import CallPhaseOutcome, CallStats
from blockx.dispatch import DispatchCommand, DispatchCore, FinishCallPhase, RunCalls
from blockx.errors import Misuse
from tests.core.dispatch_helpers import (
    added,
    arrived,
    call_policy,
    dispatch,
    joined,
    ok,
    opened,
    revoke,
    revoked,
    run,
    start,
    ticked,
    value_of,
)

# ------------------------------------------------------------------ placement


def test_calls_of_one_task_spread_over_executors_by_most_room(core: DispatchCore) -> None:
    assert core.handle(joined("e0", capacity=2, now_ms=0)).commands == ()
    assert core.handle(joined("e1", capacity=3, now_ms=0)).commands == ()

    commands = start(core, "t1", "c0", "c1", "c2", "c3", now_ms=10)

    # Rooms (e0, e1): (2, 3) -> e1; (2, 2) -> e0, the first on a tie; (1, 2) -> e1;
    # (1, 1) -> e0.
    assert commands == (
        run("e1", dispatch("c0", at_ms=10), dispatch("c2", at_ms=10)),
        run("e0", dispatch("c1", at_ms=10), dispatch("c3", at_ms=10)),
    )
    assert core.running_calls("e0") == ("c1", "c3")
    assert core.running_calls("e1") == ("c0", "c2")


def test_executor_capacity_is_respected_and_results_free_room(core: DispatchCore) -> None:
    core.handle(joined("e0", capacity=2, now_ms=0))

    assert start(core, "t1", "c0", "c1", "c2", "c3", "c4", now_ms=0) == (
        run("e0", dispatch("c0", at_ms=0), dispatch("c1", at_ms=0)),
    )
    assert core.handle(arrived("e0", ok("c0"), now_ms=5)).commands == (
        run("e0", dispatch("c2", at_ms=5)),
    )
    assert core.handle(arrived("e0", ok("c1"), ok("c2"), now_ms=7)).commands == (
        run("e0", dispatch("c3", at_ms=7), dispatch("c4", at_ms=7)),
    )
    assert core.running_calls("e0") == ("c3", "c4")

    assert core.handle(arrived("e0", ok("c4"), ok("c3"), now_ms=9)).commands == (
        FinishCallPhase(
            task_id="t1",
            outcome=CallPhaseOutcome(
                ok=True,
                stats=CallStats(calls_total=5, calls_succeeded=5),
                outputs=tuple(value_of(f"c{index}") for index in range(5)),
            ),
        ),
    )
    assert core.running_calls("e0") == ()
    assert core.task_ids() == ()


def test_nothing_is_dispatched_before_an_executor_joins(core: DispatchCore) -> None:
    assert start(core, "t1", "c0", "c1", "c2", now_ms=0) == ()
    assert core.next_deadline_ms() is None

    assert core.handle(joined("e0", capacity=8, now_ms=50)).commands == (
        run(
            "e0",
            dispatch("c0", at_ms=50),
            dispatch("c1", at_ms=50),
            dispatch("c2", at_ms=50),
        ),
    )
    assert core.next_deadline_ms() == 50 + 60_000


def test_one_run_calls_per_executor_per_step_across_tasks(core: DispatchCore) -> None:
    assert start(core, "t1", "a0", "a1", "a2", now_ms=0) == ()
    assert start(core, "t2", "b0", "b1", now_ms=1) == ()

    assert core.handle(joined("e0", capacity=2, now_ms=5)).commands == (
        run("e0", dispatch("a0", at_ms=5), dispatch("b0", at_ms=5, task_id="t2")),
    )
    assert core.handle(joined("e1", capacity=8, now_ms=6)).commands == (
        run(
            "e1",
            dispatch("a1", at_ms=6),
            dispatch("b1", at_ms=6, task_id="t2"),
            dispatch("a2", at_ms=6),
        ),
    )


# --------------------------------------------------------------------- window


def test_window_caps_the_running_calls_of_a_task(core: DispatchCore) -> None:
    core.handle(joined("e0", capacity=10, now_ms=0))

    assert start(
        core, "t1", "c0", "c1", "c2", "c3", "c4", now_ms=0, policy=call_policy(window=2)
    ) == (run("e0", dispatch("c0", at_ms=0), dispatch("c1", at_ms=0)),)
    # A result frees one window slot and the next call goes out in the same step.
    assert core.handle(arrived("e0", ok("c1"), now_ms=5)).commands == (
        run("e0", dispatch("c2", at_ms=5)),
    )
    assert core.handle(arrived("e0", ok("c0"), ok("c2"), now_ms=6)).commands == (
        run("e0", dispatch("c3", at_ms=6), dispatch("c4", at_ms=6)),
    )
    assert core.running_calls("e0") == ("c3", "c4")


def test_a_full_window_leaves_room_to_other_tasks(core: DispatchCore) -> None:
    core.handle(joined("e0", capacity=4, now_ms=0))

    assert start(core, "t1", "a0", "a1", "a2", now_ms=0, policy=call_policy(window=1)) == (
        run("e0", dispatch("a0", at_ms=0)),
    )
    assert start(core, "t2", "b0", "b1", now_ms=1) == (
        run("e0", dispatch("b0", at_ms=1, task_id="t2"), dispatch("b1", at_ms=1, task_id="t2")),
    )
    assert core.running_calls("e0") == ("a0", "b0", "b1")

    assert core.handle(arrived("e0", ok("a0"), now_ms=2)).commands == (
        run("e0", dispatch("a1", at_ms=2)),
    )


# ------------------------------------------------------------------- fairness


def test_two_tasks_alternate_round_robin_on_one_executor(core: DispatchCore) -> None:
    start(core, "t1", "a0", "a1", "a2", "a3", now_ms=0)
    start(core, "t2", "b0", "b1", "b2", "b3", now_ms=0)

    assert core.handle(joined("e0", capacity=1, now_ms=0)).commands == (
        run("e0", dispatch("a0", at_ms=0)),
    )

    expected = [("t2", "b0"), ("t1", "a1"), ("t2", "b1"), ("t1", "a2"), ("t2", "b2"), ("t1", "a3")]
    running = "a0"
    for step, (task_id, call_id) in enumerate(expected, start=1):
        now_ms = 10 * step
        assert core.handle(arrived("e0", ok(running), now_ms=now_ms)).commands == (
            run("e0", dispatch(call_id, at_ms=now_ms, task_id=task_id)),
        )
        running = call_id


def test_three_tasks_take_turns_in_a_fixed_rotation(core: DispatchCore) -> None:
    assert start(core, "t1", "a0", "a1", "a2", now_ms=0) == ()
    assert start(core, "t2", "b0", "b1", "b2", now_ms=0) == ()
    assert start(core, "t3", "c0", "c1", "c2", now_ms=0) == ()
    assert core.handle(joined("e0", capacity=1, now_ms=0)).commands == (
        run("e0", dispatch("a0", at_ms=0)),
    )

    expected = [
        ("t2", "b0"),
        ("t3", "c0"),
        ("t1", "a1"),
        ("t2", "b1"),
        ("t3", "c1"),
        ("t1", "a2"),
    ]
    running = "a0"
    for step, (task_id, call_id) in enumerate(expected, start=1):
        now_ms = 10 * step
        assert core.handle(arrived("e0", ok(running), now_ms=now_ms)).commands == (
            run("e0", dispatch(call_id, at_ms=now_ms, task_id=task_id)),
        )
        running = call_id


def test_a_task_added_later_joins_the_rotation_at_once(core: DispatchCore) -> None:
    start(core, "t1", *(f"a{index}" for index in range(6)), now_ms=0)
    start(core, "t2", *(f"b{index}" for index in range(6)), now_ms=0)
    assert core.handle(joined("e0", capacity=1, now_ms=0)).commands == (
        run("e0", dispatch("a0", at_ms=0)),
    )
    assert core.handle(arrived("e0", ok("a0"), now_ms=10)).commands == (
        run("e0", dispatch("b0", at_ms=10, task_id="t2")),
    )
    assert core.handle(arrived("e0", ok("b0"), now_ms=20)).commands == (
        run("e0", dispatch("a1", at_ms=20)),
    )

    # t3 enters the ring behind the tasks already waiting in it (t2, then t1,
    # which has just been served): within one round it has its first turn,
    # and from then on it takes every third one, long before t1 and t2 run out.
    assert core.handle(opened("t3", now_ms=25)).commands == ()
    assert core.handle(added("t3", "c0", "c1", "c2", "c3", now_ms=25)).commands == ()

    expected = [
        ("t2", "b1"),
        ("t1", "a2"),
        ("t3", "c0"),
        ("t2", "b2"),
        ("t1", "a3"),
        ("t3", "c1"),
        ("t2", "b3"),
        ("t1", "a4"),
        ("t3", "c2"),
    ]
    running = "a1"
    for step, (task_id, call_id) in enumerate(expected, start=3):
        now_ms = 10 * step
        assert core.handle(arrived("e0", ok(running), now_ms=now_ms)).commands == (
            run("e0", dispatch(call_id, at_ms=now_ms, task_id=task_id)),
        )
        running = call_id


# ------------------------------------------------------------------- stealing


def test_no_call_waits_behind_a_long_one_while_an_executor_has_nothing(
    core: DispatchCore,
) -> None:
    """One long call and four short ones on two executors (the issue's case)."""
    core.handle(joined("e0", capacity=64, now_ms=0))
    core.handle(joined("e1", capacity=64, now_ms=0))

    # Idle executors first, then the most room: e0 gets the long call and two short ones.
    assert start(core, "t1", "long", "s1", "s2", "s3", "s4", now_ms=0) == (
        run("e0", dispatch("long", at_ms=0), dispatch("s2", at_ms=0), dispatch("s4", at_ms=0)),
        run("e1", dispatch("s1", at_ms=0), dispatch("s3", at_ms=0)),
    )

    # e1 is done: the newer half of what waits behind "long" is asked back ...
    assert core.handle(arrived("e1", ok("s1"), ok("s3"), now_ms=500)).commands == (
        revoke("e0", ("s4", 1)),
    )
    # ... given back unstarted, and run on e1 (the attempt does not count).
    assert core.handle(arrived("e0", revoked("s4"), now_ms=501)).commands == (
        run("e1", dispatch("s4", at_ms=501, attempt=2)),
    )
    assert core.handle(arrived("e1", ok("s4", attempt=2), now_ms=1_000)).commands == (
        revoke("e0", ("s2", 1)),
    )
    assert core.handle(arrived("e0", revoked("s2"), now_ms=1_001)).commands == (
        run("e1", dispatch("s2", at_ms=1_001, attempt=2)),
    )
    # Nothing queued is left behind "long": e1 stays idle without asking again.
    assert core.handle(arrived("e1", ok("s2", attempt=2), now_ms=1_500)).commands == ()
    assert core.running_calls("e0") == ("long",)

    done = core.handle(arrived("e0", ok("long"), now_ms=3_000)).commands
    assert done == (
        FinishCallPhase(
            task_id="t1",
            outcome=CallPhaseOutcome(
                ok=True,
                stats=CallStats(calls_total=5, calls_succeeded=5),
                outputs=tuple(value_of(c) for c in ("long", "s1", "s2", "s3", "s4")),
            ),
        ),
    )


def test_a_call_asked_back_after_it_started_runs_on_and_counts_once(
    core: DispatchCore,
) -> None:
    core.handle(joined("e0", capacity=4, now_ms=0))
    assert start(core, "t1", "c0", "c1", now_ms=0) == (
        run("e0", dispatch("c0", at_ms=0), dispatch("c1", at_ms=0)),
    )
    assert core.handle(joined("e1", capacity=4, now_ms=10)).commands == (revoke("e0", ("c1", 1)),)
    # e0 had started c1: it says nothing of the revoke and answers c1 as usual.
    assert core.handle(arrived("e0", ok("c1"), now_ms=20)).commands == ()
    assert core.handle(ticked(30)).commands == ()  # c1 is not asked back again
    done = core.handle(arrived("e0", ok("c0"), now_ms=40)).commands
    assert done == (
        FinishCallPhase(
            task_id="t1",
            outcome=CallPhaseOutcome(
                ok=True,
                stats=CallStats(calls_total=2, calls_succeeded=2),
                outputs=(value_of("c0"), value_of("c1")),
            ),
        ),
    )


def test_a_revoke_answer_that_was_not_asked_for_is_a_failed_attempt(
    core: DispatchCore,
) -> None:
    core.handle(joined("e0", capacity=1, now_ms=0))
    start(core, "t1", "c0", now_ms=0, policy=call_policy(base_backoff_ms=0))
    assert core.handle(arrived("e0", revoked("c0"), now_ms=5)).commands == (
        run("e0", dispatch("c0", at_ms=5, attempt=2)),
    )


# ------------------------------------------------------------ paced queues (rule 8)


def _placed(commands: tuple[DispatchCommand, ...]) -> int:
    """How many calls `commands` place, on any executor."""
    return sum(len(c.calls) for c in commands if isinstance(c, RunCalls))


def _ended_on(core: DispatchCore, executor_id: str, count: int, now_ms: int) -> int:
    """The `count` oldest calls running on `executor_id` succeed at `now_ms`; returns how
    many calls the step then placed on it."""
    done = tuple(ok(call_id) for call_id in core.running_calls(executor_id)[:count])
    return _placed(core.handle(arrived(executor_id, *done, now_ms=now_ms)).commands)


def test_a_paced_queue_deepens_for_short_calls_and_shrinks_for_long_ones() -> None:
    core = DispatchCore(queue_ms=10)
    core.handle(joined("e0", capacity=200, now_ms=0))
    core.handle(opened("t1", now_ms=0, policy=call_policy(window=1000)))
    many = [f"c{index}" for index in range(1000)]
    # No pace yet: 64 calls, as before queues were paced.
    assert _placed(core.handle(added("t1", *many, now_ms=0)).commands) == 64
    assert core.executor_depth("e0") == 64
    # 64 ended 1 ms after they were sent: 15.6 us a call, 10 ms of them is 640: the
    # capacity, 200, bounds the queue.
    assert _ended_on(core, "e0", 64, now_ms=1) == 200
    assert core.executor_depth("e0") == 200
    # 2 ended 100 ms later: 50 ms a call (averaged: 25 ms): two at a time, one waiting.
    assert _ended_on(core, "e0", 2, now_ms=101) == 0
    assert core.executor_depth("e0") == 2
    assert len(core.running_calls("e0")) == 198  # already queued: not taken back


def test_a_paced_queue_forgets_its_pace_once_idle_for_longer_than_its_target() -> None:
    core = DispatchCore(queue_ms=10)
    core.handle(joined("e0", capacity=200, now_ms=0))
    start(core, "t1", "c0", "c1", now_ms=0)
    core.handle(arrived("e0", ok("c0"), ok("c1"), now_ms=100))  # 50 ms a call
    assert core.executor_depth("e0") == 2
    # Idle 10 ms: the pace still holds.
    assert _placed(start(core, "t2", "b0", "b1", "b2", now_ms=110)) == 2
    assert _ended_on(core, "e0", 2, now_ms=120) == 1
    assert _ended_on(core, "e0", 1, now_ms=130) == 0
    assert core.running_calls("e0") == ()
    # Idle 11 ms: 64, as if new.
    assert _placed(start(core, "t3", *[f"d{index}" for index in range(100)], now_ms=141)) == 64
    assert core.executor_depth("e0") == 64


def test_queue_ms_must_be_positive() -> None:
    with pytest.raises(Misuse, match="queue_ms must be >= 1"):
        DispatchCore(queue_ms=0)
