"""Misuse of the dispatch core is refused with `Misuse` and changes
nothing: invalid policies and draws, calls added to a closed or unknown task,
call ids used twice, a task opened twice, an executor joined twice. Refused
events are named in the core's stimulus log like the others.
"""

from __future__ import annotations

from typing import Any

import pytest

from blockx.calls import CallPhaseOutcome, CallStats, FailureCode
from blockx.dispatch import (
    CallResultsArrived,
    ClockTicked,
    DispatchCore,
    DispatchEvent,
    ExecutorLeft,
    FinishCallPhase,
)
from blockx.errors import Misuse
from blockx.steps import RECENT_STIMULI
from tests.core.dispatch_helpers import (
    added,
    arrived,
    call_policy,
    dispatch,
    failed,
    joined,
    observe,
    ok,
    opened,
    run,
    start,
    ticked,
    value_of,
)

# --------------------------------------------------------- policies and draws


@pytest.mark.parametrize(
    "fields",
    [
        pytest.param({"window": 0}, id="window-0"),
        pytest.param({"max_attempts": 0}, id="max-attempts-0"),
        pytest.param({"base_backoff_ms": -1}, id="negative-backoff"),
        pytest.param({"jitter_percent": -1}, id="negative-jitter"),
        pytest.param({"jitter_percent": 6}, id="jitter-over-5"),
        pytest.param({"jitter_percent": 101}, id="jitter-over-100"),
        pytest.param({"call_deadline_ms": 0}, id="deadline-0"),
    ],
)
def test_an_invalid_call_policy_is_misuse(fields: dict[str, Any]) -> None:
    with pytest.raises(Misuse, match="invalid call policy"):
        call_policy(**fields)


def test_the_smallest_and_largest_valid_policy_figures_are_accepted() -> None:
    call_policy(window=1, max_attempts=1, base_backoff_ms=0, jitter_percent=0, call_deadline_ms=1)
    call_policy(jitter_percent=5)


@pytest.mark.parametrize("draw", [-0.001, 1.0, 1.5])
def test_a_draw_outside_zero_to_one_is_misuse(draw: float) -> None:
    with pytest.raises(Misuse, match="draw"):
        ClockTicked(now_ms=0, draw=draw, stimulus_id="s1")
    with pytest.raises(Misuse, match="draw"):
        CallResultsArrived(executor_id="e0", outcomes=(), now_ms=0, draw=draw, stimulus_id="s1")
    with pytest.raises(Misuse, match="draw"):
        ExecutorLeft(
            executor_id="e0",
            error_code=FailureCode.EXECUTOR_LOST,
            now_ms=0,
            draw=draw,
            stimulus_id="s1",
        )


@pytest.mark.parametrize("draw", [0.0, 0.999])
def test_draws_in_zero_to_one_are_accepted(draw: float) -> None:
    assert ClockTicked(now_ms=0, draw=draw, stimulus_id="s1").draw == draw


# -------------------------------------------------------------------- tasks


def test_adding_calls_to_an_unknown_task_is_misuse(core: DispatchCore) -> None:
    core.handle(joined("e0", capacity=1, now_ms=0))
    before = observe(core)

    with pytest.raises(Misuse):
        core.handle(added("t1", "c0", now_ms=0))
    assert observe(core) == before


def test_adding_calls_to_a_sealed_task_is_misuse(core: DispatchCore) -> None:
    core.handle(joined("e0", capacity=1, now_ms=0))
    start(core, "t1", "c0", now_ms=0)
    before = observe(core)

    with pytest.raises(Misuse):
        core.handle(added("t1", "c1", now_ms=1))
    with pytest.raises(Misuse):
        core.handle(added("t1", now_ms=1))
    assert observe(core) == before


def test_adding_calls_to_a_finished_task_is_misuse(core: DispatchCore) -> None:
    assert start(core, "t1", now_ms=0) == (
        FinishCallPhase(task_id="t1", outcome=CallPhaseOutcome(ok=True)),
    )

    with pytest.raises(Misuse):
        core.handle(added("t1", "c0", now_ms=1))
    assert core.task_ids() == ()


def test_opening_a_task_twice_is_misuse_and_keeps_the_first_policy(core: DispatchCore) -> None:
    core.handle(joined("e0", capacity=4, now_ms=0))
    assert core.handle(opened("t1", now_ms=0, policy=call_policy(window=1))).commands == ()

    with pytest.raises(Misuse, match="already open"):
        core.handle(opened("t1", now_ms=1, policy=call_policy(window=8)))

    assert core.handle(added("t1", "c0", "c1", now_ms=2)).commands == (
        run("e0", dispatch("c0", at_ms=2)),
    )


@pytest.mark.parametrize(
    ("first_batch", "refused_batch"),
    [
        pytest.param(("c0",), ("c1", "c0"), id="id-of-an-earlier-batch"),
        pytest.param(("c0",), ("c1", "c1"), id="id-twice-in-one-batch"),
    ],
)
def test_a_call_id_used_twice_is_misuse_and_changes_nothing(
    core: DispatchCore, first_batch: tuple[str, ...], refused_batch: tuple[str, ...]
) -> None:
    core.handle(joined("e0", capacity=4, now_ms=0))
    assert start(core, "t1", *first_batch, now_ms=0, sealed=False) == (
        run("e0", dispatch("c0", at_ms=0)),
    )
    before = observe(core)

    with pytest.raises(Misuse, match="used twice"):
        core.handle(added("t1", *refused_batch, now_ms=5))

    # Refused as a whole: c1 is not queued, the task is not sealed.
    assert observe(core) == before
    core.check_invariants()
    assert core.handle(arrived("e0", ok("c0"), now_ms=10)).commands == ()
    assert core.handle(added("t1", now_ms=20)).commands == (
        FinishCallPhase(
            task_id="t1",
            outcome=CallPhaseOutcome(
                ok=True,
                stats=CallStats(calls_total=1, calls_succeeded=1),
                outputs=(value_of("c0"),),
            ),
        ),
    )


def test_a_call_id_of_another_open_task_is_misuse(core: DispatchCore) -> None:
    # Executors answer and cancel by (call id, attempt) alone, so two open
    # tasks can never share a call id: t2's c0 would overwrite t1's on e0.
    core.handle(joined("e0", capacity=2, now_ms=0))
    assert start(core, "t1", "c0", now_ms=0) == (run("e0", dispatch("c0", at_ms=0)),)
    assert core.handle(opened("t2", now_ms=1)).commands == ()
    before = observe(core)

    with pytest.raises(Misuse, match="used twice"):
        core.handle(added("t2", "c0", now_ms=2))
    assert observe(core) == before

    assert core.handle(arrived("e0", ok("c0"), now_ms=10)).commands == (
        FinishCallPhase(
            task_id="t1",
            outcome=CallPhaseOutcome(
                ok=True,
                stats=CallStats(calls_total=1, calls_succeeded=1),
                outputs=(value_of("c0"),),
            ),
        ),
    )


# ---------------------------------------------------------------- executors


def test_joining_twice_or_without_capacity_is_misuse(core: DispatchCore) -> None:
    core.handle(joined("e0", capacity=1, now_ms=0))

    with pytest.raises(Misuse):
        core.handle(joined("e0", capacity=4, now_ms=1))
    with pytest.raises(Misuse):
        core.handle(joined("e1", capacity=0, now_ms=1))
    assert core.executor_ids() == ("e0",)


# ------------------------------------------------------------- stimulus log


def test_recent_stimuli_name_each_event_and_what_came_of_it(core: DispatchCore) -> None:
    events: list[DispatchEvent] = [
        joined("e0", capacity=2, now_ms=0, stimulus_id="join-1"),
        opened("t1", now_ms=0, stimulus_id="open-2"),
        added("t1", "c0", "c1", "c2", now_ms=0, stimulus_id="add-3"),
    ]
    for event in events:
        core.handle(event)
    refused = added("t9", "x0", now_ms=5, stimulus_id="add-4")
    with pytest.raises(Misuse):
        core.handle(refused)
    failure = arrived("e0", failed("c0"), now_ms=10, stimulus_id="results-5")
    assert [type(command).__name__ for command in core.handle(failure).commands] == [
        "CancelCalls",
        "FinishCallPhase",
    ]

    assert [(s.stimulus_id, s.event, s.outcome) for s in core.recent_stimuli] == [
        ("join-1", events[0], "-"),
        ("open-2", events[1], "-"),
        ("add-3", events[2], "RunCalls"),
        ("add-4", refused, "Misuse"),
        ("results-5", failure, "CancelCalls,FinishCallPhase"),
    ]

    # Only the last RECENT_STIMULI events are kept, oldest first.
    for index in range(RECENT_STIMULI - 1):
        core.handle(ticked(20 + index, stimulus_id=f"tick-{index}"))
    recent = core.recent_stimuli
    assert len(recent) == RECENT_STIMULI
    assert (recent[0].stimulus_id, recent[0].outcome) == (
        "results-5",
        "CancelCalls,FinishCallPhase",
    )
    assert (recent[-1].stimulus_id, recent[-1].outcome) == (f"tick-{RECENT_STIMULI - 2}", "-")


def test_an_ended_call_is_forgotten_so_a_long_stream_holds_only_calls_in_flight(
    core: DispatchCore,
) -> None:
    """A streamed task's ended calls (and their arguments) are dropped; an id that ended
    may come again in a later batch, as another call, and its value keeps call order."""
    core.handle(joined("e0", capacity=4, now_ms=0))
    assert start(core, "t1", "c0", now_ms=0, sealed=False) == (run("e0", dispatch("c0", at_ms=0)),)
    assert core.handle(arrived("e0", ok("c0"), now_ms=1)).commands == ()
    assert core.calls_ended("t1") == 1
    assert core._tasks["t1"].calls == {}  # white box: nothing of c0 is held
    core.check_invariants()
    assert core.handle(added("t1", "c0", now_ms=2, sealed=False)).commands == (
        run("e0", dispatch("c0", at_ms=2)),
    )
    assert core.handle(arrived("e0", ok("c0"), now_ms=3)).commands == ()
    [finished] = core.handle(added("t1", now_ms=4)).commands
    assert isinstance(finished, FinishCallPhase)
    assert finished.outcome.outputs == (value_of("c0"), value_of("c0"))
    assert finished.outcome.stats.calls_total == 2
