"""Subcalls in the dispatch core: the waiting parent's extra unit of room,
delivery of results and final failures to the parent, chains deeper than the
executor count, parents that are gone, and the loss of parents and subcalls.
"""

from __future__ import annotations

import pytest

from blockx.calls import CallOutcome, CallPhaseOutcome, CallStats, FailureCode
from blockx.dispatch import DispatchCommand, DispatchCore, FinishCallPhase, RunCalls
from blockx.errors import Misuse
from tests.core.dispatch_helpers import (
    arrived,
    call_policy,
    cancel,
    cancelled,
    delivered,
    dispatch,
    failed,
    joined,
    left,
    observe,
    ok,
    retryable_failure,
    run,
    start,
    subcall,
    ticked,
    value_of,
)

_REFUSED = "the calling attempt was cancelled"


def _refused(subcall_id: str) -> CallOutcome:
    """What a parent that is no longer running gets for its subcall."""
    return CallOutcome.failure(
        call_id=subcall_id,
        attempt=0,
        error_code=FailureCode.CALL_RAISED,
        error_message=_REFUSED,
        retryable=False,
    )


def _succeeded(task_id: str, *call_ids: str, subcalls: int, retried: int = 0) -> FinishCallPhase:
    return FinishCallPhase(
        task_id=task_id,
        outcome=CallPhaseOutcome(
            ok=True,
            stats=CallStats(
                calls_total=len(call_ids),
                calls_succeeded=len(call_ids),
                calls_retried=retried,
                subcalls=subcalls,
            ),
            outputs=tuple(value_of(call_id) for call_id in call_ids),
        ),
    )


# ------------------------------------------------------------ room and window


def test_a_subcall_runs_even_with_the_window_and_the_executor_full(core: DispatchCore) -> None:
    core.handle(joined("e0", capacity=1, now_ms=0))
    assert start(core, "t1", "c0", "c1", now_ms=0, policy=call_policy(window=1)) == (
        run("e0", dispatch("c0", at_ms=0)),
    )

    assert core.handle(subcall("e0", "c0", "s1", now_ms=10)).commands == (
        run("e0", dispatch("s1", at_ms=10)),
    )
    assert core.running_calls("e0") == ("c0", "s1")

    assert core.handle(arrived("e0", ok("s1"), now_ms=20)).commands == (
        delivered("e0", "c0", ok("s1")),
    )
    assert core.handle(arrived("e0", ok("c0"), now_ms=30)).commands == (
        run("e0", dispatch("c1", at_ms=30)),
    )
    assert core.handle(arrived("e0", ok("c1"), now_ms=40)).commands == (
        _succeeded("t1", "c0", "c1", subcalls=1),
    )


def test_a_subcalls_result_goes_to_its_parents_executor(core: DispatchCore) -> None:
    core.handle(joined("e0", capacity=1, now_ms=0))
    assert start(core, "t1", "c0", now_ms=0) == (run("e0", dispatch("c0", at_ms=0)),)
    core.handle(joined("e1", capacity=2, now_ms=0))

    # Rooms (e0, e1): (1, 2): the subcall goes to e1.
    assert core.handle(subcall("e0", "c0", "s1", now_ms=10)).commands == (
        run("e1", dispatch("s1", at_ms=10)),
    )
    assert core.handle(arrived("e1", ok("s1"), now_ms=20)).commands == (
        delivered("e0", "c0", ok("s1")),
    )
    assert core.handle(arrived("e0", ok("c0"), now_ms=30)).commands == (
        _succeeded("t1", "c0", subcalls=1),
    )


def test_the_waiting_parents_room_goes_to_its_subcall_first(core: DispatchCore) -> None:
    # The extra unit of room exists because c0 waits for s1: giving it to
    # another task's call would leave s1, and so a0, waiting on that call.
    core.handle(joined("e0", capacity=1, now_ms=0))
    assert start(core, "t1", "a0", now_ms=0) == (run("e0", dispatch("a0", at_ms=0)),)
    assert start(core, "t2", "b0", now_ms=0) == ()

    assert core.handle(subcall("e0", "a0", "s1", now_ms=10)).commands == (
        run("e0", dispatch("s1", at_ms=10)),
    )
    assert core.handle(arrived("e0", ok("s1"), now_ms=20)).commands == (
        delivered("e0", "a0", ok("s1")),
    )
    assert core.handle(arrived("e0", ok("a0"), now_ms=30)).commands == (
        _succeeded("t1", "a0", subcalls=1),
        run("e0", dispatch("b0", at_ms=30, task_id="t2")),
    )


def _placed(commands: tuple[DispatchCommand, ...]) -> dict[str, str]:
    """Call id -> executor id of every call the commands dispatch."""
    return {
        call.call_id: command.executor_id
        for command in commands
        if isinstance(command, RunCalls)
        for call in command.calls
    }


def test_a_parents_extra_room_never_outlasts_its_subcall(core: DispatchCore) -> None:
    # Which executor runs s1 and b0 is left open here on purpose; what must
    # hold is that once s1 answered, no executor runs more calls than its
    # capacity (e0's extra unit was lent for s1 only).
    core.handle(joined("e0", capacity=1, now_ms=0))
    assert start(core, "t1", "a0", now_ms=0) == (run("e0", dispatch("a0", at_ms=0)),)
    core.handle(joined("e1", capacity=2, now_ms=0))

    placed = _placed(core.handle(subcall("e0", "a0", "s1", now_ms=10)).commands)
    placed |= _placed(start(core, "t2", "b0", now_ms=11))
    assert set(placed) == {"s1", "b0"}

    assert core.handle(arrived(placed["s1"], ok("s1"), now_ms=20)).commands == (
        delivered("e0", "a0", ok("s1")),
    )
    core.check_invariants()
    assert len(core.running_calls("e0")) <= 1
    assert len(core.running_calls("e1")) <= 2


# ------------------------------------------------------------------- failures


def test_a_subcalls_final_failure_goes_to_its_parent_and_the_task_goes_on(
    core: DispatchCore,
) -> None:
    core.handle(joined("e0", capacity=1, now_ms=0))
    start(core, "t1", "c0", now_ms=0, policy=call_policy(max_attempts=2, base_backoff_ms=0))

    assert core.handle(subcall("e0", "c0", "s1", now_ms=10)).commands == (
        run("e0", dispatch("s1", at_ms=10)),
    )
    assert core.handle(arrived("e0", failed("s1"), now_ms=20)).commands == (
        delivered("e0", "c0", failed("s1")),
    )
    assert core.task_ids() == ("t1",)

    # A retryable failure is retried, and delivered once the attempts run out.
    assert core.handle(subcall("e0", "c0", "s2", now_ms=30)).commands == (
        run("e0", dispatch("s2", at_ms=30)),
    )
    assert core.handle(arrived("e0", retryable_failure("s2"), now_ms=40)).commands == (
        run("e0", dispatch("s2", at_ms=40, attempt=2)),
    )
    assert core.handle(arrived("e0", retryable_failure("s2", attempt=2), now_ms=50)).commands == (
        delivered("e0", "c0", retryable_failure("s2", attempt=2)),
    )

    assert core.handle(arrived("e0", ok("c0"), now_ms=60)).commands == (
        _succeeded("t1", "c0", subcalls=2, retried=1),
    )


def test_a_subcall_id_used_twice_is_misuse(core: DispatchCore) -> None:
    core.handle(joined("e0", capacity=1, now_ms=0))
    start(core, "t1", "c0", "c1", now_ms=0)
    before = observe(core)

    with pytest.raises(Misuse, match="used twice"):
        core.handle(subcall("e0", "c0", "c1", now_ms=10))
    assert observe(core) == before


# ---------------------------------------------------------------------- chains


def test_a_chain_deeper_than_the_executor_count_runs_on_one_executor(
    core: DispatchCore,
) -> None:
    core.handle(joined("e0", capacity=1, now_ms=0))
    assert start(core, "t1", "c0", now_ms=0) == (run("e0", dispatch("c0", at_ms=0)),)

    assert core.handle(subcall("e0", "c0", "s1", now_ms=10)).commands == (
        run("e0", dispatch("s1", at_ms=10)),
    )
    assert core.handle(subcall("e0", "s1", "s2", now_ms=20)).commands == (
        run("e0", dispatch("s2", at_ms=20)),
    )
    assert core.handle(subcall("e0", "s2", "s3", now_ms=30)).commands == (
        run("e0", dispatch("s3", at_ms=30)),
    )
    assert core.running_calls("e0") == ("c0", "s1", "s2", "s3")

    assert core.handle(arrived("e0", ok("s3"), now_ms=40)).commands == (
        delivered("e0", "s2", ok("s3")),
    )
    assert core.handle(arrived("e0", ok("s2"), now_ms=50)).commands == (
        delivered("e0", "s1", ok("s2")),
    )
    assert core.handle(arrived("e0", ok("s1"), now_ms=60)).commands == (
        delivered("e0", "c0", ok("s1")),
    )
    assert core.handle(arrived("e0", ok("c0"), now_ms=70)).commands == (
        _succeeded("t1", "c0", subcalls=3),
    )


# --------------------------------------------------------- parents that are gone


def test_a_subcall_of_a_cancelled_parent_is_refused_at_once(core: DispatchCore) -> None:
    core.handle(joined("e0", capacity=1, now_ms=0))
    start(core, "t1", "c0", now_ms=0)
    assert core.handle(cancelled("t1", now_ms=10)).commands == (cancel("e0", ("c0", 1)),)

    assert core.handle(subcall("e0", "c0", "s1", now_ms=20)).commands == (
        delivered("e0", "c0", _refused("s1")),
    )
    assert core.running_calls("e0") == ()


def test_a_subcall_of_a_timed_out_attempt_is_refused_at_once(core: DispatchCore) -> None:
    core.handle(joined("e0", capacity=1, now_ms=0))
    core.handle(joined("e1", capacity=1, now_ms=0))
    policy = call_policy(call_deadline_ms=1_000, base_backoff_ms=0)
    assert start(core, "t1", "c0", now_ms=0, policy=policy) == (
        run("e0", dispatch("c0", at_ms=0, deadline_after_ms=1_000)),
    )
    assert core.handle(ticked(1_001)).commands == (
        cancel("e0", ("c0", 1)),
        run("e1", dispatch("c0", at_ms=1_001, attempt=2, deadline_after_ms=1_000)),
    )

    # Attempt 1, a zombie on e0, and a request naming attempt 1 on e1: refused.
    assert core.handle(subcall("e0", "c0", "s1", now_ms=1_010)).commands == (
        delivered("e0", "c0", _refused("s1")),
    )
    assert core.handle(subcall("e1", "c0", "s1", now_ms=1_011)).commands == (
        delivered("e1", "c0", _refused("s1")),
    )
    assert core.running_calls("e0") == ()
    assert core.running_calls("e1") == ("c0",)

    # The running attempt 2 may ask.
    assert core.handle(subcall("e1", "c0", "s1", now_ms=1_020, parent_attempt=2)).commands == (
        run("e1", dispatch("s1", at_ms=1_020, deadline_after_ms=1_000)),
    )


def test_a_subcall_from_an_unknown_executor_is_dropped(core: DispatchCore) -> None:
    core.handle(joined("e0", capacity=1, now_ms=0))
    start(core, "t1", "c0", now_ms=0)
    before = observe(core)

    assert core.handle(subcall("e9", "c0", "s1", now_ms=10)).commands == ()
    assert observe(core) == before


# -------------------------------------------------------------------- losses


def test_a_parent_lost_with_its_executor_abandons_its_subcalls(core: DispatchCore) -> None:
    core.handle(joined("e0", capacity=1, now_ms=0))
    start(core, "t1", "c0", now_ms=0, policy=call_policy(base_backoff_ms=0))
    core.handle(joined("e1", capacity=2, now_ms=0))
    assert core.handle(subcall("e0", "c0", "s1", now_ms=10)).commands == (
        run("e1", dispatch("s1", at_ms=10)),
    )

    # The retry waits while e1 holds the abandoned subcall (it is being stopped).
    assert core.handle(left("e0", now_ms=50)).commands == (cancel("e1", ("s1", 1)),)
    # The abandoned subcall's late answer is dropped, and e1 takes the retry.
    assert core.handle(arrived("e1", ok("s1"), now_ms=60)).commands == (
        run("e1", dispatch("c0", at_ms=60, attempt=2)),
    )
    assert core.handle(arrived("e1", ok("c0", attempt=2), now_ms=70)).commands == (
        _succeeded("t1", "c0", subcalls=1, retried=1),
    )


def test_a_parent_and_its_subcall_lost_together_retry_the_parent(core: DispatchCore) -> None:
    core.handle(joined("e0", capacity=1, now_ms=0))
    start(core, "t1", "c0", now_ms=0, policy=call_policy(base_backoff_ms=0))
    assert core.handle(subcall("e0", "c0", "s1", now_ms=10)).commands == (
        run("e0", dispatch("s1", at_ms=10)),
    )
    core.handle(joined("e1", capacity=1, now_ms=20))

    assert core.handle(left("e0", now_ms=50)).commands == (
        run("e1", dispatch("c0", at_ms=50, attempt=2)),
    )
    assert core.handle(arrived("e0", ok("s1"), ok("c0"), now_ms=60)).commands == ()
    assert core.running_calls("e1") == ("c0",)


def test_a_subcall_lost_with_its_executor_is_retried(core: DispatchCore) -> None:
    core.handle(joined("e0", capacity=1, now_ms=0))
    start(core, "t1", "c0", now_ms=0, policy=call_policy(base_backoff_ms=0))
    core.handle(joined("e1", capacity=2, now_ms=0))
    assert core.handle(subcall("e0", "c0", "s1", now_ms=10)).commands == (
        run("e1", dispatch("s1", at_ms=10)),
    )

    # The parent still waits, so e0 has room for the retry.
    assert core.handle(left("e1", now_ms=50)).commands == (
        run("e0", dispatch("s1", at_ms=50, attempt=2)),
    )
    assert core.handle(arrived("e0", ok("s1", attempt=2), now_ms=60)).commands == (
        delivered("e0", "c0", ok("s1", attempt=2)),
    )
    assert core.handle(arrived("e0", ok("c0"), now_ms=70)).commands == (
        _succeeded("t1", "c0", subcalls=1, retried=1),
    )


def test_a_parent_past_its_deadline_abandons_its_subcalls(core: DispatchCore) -> None:
    core.handle(joined("e0", capacity=1, now_ms=0))
    start(core, "t1", "c0", now_ms=0, policy=call_policy(call_deadline_ms=1_000))
    assert core.handle(subcall("e0", "c0", "s1", now_ms=10)).commands == (
        run("e0", dispatch("s1", at_ms=10, deadline_after_ms=1_000)),
    )

    assert core.handle(ticked(1_001)).commands == (cancel("e0", ("s1", 1)), cancel("e0", ("c0", 1)))
    # Both cancelled attempts hold e0 (capacity 1) until each has answered.
    assert core.handle(ticked(1_011)).commands == ()
    assert core.handle(arrived("e0", failed("c0"), now_ms=1_020)).commands == ()
    assert core.handle(arrived("e0", ok("s1"), now_ms=1_030)).commands == (
        run("e0", dispatch("c0", at_ms=1_030, attempt=2, deadline_after_ms=1_000)),
    )


def test_cancelling_a_task_cancels_its_nested_subcalls_too(core: DispatchCore) -> None:
    core.handle(joined("e0", capacity=1, now_ms=0))
    start(core, "t1", "c0", now_ms=0)
    core.handle(subcall("e0", "c0", "s1", now_ms=10))
    assert start(core, "t2", "b0", now_ms=15) == ()

    assert core.handle(cancelled("t1", now_ms=20)).commands == (cancel("e0", ("c0", 1), ("s1", 1)),)
    assert core.handle(arrived("e0", ok("s1"), now_ms=30)).commands == ()
    assert core.handle(arrived("e0", ok("c0"), now_ms=40)).commands == (
        run("e0", dispatch("b0", at_ms=40, task_id="t2")),
    )
