"""Retries of the dispatch core: back-off figures and timing, retries ahead of
fresh calls, the attempt limit, call deadlines, `next_deadline_ms()` and the
loss of an executor.
"""

from __future__ import annotations

import pytest

from blockx.calls import CallPhaseOutcome, CallStats, FailureCode
from blockx.dispatch import DispatchCore, FinishCallPhase
from tests.core.dispatch_helpers import (
    added,
    arrived,
    call_policy,
    cancel,
    cancelled,
    dispatch,
    failed,
    joined,
    left,
    ok,
    retryable_failure,
    revoke,
    run,
    start,
    ticked,
    value_of,
)


def _succeeded(task_id: str, *call_ids: str, retried: int = 0, total: int = 0) -> FinishCallPhase:
    return FinishCallPhase(
        task_id=task_id,
        outcome=CallPhaseOutcome(
            ok=True,
            stats=CallStats(
                calls_total=total or len(call_ids),
                calls_succeeded=len(call_ids),
                calls_retried=retried,
            ),
            outputs=tuple(value_of(call_id) for call_id in call_ids),
        ),
    )


# ------------------------------------------------------------------- back-off


@pytest.mark.parametrize(
    ("base_backoff_ms", "jitter_percent", "attempt", "draw", "backoff_ms"),
    [
        pytest.param(10, 5, 1, 0.0, 10, id="base10-jitter5-attempt1-draw0"),
        pytest.param(10, 5, 1, 0.999, 10, id="base10-jitter5-attempt1-draw0.999"),
        pytest.param(10, 5, 2, 0.0, 20, id="base10-jitter5-attempt2-draw0"),
        pytest.param(10, 5, 2, 0.5, 20, id="base10-jitter5-attempt2-draw0.5"),
        pytest.param(10, 5, 2, 0.999, 20, id="base10-jitter5-attempt2-draw0.999"),
        pytest.param(200, 5, 1, 0.999, 209, id="base200-jitter5-attempt1-draw0.999"),
        pytest.param(200, 5, 2, 0.5, 410, id="base200-jitter5-attempt2-draw0.5"),
        pytest.param(200, 5, 2, 0.999, 419, id="base200-jitter5-attempt2-draw0.999"),
        pytest.param(100, 5, 1, 0.999, 104, id="base100-jitter5-attempt1-draw0.999"),
        pytest.param(100, 5, 3, 0.999, 419, id="base100-jitter5-attempt3-draw0.999"),
        pytest.param(0, 5, 2, 0.999, 0, id="base0"),
    ],
)
def test_backoff_is_base_doubled_per_attempt_plus_scaled_jitter(
    base_backoff_ms: int, jitter_percent: int, attempt: int, draw: float, backoff_ms: int
) -> None:
    policy = call_policy(base_backoff_ms=base_backoff_ms, jitter_percent=jitter_percent)

    assert policy.retry.backoff_ms(attempt, draw) == backoff_ms


def test_retryable_failure_waits_for_its_backoff(core: DispatchCore) -> None:
    core.handle(joined("e0", capacity=1, now_ms=0))
    assert start(core, "t1", "c0", now_ms=0) == (run("e0", dispatch("c0", at_ms=0)),)

    # 10 + int(10 * 5 * 0.5 / 100) = 10.
    assert core.handle(arrived("e0", retryable_failure("c0"), now_ms=100, draw=0.5)).commands == ()
    assert core.next_deadline_ms() == 110
    assert core.handle(ticked(109)).commands == ()
    assert core.handle(ticked(110)).commands == (run("e0", dispatch("c0", at_ms=110, attempt=2)),)

    # 20 + int(20 * 5 * 0.999 / 100) = 20.
    assert (
        core.handle(
            arrived("e0", retryable_failure("c0", attempt=2), now_ms=200, draw=0.999)
        ).commands
        == ()
    )
    assert core.next_deadline_ms() == 220
    assert core.handle(ticked(219)).commands == ()
    assert core.handle(ticked(225)).commands == (run("e0", dispatch("c0", at_ms=225, attempt=3)),)

    assert core.handle(arrived("e0", ok("c0", attempt=3), now_ms=230)).commands == (
        _succeeded("t1", "c0", retried=2),
    )


def test_the_results_draw_scales_the_jitter(core: DispatchCore) -> None:
    core.handle(joined("e0", capacity=1, now_ms=0))
    # Jitter is at most 5 %: it adds a whole millisecond only to a base above 20 ms.
    start(core, "t1", "c0", now_ms=0, policy=call_policy(base_backoff_ms=100, jitter_percent=5))

    # 100 + int(100 * 5 * 0.999 / 100) = 104.
    assert (
        core.handle(arrived("e0", retryable_failure("c0"), now_ms=100, draw=0.999)).commands == ()
    )
    assert core.next_deadline_ms() == 204
    assert core.handle(ticked(203)).commands == ()
    assert core.handle(ticked(204)).commands == (run("e0", dispatch("c0", at_ms=204, attempt=2)),)

    # 200 + int(200 * 5 * 0.999 / 100) = 209.
    assert (
        core.handle(
            arrived("e0", retryable_failure("c0", attempt=2), now_ms=300, draw=0.999)
        ).commands
        == ()
    )
    assert core.next_deadline_ms() == 509
    assert core.handle(ticked(508)).commands == ()
    assert core.handle(ticked(509)).commands == (run("e0", dispatch("c0", at_ms=509, attempt=3)),)


def test_zero_base_backoff_redispatches_in_the_same_step(core: DispatchCore) -> None:
    core.handle(joined("e0", capacity=1, now_ms=0))
    start(core, "t1", "c0", now_ms=0, policy=call_policy(base_backoff_ms=0))

    assert core.handle(arrived("e0", retryable_failure("c0"), now_ms=5, draw=0.999)).commands == (
        run("e0", dispatch("c0", at_ms=5, attempt=2)),
    )


def test_a_retry_runs_ahead_of_the_tasks_fresh_calls(core: DispatchCore) -> None:
    core.handle(joined("e0", capacity=1, now_ms=0))
    start(core, "t1", "c0", "c1", "c2", now_ms=0, policy=call_policy(base_backoff_ms=0))

    assert core.handle(arrived("e0", retryable_failure("c0"), now_ms=5)).commands == (
        run("e0", dispatch("c0", at_ms=5, attempt=2)),
    )


def test_a_retry_after_its_backoff_runs_ahead_of_fresh_calls(core: DispatchCore) -> None:
    core.handle(joined("e0", capacity=1, now_ms=0))
    assert start(core, "t1", "c0", "c1", "c2", now_ms=0) == (run("e0", dispatch("c0", at_ms=0)),)

    # While c0 backs off its room goes to the next fresh call...
    assert core.handle(arrived("e0", retryable_failure("c0"), now_ms=5)).commands == (
        run("e0", dispatch("c1", at_ms=5)),
    )
    assert core.handle(ticked(15)).commands == ()
    # ...and once the back-off is over c0 goes before c2.
    assert core.handle(arrived("e0", ok("c1"), now_ms=20)).commands == (
        run("e0", dispatch("c0", at_ms=20, attempt=2)),
    )
    assert core.handle(arrived("e0", ok("c0", attempt=2), now_ms=30)).commands == (
        run("e0", dispatch("c2", at_ms=30)),
    )
    assert core.handle(arrived("e0", ok("c2"), now_ms=40)).commands == (
        _succeeded("t1", "c0", "c1", "c2", retried=1),
    )


def test_a_call_in_backoff_does_not_hold_a_window_slot(core: DispatchCore) -> None:
    core.handle(joined("e0", capacity=4, now_ms=0))
    assert start(core, "t1", "c0", "c1", "c2", now_ms=0, policy=call_policy(window=1)) == (
        run("e0", dispatch("c0", at_ms=0)),
    )

    assert core.handle(arrived("e0", retryable_failure("c0"), now_ms=5)).commands == (
        run("e0", dispatch("c1", at_ms=5)),
    )
    # Back-off over, but the window is full with c1.
    assert core.handle(ticked(15)).commands == ()
    assert core.handle(arrived("e0", ok("c1"), now_ms=20)).commands == (
        run("e0", dispatch("c0", at_ms=20, attempt=2)),
    )


# -------------------------------------------------------------- attempt limit


@pytest.mark.parametrize("max_attempts", [1, 2, 3])
def test_attempts_never_exceed_max_attempts(core: DispatchCore, max_attempts: int) -> None:
    core.handle(joined("e0", capacity=1, now_ms=0))
    start(
        core, "t1", "c0", now_ms=0, policy=call_policy(max_attempts=max_attempts, base_backoff_ms=0)
    )
    for attempt in range(2, max_attempts + 1):
        failure = retryable_failure("c0", attempt=attempt - 1)
        assert core.handle(arrived("e0", failure, now_ms=attempt)).commands == (
            run("e0", dispatch("c0", at_ms=attempt, attempt=attempt)),
        )

    last = retryable_failure("c0", attempt=max_attempts)
    assert core.handle(arrived("e0", last, now_ms=100)).commands == (
        FinishCallPhase(
            task_id="t1",
            outcome=CallPhaseOutcome(
                ok=False,
                failure_code=FailureCode.CALL_RAISED_RETRYABLE,
                message=f"call c0 (work) failed after {max_attempts} attempt(s): boom",
                retryable=True,
                stats=CallStats(calls_total=1, calls_failed=1, calls_retried=max_attempts - 1),
            ),
        ),
    )
    assert core.task_ids() == ()
    assert core.next_deadline_ms() is None


def test_a_failure_not_marked_retryable_is_never_retried(core: DispatchCore) -> None:
    core.handle(joined("e0", capacity=1, now_ms=0))
    start(core, "t1", "c0", now_ms=0, policy=call_policy(max_attempts=5, base_backoff_ms=0))

    assert core.handle(arrived("e0", failed("c0"), now_ms=5)).commands == (
        FinishCallPhase(
            task_id="t1",
            outcome=CallPhaseOutcome(
                ok=False,
                failure_code=FailureCode.CALL_RAISED,
                message="call c0 (work) failed after 1 attempt(s): boom",
                retryable=False,
                stats=CallStats(calls_total=1, calls_failed=1),
            ),
        ),
    )


def test_calls_retried_counts_every_reattempt(core: DispatchCore) -> None:
    core.handle(joined("e0", capacity=3, now_ms=0))
    policy = call_policy(base_backoff_ms=0, fail_fast=False)
    assert start(core, "t1", "c0", "c1", "c2", now_ms=0, policy=policy) == (
        run("e0", dispatch("c0", at_ms=0), dispatch("c1", at_ms=0), dispatch("c2", at_ms=0)),
    )

    # Each retry is put at the front of the task's queue as it is scheduled,
    # so two retries of one step go out in the reverse order of their failures.
    assert core.handle(
        arrived("e0", retryable_failure("c0"), retryable_failure("c1"), ok("c2"), now_ms=5)
    ).commands == (
        run("e0", dispatch("c1", at_ms=5, attempt=2), dispatch("c0", at_ms=5, attempt=2)),
    )
    assert core.handle(arrived("e0", retryable_failure("c0", attempt=2), now_ms=6)).commands == (
        run("e0", dispatch("c0", at_ms=6, attempt=3)),
    )
    assert core.handle(
        arrived("e0", ok("c1", attempt=2), ok("c0", attempt=3), now_ms=7)
    ).commands == (_succeeded("t1", "c0", "c1", "c2", retried=3),)


# ------------------------------------------------------------------ deadlines

_SHORT_DEADLINE = call_policy(call_deadline_ms=1_000)


def test_a_call_past_its_deadline_is_cancelled_and_retried(core: DispatchCore) -> None:
    core.handle(joined("e0", capacity=1, now_ms=0))
    assert start(core, "t1", "c0", now_ms=0, policy=_SHORT_DEADLINE) == (
        run("e0", dispatch("c0", at_ms=0, deadline_after_ms=1_000)),
    )
    assert core.next_deadline_ms() == 1_000

    assert core.handle(ticked(999)).commands == ()
    assert core.handle(ticked(1_001)).commands == (cancel("e0", ("c0", 1)),)
    assert core.running_calls("e0") == ()
    assert core.next_deadline_ms() == 1_011

    # The back-off is over, but the cancelled attempt still holds e0's only room...
    assert core.handle(ticked(1_011)).commands == ()
    # ...until its late answer arrives, which is not taken as c0's result.
    assert core.handle(arrived("e0", ok("c0", attempt=1), now_ms=1_020)).commands == (
        run("e0", dispatch("c0", at_ms=1_020, attempt=2, deadline_after_ms=1_000)),
    )
    assert core.handle(arrived("e0", ok("c0", attempt=2), now_ms=1_030)).commands == (
        _succeeded("t1", "c0", retried=1),
    )


def test_a_call_past_its_deadline_is_retried_on_another_executor(core: DispatchCore) -> None:
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


def test_answers_of_a_cancelled_attempt_are_told_apart_from_its_retry(
    core: DispatchCore,
) -> None:
    # The timed-out attempt 1 of c0 holds e0 until it answers, so attempt 2 goes to e1;
    # once it answers, e0 takes calls again. Answers name the attempt they belong to.
    core.handle(joined("e0", capacity=2, now_ms=0))
    core.handle(joined("e1", capacity=1, now_ms=0))
    policy = call_policy(call_deadline_ms=1_000, base_backoff_ms=0, max_attempts=2)
    assert start(core, "t1", "c0", now_ms=0, policy=policy) == (
        run("e0", dispatch("c0", at_ms=0, deadline_after_ms=1_000)),
    )

    assert core.handle(ticked(1_001)).commands == (
        cancel("e0", ("c0", 1)),
        run("e1", dispatch("c0", at_ms=1_001, attempt=2, deadline_after_ms=1_000)),
    )
    assert core.running_calls("e1") == ("c0",)

    # The late failure of attempt 1 is dropped and attempt 2 keeps running.
    assert core.handle(arrived("e0", failed("c0", attempt=1), now_ms=1_100)).commands == ()
    assert core.running_calls("e1") == ("c0",)
    assert core.handle(arrived("e1", ok("c0", attempt=2), now_ms=1_200)).commands == (
        _succeeded("t1", "c0", retried=1),
    )


def test_an_answer_for_an_attempt_that_is_not_running_is_ignored(core: DispatchCore) -> None:
    core.handle(joined("e0", capacity=1, now_ms=0))
    start(core, "t1", "c0", now_ms=0, policy=call_policy(base_backoff_ms=0))
    assert core.handle(arrived("e0", retryable_failure("c0"), now_ms=5)).commands == (
        run("e0", dispatch("c0", at_ms=5, attempt=2)),
    )

    # A duplicate of attempt 1's answer, and one for an attempt never sent.
    assert (
        core.handle(arrived("e0", ok("c0", attempt=1), ok("c0", attempt=3), now_ms=6)).commands
        == ()
    )
    assert core.running_calls("e0") == ("c0",)
    assert core.handle(arrived("e0", ok("c0", attempt=2), now_ms=7)).commands == (
        _succeeded("t1", "c0", retried=1),
    )


def test_a_call_past_its_last_deadline_fails_the_task_retryably(core: DispatchCore) -> None:
    core.handle(joined("e0", capacity=1, now_ms=0))
    start(core, "t1", "c0", now_ms=0, policy=call_policy(call_deadline_ms=1_000, max_attempts=1))

    assert core.handle(ticked(1_500)).commands == (
        cancel("e0", ("c0", 1)),
        FinishCallPhase(
            task_id="t1",
            outcome=CallPhaseOutcome(
                ok=False,
                failure_code=FailureCode.DEADLINE_EXCEEDED,
                message="call c0 (work) failed after 1 attempt(s): call deadline 1000 ms passed",
                retryable=True,
                stats=CallStats(calls_total=1, calls_failed=1),
            ),
        ),
    )
    assert core.next_deadline_ms() == 3_500  # e0's cancel grace, unless c0 stops before


def test_next_deadline_reports_the_earliest_and_skips_stale_ones(core: DispatchCore) -> None:
    core.handle(joined("e0", capacity=2, now_ms=0))
    assert core.next_deadline_ms() is None
    assert start(core, "t1", "c0", now_ms=0, policy=_SHORT_DEADLINE, sealed=False) == (
        run("e0", dispatch("c0", at_ms=0, deadline_after_ms=1_000)),
    )
    assert core.handle(added("t1", "c1", now_ms=300)).commands == (
        run("e0", dispatch("c1", at_ms=300, deadline_after_ms=1_000)),
    )
    assert core.next_deadline_ms() == 1_000

    # c0 answered: its deadline is stale.
    assert core.handle(arrived("e0", ok("c0"), now_ms=400)).commands == ()
    assert core.next_deadline_ms() == 1_300

    # c1 backs off: its back-off end comes first; its old deadline is stale.
    assert core.handle(arrived("e0", retryable_failure("c1"), now_ms=500)).commands == ()
    assert core.next_deadline_ms() == 510
    assert core.handle(ticked(510)).commands == (
        run("e0", dispatch("c1", at_ms=510, attempt=2, deadline_after_ms=1_000)),
    )
    assert core.next_deadline_ms() == 1_510

    assert core.handle(cancelled("t1", now_ms=600)).commands == (cancel("e0", ("c1", 2)),)
    assert core.next_deadline_ms() == 2_600  # e0's cancel grace
    assert core.handle(arrived("e0", ok("c1", attempt=2), now_ms=700)).commands == ()
    assert core.next_deadline_ms() is None


# -------------------------------------------------------------- executor loss

_LOSS_CODES = [
    pytest.param(FailureCode.EXECUTOR_LOST, id="lost"),
    pytest.param(FailureCode.EXECUTOR_WEDGED, id="wedged"),
]


@pytest.mark.parametrize("error_code", _LOSS_CODES)
def test_calls_of_a_lost_executor_are_retried_on_the_others(
    core: DispatchCore, error_code: FailureCode
) -> None:
    core.handle(joined("e0", capacity=2, now_ms=0))
    assert start(core, "t1", "c0", "c1", now_ms=0, policy=call_policy(base_backoff_ms=0)) == (
        run("e0", dispatch("c0", at_ms=0), dispatch("c1", at_ms=0)),
    )
    # The new executor has nothing: c1, queued behind c0, is asked back (no answer yet).
    assert core.handle(joined("e1", capacity=2, now_ms=50)).commands == (revoke("e0", ("c1", 1)),)

    assert core.handle(left("e0", now_ms=100, error_code=error_code)).commands == (
        run("e1", dispatch("c1", at_ms=100, attempt=2), dispatch("c0", at_ms=100, attempt=2)),
    )
    assert core.executor_ids() == ("e1",)

    # Answers from the departed executor are ignored.
    assert core.handle(arrived("e0", ok("c0"), failed("c1"), now_ms=110)).commands == ()
    assert core.running_calls("e1") == ("c1", "c0")

    assert core.handle(
        arrived("e1", ok("c0", attempt=2), ok("c1", attempt=2), now_ms=120)
    ).commands == (_succeeded("t1", "c0", "c1", retried=2),)


def test_calls_of_a_lost_executor_wait_for_their_backoff(core: DispatchCore) -> None:
    core.handle(joined("e0", capacity=1, now_ms=0))
    core.handle(joined("e1", capacity=1, now_ms=0))
    assert start(core, "t1", "c0", now_ms=0) == (run("e0", dispatch("c0", at_ms=0)),)

    # 10 + int(10 * 5 * 0.999 / 100) = 10.
    assert core.handle(left("e0", now_ms=100, draw=0.999)).commands == ()
    assert core.next_deadline_ms() == 110
    assert core.handle(ticked(110)).commands == (run("e1", dispatch("c0", at_ms=110, attempt=2)),)


@pytest.mark.parametrize("error_code", _LOSS_CODES)
def test_executor_loss_on_the_last_attempt_fails_the_task_retryably(
    core: DispatchCore, error_code: FailureCode
) -> None:
    core.handle(joined("e0", capacity=1, now_ms=0))
    start(core, "t1", "c0", now_ms=0, policy=call_policy(max_attempts=2, base_backoff_ms=0))
    core.handle(joined("e1", capacity=1, now_ms=0))

    assert core.handle(left("e0", now_ms=100, error_code=error_code)).commands == (
        run("e1", dispatch("c0", at_ms=100, attempt=2)),
    )
    assert core.handle(left("e1", now_ms=200, error_code=error_code)).commands == (
        FinishCallPhase(
            task_id="t1",
            outcome=CallPhaseOutcome(
                ok=False,
                failure_code=error_code,
                message="call c0 (work) failed after 2 attempt(s): "
                "executor e1 left during the call",
                retryable=True,
                stats=CallStats(calls_total=1, calls_failed=1, calls_retried=1),
            ),
        ),
    )
    assert core.task_ids() == ()


def test_executor_loss_failing_the_task_cancels_only_on_live_executors(
    core: DispatchCore,
) -> None:
    # Two calls on the lost executor: the first one's final failure ends the
    # task while the second is still listed on the departed executor, which
    # must get no cancel (it is gone) and must not break the step.
    core.handle(joined("e0", capacity=2, now_ms=0))
    assert start(core, "t1", "c0", "c1", "c2", now_ms=0, policy=call_policy(max_attempts=1)) == (
        run("e0", dispatch("c0", at_ms=0), dispatch("c1", at_ms=0)),
    )
    assert core.handle(joined("e1", capacity=1, now_ms=1)).commands == (
        run("e1", dispatch("c2", at_ms=1)),
    )

    assert core.handle(left("e0", now_ms=100)).commands == (
        cancel("e1", ("c2", 1)),
        FinishCallPhase(
            task_id="t1",
            outcome=CallPhaseOutcome(
                ok=False,
                failure_code=FailureCode.EXECUTOR_LOST,
                message="call c0 (work) failed after 1 attempt(s): "
                "executor e0 left during the call",
                retryable=True,
                stats=CallStats(calls_total=3, calls_failed=1),
            ),
        ),
    )
    assert core.executor_ids() == ("e1",)
    assert core.task_ids() == ()


@pytest.mark.parametrize("error_code", _LOSS_CODES)
def test_at_most_once_never_runs_again_a_call_whose_executor_was_lost(
    core: DispatchCore, error_code: FailureCode
) -> None:
    """A function that is not idempotent: its attempt may have run; it fails instead."""
    core.handle(joined("e0", capacity=1, now_ms=0))
    core.handle(joined("e1", capacity=1, now_ms=0))
    policy = call_policy(max_attempts=3, base_backoff_ms=0, at_most_once=True)
    start(core, "t1", "c0", now_ms=0, policy=policy)

    assert core.handle(left("e0", now_ms=100, error_code=error_code)).commands == (
        FinishCallPhase(
            task_id="t1",
            outcome=CallPhaseOutcome(
                ok=False,
                failure_code=error_code,
                message="call c0 (work) failed after 1 attempt(s): executor e0 left during "
                "the call; not run again: the task's retry policy is at most once",
                retryable=False,
                stats=CallStats(calls_total=1, calls_failed=1),
            ),
        ),
    )
    assert core.running_calls("e1") == ()


def test_at_most_once_never_runs_again_a_call_whose_deadline_passed_while_it_ran(
    core: DispatchCore,
) -> None:
    core.handle(joined("e0", capacity=1, now_ms=0))
    policy = call_policy(max_attempts=3, base_backoff_ms=0, at_most_once=True)
    start(core, "t1", "c0", now_ms=0, policy=policy)
    deadline = core.next_deadline_ms()
    assert deadline is not None
    [cancelled_call, finished] = core.handle(ticked(deadline)).commands
    assert cancelled_call == cancel("e0", ("c0", 1))
    assert isinstance(finished, FinishCallPhase)
    assert finished.outcome.failure_code == FailureCode.DEADLINE_EXCEEDED
    assert not finished.outcome.retryable
    assert finished.outcome.message.endswith(
        "not run again: the task's retry policy is at most once"
    )
