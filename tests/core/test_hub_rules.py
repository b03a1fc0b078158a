"""The hub's rules, example by example (tests/property/test_hub_rules.py runs them at random)."""

from __future__ import annotations

import json

import attrs
import pytest

from blockx.hub import Attempt, AttemptState, Idempotency, Task, TaskState
from blockx.hub._rules import (
    Change,
    Operator,
    Refusal,
    Timing,
    expire,
    finish,
    offer,
    renew,
    resume_status,
    retry,
    start,
    time_out,
)
from blockx.hubwire import (
    AttemptStatus,
    Capability,
    Disposition,
    Failed,
    RefusalCode,
    Succeeded,
    Unknown,
)

TIMING = Timing(lease_ms=1_000, offer_ttl_ms=500, retry_backoff_ms=100, max_retry_backoff_ms=350)
TASK = Task(
    task_id="t",
    queue_id="q",
    capability=Capability(handler="h", handler_version="1", payload_version="1"),
    payload="{}",
    idempotency=Idempotency.IDEMPOTENT,
    max_attempts=3,
    attempt_timeout_ms=2_500,
    created_at_ms=0,
    deadline_at_ms=10_000,
    state=TaskState.QUEUED,
    available_at_ms=0,
)


def offered(task: Task = TASK, now_ms: int = 0, attempt_id: str = "a1") -> tuple[Task, Attempt]:
    change = offer(task, attempt_id=attempt_id, instance_id="w", now_ms=now_ms, timing=TIMING)
    assert change.attempt is not None
    return change.task, change.attempt


def running(task: Task = TASK, now_ms: int = 0) -> tuple[Task, Attempt]:
    task, attempt = offered(task, now_ms)
    change = start(
        task, attempt, instance_id="w", epoch=attempt.epoch, now_ms=now_ms, timing=TIMING
    )
    assert isinstance(change, Change)
    assert change.attempt is not None
    return change.task, change.attempt


def test_the_back_off_doubles_up_to_its_cap() -> None:
    assert [TIMING.backoff_ms(n) for n in range(1, 6)] == [100, 200, 350, 350, 350]


def test_a_lease_runs_to_the_attempt_timeout_at_most() -> None:
    task, attempt = running()
    assert attempt.lease_deadline_ms == 1_000
    for now_ms, deadline in [(900, 1_900), (1_800, 2_500), (2_400, 2_500)]:
        change = renew(task, attempt, instance_id="w", epoch=1, now_ms=now_ms, timing=TIMING)
        assert isinstance(change, Change)
        assert change.attempt is not None
        attempt = change.attempt
        assert attempt.lease_deadline_ms == deadline
        assert attempt.renewed_at_ms == now_ms
    assert attempt.renewals == 3
    lost = renew(task, attempt, instance_id="w", epoch=1, now_ms=2_500, timing=TIMING)
    assert lost == Refusal(code=RefusalCode.LEASE_LOST, message="attempt is RUNNING")


def test_start_is_refused_after_the_offer_ends_and_repeats_while_running() -> None:
    task, attempt = offered()
    late = start(task, attempt, instance_id="w", epoch=1, now_ms=500, timing=TIMING)
    assert late == Refusal(code=RefusalCode.NOT_OFFERED, message="the offer has ended")
    task, attempt = running()
    again = start(task, attempt, instance_id="w", epoch=1, now_ms=300, timing=TIMING)
    assert again == Change(task=task, attempt=attempt)  # the same grant, nothing written
    other = start(task, attempt, instance_id="v", epoch=1, now_ms=300, timing=TIMING)
    assert isinstance(other, Refusal)
    assert other.code is RefusalCode.UNKNOWN_ATTEMPT


def test_a_withdrawn_offer_uses_no_attempt() -> None:
    task, attempt = offered()
    change = expire(task, attempt, 500, TIMING)
    assert change is not None
    assert change.attempt is not None
    assert change.attempt.state is AttemptState.WITHDRAWN
    assert (change.task.state, change.task.started_attempts) == (TaskState.QUEUED, 0)
    assert change.task.available_at_ms == 500


def test_a_retry_waits_for_the_back_off() -> None:
    task, attempt = running()
    result = finish(
        task,
        attempt,
        instance_id="w",
        epoch=1,
        outcome=Failed(code="BUSY", retryable=True),
        now_ms=200,
        timing=TIMING,
    )
    assert not isinstance(result, Refusal)
    change, disposition = result
    assert disposition is Disposition.ACCEPTED
    assert (change.task.state, change.task.available_at_ms) == (TaskState.QUEUED, 300)
    assert change.task.failure_code == "BUSY"
    assert not change.task.uncertain


@pytest.mark.parametrize(
    ("idempotency", "state"),
    [
        (Idempotency.IDEMPOTENT, TaskState.QUEUED),
        (Idempotency.NON_IDEMPOTENT, TaskState.NEEDS_REVIEW),
    ],
)
def test_a_late_report_ends_the_lapsed_lease_and_decides_nothing(
    idempotency: Idempotency, state: TaskState
) -> None:
    task, attempt = running(attrs.evolve(TASK, idempotency=idempotency))
    result = finish(
        task,
        attempt,
        instance_id="w",
        epoch=1,
        outcome=Succeeded(result='{"a": 1}'),
        now_ms=1_000,
        timing=TIMING,
    )
    assert not isinstance(result, Refusal)
    change, disposition = result
    assert disposition is Disposition.EVIDENCE_ONLY
    assert change.task.state is state
    assert change.task.result is None
    assert change.attempt is not None
    assert change.attempt.state is AttemptState.LEASE_EXPIRED
    assert change.attempt.outcome == Unknown(code="LEASE_EXPIRED")
    evidence = change.history[-1]
    assert evidence.kind == "EVIDENCE"
    assert json.loads(evidence.detail) == {"reported": "SUCCEEDED", "result": {"a": 1}}


def test_a_queued_task_past_its_deadline_fails() -> None:
    assert time_out(TASK, 9_999) is None
    change = time_out(TASK, 10_000)
    assert change is not None
    assert (change.task.state, change.task.failure_code) == (TaskState.FAILED, "DEADLINE_EXCEEDED")
    assert json.loads(change.task.failure_details) == {"deadline_at_ms": 10_000}
    assert time_out(attrs.evolve(TASK, state=TaskState.RUNNING), 20_000) is None


def test_resume_finds_what_an_instance_still_holds() -> None:
    _, attempt = running()
    look = resume_status
    assert look(attempt, instance_id="w", epoch=1, now_ms=999) == (AttemptStatus.RUNNING, 1_000)
    assert look(attempt, instance_id="w", epoch=1, now_ms=1_000) == (AttemptStatus.LOST, 0)
    assert look(attempt, instance_id="w", epoch=2, now_ms=0) == (AttemptStatus.LOST, 0)
    assert look(attempt, instance_id="v", epoch=1, now_ms=0) == (AttemptStatus.LOST, 0)
    assert look(None, instance_id="w", epoch=1, now_ms=0) == (AttemptStatus.LOST, 0)
    _, fresh = offered()
    assert look(fresh, instance_id="w", epoch=1, now_ms=10) == (AttemptStatus.OFFERED, 500)


def test_an_operators_retry_keeps_a_delay_that_has_not_ended() -> None:
    """A delayed task that failed before its time (its deadline passed) is retried for
    no sooner than its delay, with its total deadline counted from then."""
    delayed = attrs.evolve(TASK, available_at_ms=5_000, deadline_at_ms=1_000)
    failed = time_out(delayed, 1_000)
    assert failed is not None
    by = Operator(credential_id="c1", request_id="r1")
    retried = retry(failed.task, by=by, now_ms=1_200)
    assert isinstance(retried, Change)
    assert (retried.task.state, retried.task.available_at_ms) == (TaskState.QUEUED, 5_000)
    assert retried.task.deadline_at_ms == 6_000
    ran = retry(attrs.evolve(failed.task, available_at_ms=300), by=by, now_ms=1_200)
    assert isinstance(ran, Change)
    assert ran.task.available_at_ms == 1_200  # a task whose time had come: from now
