"""How a task's calls phase ends: fail fast and best effort, outputs in call
order, exact stats, streamed batches and sealing, and cancellation.
"""

from __future__ import annotations

import attrs
import pytest

from blockx.calls import CallFailure, CallPhaseOutcome, CallStats, FailureCode
from blockx.dispatch import DispatchCore, FinishCallPhase, ReplaceExecutor
from blockx.errors import Misuse
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
    observe,
    ok,
    opened,
    retryable_failure,
    revoke,
    revoked,
    run,
    start,
    ticked,
    value_of,
)

_BEST_EFFORT = call_policy(fail_fast=False)


# ------------------------------------------------------------------ fail fast


def test_fail_fast_ends_the_phase_at_the_first_final_failure(core: DispatchCore) -> None:
    core.handle(joined("e0", capacity=2, now_ms=0))
    core.handle(joined("e1", capacity=2, now_ms=0))
    assert start(core, "t1", "c0", "c1", "c2", "c3", "c4", "c5", now_ms=0) == (
        run("e0", dispatch("c0", at_ms=0), dispatch("c2", at_ms=0)),
        run("e1", dispatch("c1", at_ms=0), dispatch("c3", at_ms=0)),
    )

    assert core.handle(arrived("e0", failed("c0"), now_ms=10)).commands == (
        cancel("e1", ("c1", 1), ("c3", 1)),
        cancel("e0", ("c2", 1)),
        FinishCallPhase(
            task_id="t1",
            outcome=CallPhaseOutcome(
                ok=False,
                failure_code=FailureCode.CALL_RAISED,
                message="call c0 (work) failed after 1 attempt(s): boom",
                retryable=False,
                stats=CallStats(calls_total=6, calls_failed=1),
            ),
        ),
    )
    assert core.task_ids() == ()
    assert core.running_calls("e0") == ()
    assert core.running_calls("e1") == ()


def test_an_executor_holding_a_cancelled_call_gets_no_new_calls_until_it_answers(
    core: DispatchCore,
) -> None:
    core.handle(joined("e0", capacity=2, now_ms=0))
    core.handle(joined("e1", capacity=2, now_ms=0))
    start(core, "t1", "c0", "c1", "c2", "c3", "c4", "c5", now_ms=0)
    core.handle(arrived("e0", failed("c0"), now_ms=10))

    # Zombies: c2 on e0, c1 and c3 on e1: neither takes t2's calls while it holds one.
    assert start(core, "t2", "b0", "b1", "b2", now_ms=15) == ()
    # A late answer is ignored but ends the zombie; t1's queued c4 and c5 never run.
    assert core.handle(arrived("e0", ok("c2"), now_ms=16)).commands == (
        run("e0", dispatch("b0", at_ms=16, task_id="t2"), dispatch("b1", at_ms=16, task_id="t2")),
    )
    assert core.handle(arrived("e1", ok("c1"), now_ms=20)).commands == ()  # c3 still held
    assert core.handle(arrived("e1", failed("c3"), now_ms=21)).commands == (
        run("e1", dispatch("b2", at_ms=21, task_id="t2")),
    )
    assert core.running_calls("e0") == ("b0", "b1")
    assert core.running_calls("e1") == ("b2",)


def test_calls_queued_behind_a_cancelled_call_are_taken_back_and_a_deaf_executor_replaced(
    core: DispatchCore,
) -> None:
    """A cancelled call that will not stop (in C code, say): nothing waits behind it, and
    its executor is replaced once the cancel grace (2 s here) has passed."""
    core.handle(joined("e0", capacity=4, now_ms=0))
    start(core, "t1", "c0", now_ms=0)
    assert start(core, "t2", "b0", "b1", now_ms=1) == (
        run("e0", dispatch("b0", at_ms=1, task_id="t2"), dispatch("b1", at_ms=1, task_id="t2")),
    )
    assert core.handle(cancelled("t1", now_ms=10)).commands == (
        cancel("e0", ("c0", 1)),
        revoke("e0", ("b0", 1), ("b1", 1)),
    )
    # Given back; they wait for an executor that holds no cancelled call.
    assert core.handle(arrived("e0", revoked("b0"), revoked("b1"), now_ms=11)).commands == ()
    assert core.next_deadline_ms() == 2_010
    [replace] = core.handle(ticked(2_010)).commands
    assert replace == ReplaceExecutor(
        executor_id="e0", why="it held a cancelled call for 2000 ms (the cancel grace is 2000 ms)"
    )
    assert core.handle(ticked(3_000)).commands == ()  # asked once
    core.handle(left("e0", now_ms=3_100))
    assert core.handle(joined("e1", capacity=4, now_ms=3_500)).commands == (
        run(
            "e1",
            dispatch("b1", at_ms=3_500, task_id="t2", attempt=2),
            dispatch("b0", at_ms=3_500, task_id="t2", attempt=2),
        ),
    )


@pytest.mark.parametrize(
    ("error_code", "reported_retryable", "phase_retryable"),
    [
        pytest.param(FailureCode.CALL_RAISED, False, False, id="raised"),
        pytest.param(FailureCode.UNKNOWN_FUNCTION, False, False, id="unknown-function"),
        pytest.param(FailureCode.RESULT_NOT_SERIALIZABLE, False, False, id="not-serializable"),
        pytest.param(FailureCode.RESULT_TOO_LARGE, False, False, id="too-large"),
        pytest.param(FailureCode.CALL_RAISED_RETRYABLE, True, True, id="raised-retryable"),
    ],
)
def test_fail_fast_reports_the_code_and_whether_the_task_may_be_retried(
    core: DispatchCore, error_code: FailureCode, reported_retryable: bool, phase_retryable: bool
) -> None:
    core.handle(joined("e0", capacity=1, now_ms=0))
    start(core, "t1", "c0", "c1", now_ms=0, policy=call_policy(max_attempts=1))

    outcome = failed("c0", code=error_code, retryable=reported_retryable, message="no luck")
    assert core.handle(arrived("e0", outcome, now_ms=10)).commands == (
        FinishCallPhase(
            task_id="t1",
            outcome=CallPhaseOutcome(
                ok=False,
                failure_code=error_code,
                message="call c0 (work) failed after 1 attempt(s): no luck",
                retryable=phase_retryable,
                stats=CallStats(calls_total=2, calls_failed=1),
            ),
        ),
    )
    assert core.running_calls("e0") == ()


def test_fail_fast_stats_count_what_happened_before_the_failure(core: DispatchCore) -> None:
    core.handle(joined("e0", capacity=3, now_ms=0))
    start(core, "t1", "c0", "c1", "c2", "c3", now_ms=0, policy=call_policy(base_backoff_ms=0))
    assert core.handle(arrived("e0", ok("c0"), retryable_failure("c1"), now_ms=10)).commands == (
        run("e0", dispatch("c1", at_ms=10, attempt=2), dispatch("c3", at_ms=10)),
    )

    assert core.handle(arrived("e0", failed("c2"), now_ms=20)).commands == (
        cancel("e0", ("c1", 2), ("c3", 1)),
        FinishCallPhase(
            task_id="t1",
            outcome=CallPhaseOutcome(
                ok=False,
                failure_code=FailureCode.CALL_RAISED,
                message="call c2 (work) failed after 1 attempt(s): boom",
                retryable=False,
                stats=CallStats(calls_total=4, calls_succeeded=1, calls_failed=1, calls_retried=1),
            ),
        ),
    )


# ---------------------------------------------------------------- best effort


def test_best_effort_runs_every_call_and_reports_the_failures(core: DispatchCore) -> None:
    core.handle(joined("e0", capacity=4, now_ms=0))
    start(core, "t1", "c0", "c1", "c2", "c3", now_ms=0, policy=_BEST_EFFORT)

    assert core.handle(arrived("e0", failed("c1"), now_ms=10)).commands == ()
    assert core.handle(arrived("e0", ok("c3"), ok("c0"), now_ms=11)).commands == ()
    no_such = failed("c2", code=FailureCode.UNKNOWN_FUNCTION, message="no function 'work'")
    assert core.handle(arrived("e0", no_such, now_ms=12)).commands == (
        FinishCallPhase(
            task_id="t1",
            outcome=CallPhaseOutcome(
                ok=True,
                message="2 call(s) failed; first: c1 work CALL_RAISED: boom",
                stats=CallStats(calls_total=4, calls_succeeded=2, calls_failed=2),
                outputs=(value_of("c0"), value_of("c3")),
                failures=(
                    CallFailure(
                        call_id="c1",
                        function="work",
                        attempts=1,
                        error_code=FailureCode.CALL_RAISED,
                        error_message="boom",
                    ),
                    CallFailure(
                        call_id="c2",
                        function="work",
                        attempts=1,
                        error_code=FailureCode.UNKNOWN_FUNCTION,
                        error_message="no function 'work'",
                    ),
                ),
            ),
        ),
    )


def test_best_effort_keeps_dispatching_after_failures(core: DispatchCore) -> None:
    core.handle(joined("e0", capacity=1, now_ms=0))
    policy = call_policy(fail_fast=False, max_attempts=2, base_backoff_ms=0)
    assert start(core, "t1", "c0", "c1", "c2", now_ms=0, policy=policy) == (
        run("e0", dispatch("c0", at_ms=0)),
    )

    assert core.handle(arrived("e0", failed("c0"), now_ms=10)).commands == (
        run("e0", dispatch("c1", at_ms=10)),
    )
    assert core.handle(arrived("e0", retryable_failure("c1"), now_ms=20)).commands == (
        run("e0", dispatch("c1", at_ms=20, attempt=2)),
    )
    assert core.handle(arrived("e0", retryable_failure("c1", attempt=2), now_ms=30)).commands == (
        run("e0", dispatch("c2", at_ms=30)),
    )
    assert core.handle(arrived("e0", ok("c2"), now_ms=40)).commands == (
        FinishCallPhase(
            task_id="t1",
            outcome=CallPhaseOutcome(
                ok=True,
                message="2 call(s) failed; first: c0 work CALL_RAISED: boom",
                stats=CallStats(calls_total=3, calls_succeeded=1, calls_failed=2, calls_retried=1),
                outputs=(value_of("c2"),),
                failures=(
                    CallFailure(
                        call_id="c0",
                        function="work",
                        attempts=1,
                        error_code=FailureCode.CALL_RAISED,
                        error_message="boom",
                    ),
                    CallFailure(
                        call_id="c1",
                        function="work",
                        attempts=2,
                        error_code=FailureCode.CALL_RAISED_RETRYABLE,
                        error_message="boom",
                    ),
                ),
            ),
        ),
    )


# -------------------------------------------------------------------- outputs


def test_outputs_are_in_call_order_whatever_the_order_of_results(core: DispatchCore) -> None:
    core.handle(joined("e0", capacity=2, now_ms=0))
    core.handle(joined("e1", capacity=2, now_ms=0))
    assert start(core, "t1", "c0", "c1", "c2", "c3", now_ms=0) == (
        run("e0", dispatch("c0", at_ms=0), dispatch("c2", at_ms=0)),
        run("e1", dispatch("c1", at_ms=0), dispatch("c3", at_ms=0)),
    )

    # e1 has nothing left: c2, queued behind c0 on e0, is asked back (e0 had started it).
    assert core.handle(arrived("e1", ok("c3"), ok("c1"), now_ms=10)).commands == (
        revoke("e0", ("c2", 1)),
    )
    assert core.handle(arrived("e0", ok("c2"), now_ms=11)).commands == ()
    assert core.handle(arrived("e0", ok("c0"), now_ms=12)).commands == (
        FinishCallPhase(
            task_id="t1",
            outcome=CallPhaseOutcome(
                ok=True,
                stats=CallStats(calls_total=4, calls_succeeded=4),
                outputs=(value_of("c0"), value_of("c1"), value_of("c2"), value_of("c3")),
            ),
        ),
    )


def test_calls_are_known_by_their_batch_s_id_prefix(core: DispatchCore) -> None:
    """The core's id of a call is `id_prefix` + its spec's id: in commands, answers and
    failures; batches of one run share the prefix, and a prefixed id used twice is
    refused."""
    core.handle(joined("e0", capacity=4, now_ms=0))
    core.handle(opened("t1", now_ms=0, policy=_BEST_EFFORT))
    batch = attrs.evolve(added("t1", "c0", now_ms=0, sealed=False), id_prefix="t1#7:")
    first = dispatch("t1#7:c0", at_ms=0)._replace(args=b"c0")  # the spec's own arguments
    assert core.handle(batch).commands == (run("e0", first),)
    later = attrs.evolve(added("t1", "c1", now_ms=1, sealed=False), id_prefix="t1#7:")
    second = dispatch("t1#7:c1", at_ms=1)._replace(args=b"c1")
    assert core.handle(later).commands == (run("e0", second),)
    again = attrs.evolve(added("t1", "c0", now_ms=2), id_prefix="t1#7:")
    with pytest.raises(Misuse, match="call id 't1#7:c0' used twice"):
        core.handle(again)
    assert core.handle(added("t1", now_ms=2)).commands == ()  # sealed
    core.handle(arrived("e0", failed("t1#7:c1"), now_ms=3))
    [finish] = core.handle(arrived("e0", ok("t1#7:c0"), now_ms=4)).commands
    assert isinstance(finish, FinishCallPhase)
    assert [f.call_id for f in finish.outcome.failures] == ["t1#7:c1"]
    assert finish.outcome.outputs == (value_of("t1#7:c0"),)


def test_successes_in_bulk_end_calls_as_outcomes_do(core: DispatchCore) -> None:
    """Rows of `succeeded` are successes: a stale attempt's row is ignored, a cancelled
    attempt's row only ends its zombie, and a frame may mix rows and outcomes."""
    core.handle(joined("e0", capacity=4, now_ms=0))
    start(core, "t1", "c0", "c1", "c2", now_ms=0, policy=_BEST_EFFORT)
    start(core, "t2", "b0", now_ms=1)
    core.handle(cancelled("t2", now_ms=2))  # b0 becomes a zombie on e0
    bulk = attrs.evolve(
        arrived("e0", failed("c2"), now_ms=10),
        succeeded=(("c1", 2, b"stale"), ("c0", 1, value_of("c0")), ("b0", 1, b"late")),
    )
    assert core.handle(bulk).commands == ()
    assert core.running_calls("e0") == ("c1",)
    # The zombie has ended: e0 takes new calls again.
    assert start(core, "t3", "d0", now_ms=10) == (
        run("e0", dispatch("d0", at_ms=10, task_id="t3")),
    )
    done = attrs.evolve(arrived("e0", now_ms=11), succeeded=(("c1", 1, value_of("c1")),))
    [finish] = core.handle(done).commands
    assert isinstance(finish, FinishCallPhase)
    assert finish.outcome.outputs == (value_of("c0"), value_of("c1"))
    assert finish.outcome.stats == CallStats(calls_total=3, calls_succeeded=2, calls_failed=1)


# ------------------------------------------------------------------ streaming


def test_an_unsealed_task_never_finishes_until_it_is_sealed(core: DispatchCore) -> None:
    core.handle(joined("e0", capacity=4, now_ms=0))
    assert start(core, "t1", "c0", "c1", now_ms=0, sealed=False) == (
        run("e0", dispatch("c0", at_ms=0), dispatch("c1", at_ms=0)),
    )
    assert core.handle(arrived("e0", ok("c1"), ok("c0"), now_ms=10)).commands == ()
    assert core.task_ids() == ("t1",)

    assert core.handle(added("t1", "c2", now_ms=20, sealed=False)).commands == (
        run("e0", dispatch("c2", at_ms=20)),
    )
    assert core.handle(arrived("e0", ok("c2"), now_ms=30)).commands == ()
    assert core.task_ids() == ("t1",)

    assert core.handle(added("t1", now_ms=40)).commands == (
        FinishCallPhase(
            task_id="t1",
            outcome=CallPhaseOutcome(
                ok=True,
                stats=CallStats(calls_total=3, calls_succeeded=3),
                outputs=(value_of("c0"), value_of("c1"), value_of("c2")),
            ),
        ),
    )
    assert core.task_ids() == ()


def test_a_task_sealed_while_calls_run_finishes_with_its_last_result(
    core: DispatchCore,
) -> None:
    core.handle(joined("e0", capacity=4, now_ms=0))
    start(core, "t1", "c0", now_ms=0, sealed=False)
    assert core.handle(added("t1", "c1", now_ms=5)).commands == (
        run("e0", dispatch("c1", at_ms=5)),
    )

    assert core.handle(arrived("e0", ok("c1"), now_ms=10)).commands == ()
    assert core.handle(arrived("e0", ok("c0"), now_ms=20)).commands == (
        FinishCallPhase(
            task_id="t1",
            outcome=CallPhaseOutcome(
                ok=True,
                stats=CallStats(calls_total=2, calls_succeeded=2),
                outputs=(value_of("c0"), value_of("c1")),
            ),
        ),
    )


def test_a_task_sealed_with_no_calls_finishes_at_once(core: DispatchCore) -> None:
    assert start(core, "t1", now_ms=0) == (
        FinishCallPhase(task_id="t1", outcome=CallPhaseOutcome(ok=True, stats=CallStats())),
    )
    assert core.task_ids() == ()


# --------------------------------------------------------------- cancellation


def test_a_cancelled_task_has_its_calls_cancelled_and_no_finish(core: DispatchCore) -> None:
    core.handle(joined("e0", capacity=2, now_ms=0))
    core.handle(joined("e1", capacity=2, now_ms=0))
    start(core, "t1", "c0", "c1", "c2", "c3", "c4", "c5", now_ms=0)

    assert core.handle(cancelled("t1", now_ms=10)).commands == (
        cancel("e0", ("c0", 1), ("c2", 1)),
        cancel("e1", ("c1", 1), ("c3", 1)),
    )
    assert core.task_ids() == ()
    assert core.next_deadline_ms() == 2_010  # the cancel grace of the executors holding them

    # Room frees as the cancelled calls answer, but nothing of t1 runs again.
    assert core.handle(arrived("e0", ok("c0"), failed("c2"), now_ms=20)).commands == ()
    assert core.running_calls("e0") == ()
    assert start(core, "t2", "b0", now_ms=30) == (
        run("e0", dispatch("b0", at_ms=30, task_id="t2")),
    )
    assert core.handle(arrived("e1", ok("c1"), ok("c3"), now_ms=40)).commands == ()
    assert core.running_calls("e1") == ()


def test_a_cancelled_tasks_backoff_never_ends_in_a_dispatch(core: DispatchCore) -> None:
    core.handle(joined("e0", capacity=1, now_ms=0))
    start(core, "t1", "c0", now_ms=0)
    assert core.handle(arrived("e0", retryable_failure("c0"), now_ms=5)).commands == ()
    assert core.next_deadline_ms() == 15

    assert core.handle(cancelled("t1", now_ms=10)).commands == ()
    assert core.next_deadline_ms() is None
    assert core.handle(ticked(20)).commands == ()
    assert core.running_calls("e0") == ()


def test_cancelling_an_unknown_or_ended_task_changes_nothing(core: DispatchCore) -> None:
    core.handle(joined("e0", capacity=1, now_ms=0))
    start(core, "t1", "c0", now_ms=0)
    assert core.handle(arrived("e0", ok("c0"), now_ms=5)).commands == (
        FinishCallPhase(
            task_id="t1",
            outcome=CallPhaseOutcome(
                ok=True,
                stats=CallStats(calls_total=1, calls_succeeded=1),
                outputs=(value_of("c0"),),
            ),
        ),
    )
    start(core, "t2", "b0", now_ms=6)
    before = observe(core)

    assert core.handle(cancelled("nope", now_ms=10)).commands == ()
    assert core.handle(cancelled("t1", now_ms=10)).commands == ()
    assert observe(core) == before
