"""The hub's rules: what an offer, a start, a renewal, a report or a lapse does to a task.

Theory of operation
-------------------
A task is QUEUED until it is offered to a worker: an offer makes a new
attempt with the next execution epoch (the task is OFFERED). The worker runs
the attempt only once its Start is granted (the task is RUNNING under a
lease the worker renews). An attempt ends exactly once: with the worker's
report (SUCCEEDED, FAILED, UNKNOWN), when its lease runs out (LEASE_EXPIRED),
or, never started, when its offer runs out (WITHDRAWN). Then the task:

* SUCCEEDED -> SUCCEEDED. FAILED and not retryable -> FAILED.
* FAILED and retryable -> QUEUED again (after a back-off) while attempts and
  time remain, else FAILED: an explicit failure had no effect.
* UNKNOWN or LEASE_EXPIRED: the attempt may have had its effect. An
  IDEMPOTENT task is QUEUED again while attempts and time remain (else
  FAILED); any other task goes to NEEDS_REVIEW, for a person to decide.
* WITHDRAWN -> QUEUED again without using an attempt (nothing ran).

Only an operator changes a task that has ended, and never an attempt:
`retry` queues a NEEDS_REVIEW or FAILED task again with one more attempt in
its budget (its next offer makes a new attempt under the next epoch);
`resolve` ends a NEEDS_REVIEW task as the operator says its uncertain attempt
ended; `cancel` ends a QUEUED task CANCELLED (an offered or running one is
refused: its attempt is under way). Each adds one line to the history naming
the credential that acted.

Of a queue's tasks that can be offered, the higher priority goes first, then
the one available sooner (submitted, or its delay or back-off ended), then the
one submitted first (`offer_order`). A task with a concurrency key is offered
only while its key's live attempts (offered or running) are below the key's
limit (`choose_offers`): the live count includes offers, since an offered
attempt may start at any moment.

Only the task's newest attempt, started, within its lease, by the instance it
was offered to and under its own epoch, can end the task with a report. A
report that arrives after the lease ended, or for an attempt that has since
ended, is kept as evidence in the task's history and decides nothing; a
lease that ran out is ended here and now, whoever notices first (the
sweeper, or the late report). An old epoch never completes a newer attempt.

Pure: no clock (time is `now_ms`), no IO, no randomness (attempt ids come in).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Final

import attrs

from blockx.hub._model import (
    Attempt,
    AttemptState,
    HistoryEntry,
    Idempotency,
    Task,
    TaskState,
)
from blockx.hubwire import (
    AttemptStatus,
    Disposition,
    Failed,
    Outcome,
    RawJson,
    RefusalCode,
    Succeeded,
    Unknown,
    dumps,
)

DEADLINE_EXCEEDED: Final = "DEADLINE_EXCEEDED"
"""The failure code of a task whose total deadline passed before it could end."""
LEASE_EXPIRED: Final = "LEASE_EXPIRED"


@attrs.frozen(kw_only=True)
class Timing:
    """The hub's own durations: leases, offers and the retry back-off."""

    lease_ms: int
    offer_ttl_ms: int
    retry_backoff_ms: int
    max_retry_backoff_ms: int

    def backoff_ms(self, started_attempts: int) -> int:
        """The wait before a task is offered again after `started_attempts` attempts."""
        doubled = self.retry_backoff_ms << max(started_attempts - 1, 0)
        return min(doubled, self.max_retry_backoff_ms)


@attrs.frozen(kw_only=True)
class Change:
    """A task (and maybe its attempt) as a transition left them, and what to note down."""

    task: Task
    attempt: Attempt | None = None
    history: tuple[HistoryEntry, ...] = ()


@attrs.frozen(kw_only=True)
class Refusal:
    code: RefusalCode
    message: str


@attrs.frozen(kw_only=True)
class Operator:
    """Who acts on a task by hand: a credential, under a request id its client chose."""

    credential_id: str
    request_id: str


@attrs.frozen(kw_only=True)
class Declined:
    """An operator's action that does not apply to the task as it is now."""

    message: str


# --------------------------------------------------------------------- offers


def submitted(task: Task, now_ms: int) -> HistoryEntry:
    """The first line of a task's history."""
    return _note(task, now_ms, "SUBMITTED", "", f"{task.idempotency}, {task.max_attempts} attempts")


def can_offer(task: Task, now_ms: int) -> bool:
    return (
        task.state is TaskState.QUEUED
        and task.available_at_ms <= now_ms < task.deadline_at_ms
        and task.started_attempts < task.max_attempts
    )


def offer_order(task: Task) -> tuple[int, int, int]:
    """Where a task stands among its queue's: higher priority, sooner available, submitted
    first."""
    return (-task.priority, task.available_at_ms, task.seq)


def choose_offers(
    candidates: Iterable[Task],
    *,
    now_ms: int,
    room: int,
    live_by_key: Mapping[str, int],
    limit_by_key: Mapping[str, int],
) -> list[Task]:
    """Up to `room` of `candidates` to offer now, in offer order: each `can_offer` and keeps
    its concurrency key's live attempts, counting those chosen before it, within the key's
    limit (absent or 0: none)."""
    live = dict(live_by_key)
    chosen: list[Task] = []
    for task in sorted(candidates, key=offer_order):
        if len(chosen) == room:
            break
        key = task.concurrency_key
        limit = limit_by_key.get(key, 0) if key else 0
        if not can_offer(task, now_ms) or (limit and live.get(key, 0) >= limit):
            continue
        chosen.append(task)
        live[key] = live.get(key, 0) + 1
    return chosen


def offer(task: Task, *, attempt_id: str, instance_id: str, now_ms: int, timing: Timing) -> Change:
    """Offer `task` (which `can_offer`) as a new attempt to `instance_id`."""
    assert can_offer(task, now_ms)
    epoch = task.epoch + 1
    attempt = Attempt(
        attempt_id=attempt_id,
        task_id=task.task_id,
        epoch=epoch,
        instance_id=instance_id,
        state=AttemptState.OFFERED,
        offered_at_ms=now_ms,
        offer_deadline_ms=min(now_ms + timing.offer_ttl_ms, task.deadline_at_ms),
    )
    offered = attrs.evolve(task, state=TaskState.OFFERED, epoch=epoch, attempt_id=attempt_id)
    note = _note(task, now_ms, "OFFERED", attempt_id, f"epoch {epoch} to {instance_id}")
    return Change(task=offered, attempt=attempt, history=(note,))


# ----------------------------------------------------------------- start, renew


def start(
    task: Task, attempt: Attempt, *, instance_id: str, epoch: int, now_ms: int, timing: Timing
) -> Change | Refusal:
    """Grant the start of an offered attempt: it runs under a lease from now on."""
    refusal = _not_theirs(attempt, instance_id, epoch)
    if refusal is not None:
        return refusal
    if attempt.state is AttemptState.RUNNING and now_ms < attempt.lease_deadline_ms:
        return Change(task=task, attempt=attempt)  # started already: the same grant
    current = task.attempt_id == attempt.attempt_id and task.state is TaskState.OFFERED
    if attempt.state is not AttemptState.OFFERED or not current:
        return Refusal(code=RefusalCode.NOT_OFFERED, message=f"attempt is {attempt.state}")
    deadline = min(now_ms + timing.lease_ms, now_ms + task.attempt_timeout_ms, task.deadline_at_ms)
    if now_ms >= attempt.offer_deadline_ms or deadline <= now_ms:
        return Refusal(code=RefusalCode.NOT_OFFERED, message="the offer has ended")
    started = attrs.evolve(
        attempt, state=AttemptState.RUNNING, started_at_ms=now_ms, lease_deadline_ms=deadline
    )
    running = attrs.evolve(
        task, state=TaskState.RUNNING, started_attempts=task.started_attempts + 1
    )
    note = _note(task, now_ms, "STARTED", attempt.attempt_id, f"lease until {deadline}")
    return Change(task=running, attempt=started, history=(note,))


def renew(
    task: Task, attempt: Attempt, *, instance_id: str, epoch: int, now_ms: int, timing: Timing
) -> Change | Refusal:
    """Extend a running attempt's lease (never past its attempt timeout or the task's deadline)."""
    refusal = _not_theirs(attempt, instance_id, epoch)
    if refusal is not None:
        return refusal
    if attempt.state is AttemptState.OFFERED:
        return Refusal(code=RefusalCode.NOT_STARTED, message="the attempt was never started")
    if attempt.state is not AttemptState.RUNNING or now_ms >= attempt.lease_deadline_ms:
        return Refusal(code=RefusalCode.LEASE_LOST, message=f"attempt is {attempt.state}")
    limit = min(attempt.started_at_ms + task.attempt_timeout_ms, task.deadline_at_ms)
    deadline = max(attempt.lease_deadline_ms, min(now_ms + timing.lease_ms, limit))
    renewed = attrs.evolve(
        attempt,
        lease_deadline_ms=deadline,
        renewals=attempt.renewals + 1,
        renewed_at_ms=now_ms,
    )
    return Change(task=task, attempt=renewed)


def _not_theirs(attempt: Attempt, instance_id: str, epoch: int) -> Refusal | None:
    if attempt.instance_id != instance_id or attempt.epoch != epoch:
        return Refusal(
            code=RefusalCode.UNKNOWN_ATTEMPT,
            message=f"no attempt {attempt.attempt_id!r} of epoch {epoch} for this instance",
        )
    return None


# ------------------------------------------------------------------ reports


def finish(
    task: Task,
    attempt: Attempt,
    *,
    instance_id: str,
    epoch: int,
    outcome: Outcome,
    now_ms: int,
    timing: Timing,
) -> tuple[Change, Disposition] | Refusal:
    """The worker's report of how an attempt ended: it decides, or it is evidence."""
    refusal = _not_theirs(attempt, instance_id, epoch)
    if refusal is not None:
        return refusal
    if attempt.state is AttemptState.OFFERED and now_ms < attempt.offer_deadline_ms:
        return Refusal(code=RefusalCode.NOT_STARTED, message="the attempt was never started")
    change = expire(task, attempt, now_ms, timing) or Change(task=task, attempt=attempt)
    task, attempt = change.task, change.attempt or attempt
    current = task.attempt_id == attempt.attempt_id and task.epoch == attempt.epoch
    if attempt.state is not AttemptState.RUNNING or not current:
        evidence = _note(task, now_ms, "EVIDENCE", attempt.attempt_id, _report(outcome))
        return Change(
            task=task, attempt=attempt, history=(*change.history, evidence)
        ), Disposition.EVIDENCE_ONLY
    ended = attrs.evolve(
        attempt, state=_ENDED_AS[type(outcome)], finished_at_ms=now_ms, outcome=outcome
    )
    return _after_attempt(task, ended, now_ms, timing), Disposition.ACCEPTED


_ENDED_AS: Final = {
    Succeeded: AttemptState.SUCCEEDED,
    Failed: AttemptState.FAILED,
    Unknown: AttemptState.UNKNOWN,
}


def _report(outcome: Outcome) -> str:
    """A report in full, as evidence keeps it (its texts were checked, and are kept as
    they came)."""
    match outcome:
        case Succeeded(result=result):
            return dumps({"reported": "SUCCEEDED", "result": RawJson(result)})
        case Failed(code=code, details=details, retryable=retryable):
            return dumps(
                {
                    "reported": "FAILED",
                    "code": code,
                    "details": RawJson(details),
                    "retryable": retryable,
                }
            )
        case Unknown(code=code):
            return dumps({"reported": "UNKNOWN", "code": code})


# ------------------------------------------------------------------- lapses


def expire(task: Task, attempt: Attempt, now_ms: int, timing: Timing) -> Change | None:
    """End a live attempt whose lease or offer has run out; None if it has not."""
    if attempt.state is AttemptState.RUNNING and now_ms >= attempt.lease_deadline_ms:
        ended = attrs.evolve(
            attempt,
            state=AttemptState.LEASE_EXPIRED,
            finished_at_ms=now_ms,
            outcome=Unknown(code=LEASE_EXPIRED),
        )
    elif attempt.state is AttemptState.OFFERED and now_ms >= attempt.offer_deadline_ms:
        ended = attrs.evolve(attempt, state=AttemptState.WITHDRAWN, finished_at_ms=now_ms)
    else:
        return None
    if task.attempt_id != attempt.attempt_id:
        return Change(task=task, attempt=ended)  # the task moved on long ago
    return _after_attempt(task, ended, now_ms, timing)


def time_out(task: Task, now_ms: int) -> Change | None:
    """Fail a task that waits in the queue past its total deadline; None if it need not."""
    if task.state is not TaskState.QUEUED or now_ms < task.deadline_at_ms:
        return None
    failed = attrs.evolve(
        task,
        state=TaskState.FAILED,
        failure_code=DEADLINE_EXCEEDED,
        failure_details=json.dumps({"deadline_at_ms": task.deadline_at_ms}),
        finished_at_ms=now_ms,
    )
    return Change(
        task=failed, history=(_note(task, now_ms, TaskState.FAILED, "", DEADLINE_EXCEEDED),)
    )


def resume_status(
    attempt: Attempt | None, *, instance_id: str, epoch: int, now_ms: int
) -> tuple[AttemptStatus, int]:
    """How a reconnected instance finds an attempt it held: offered, running or lost."""
    if attempt is None or attempt.instance_id != instance_id or attempt.epoch != epoch:
        return AttemptStatus.LOST, 0
    if attempt.state is AttemptState.OFFERED and now_ms < attempt.offer_deadline_ms:
        return AttemptStatus.OFFERED, attempt.offer_deadline_ms
    if attempt.state is AttemptState.RUNNING and now_ms < attempt.lease_deadline_ms:
        return AttemptStatus.RUNNING, attempt.lease_deadline_ms
    return AttemptStatus.LOST, 0


# ---------------------------------------------------------------- operators

ACTS_ON: Final = {
    "retry": (TaskState.NEEDS_REVIEW, TaskState.FAILED),
    "resolve": (TaskState.NEEDS_REVIEW,),
    "cancel": (TaskState.QUEUED,),
}
"""The states each operator's action applies to; in any other it is declined."""


def retry(task: Task, *, by: Operator, now_ms: int) -> Change | Declined:
    """Queue a NEEDS_REVIEW or FAILED task again, its budget one attempt larger: its next
    offer is a new attempt under the next epoch. It is offered no sooner than it could be
    before (a delay that has not ended still holds), and its total deadline counts again
    from then if that is later. Its ended attempts stay as they are."""
    if task.state not in ACTS_ON["retry"]:
        return _declined(task, "retried", "only a NEEDS_REVIEW or FAILED task can be")
    total_ms = task.deadline_at_ms - task.created_at_ms
    available_at_ms = max(now_ms, task.available_at_ms)
    queued = attrs.evolve(
        task,
        state=TaskState.QUEUED,
        available_at_ms=available_at_ms,
        max_attempts=task.max_attempts + 1,
        deadline_at_ms=max(task.deadline_at_ms, available_at_ms + total_ms),
        result=None,
        finished_at_ms=0,
    )
    detail = {"max_attempts": queued.max_attempts, "deadline_at_ms": queued.deadline_at_ms}
    return Change(task=queued, history=(_by(task, now_ms, "RETRIED", by, detail),))


def resolve(
    task: Task, outcome: Succeeded | Failed, *, by: Operator, now_ms: int
) -> Change | Declined:
    """End a NEEDS_REVIEW task as the operator says its uncertain attempt ended."""
    if task.state not in ACTS_ON["resolve"]:
        return _declined(task, "resolved", "only a NEEDS_REVIEW task can be")
    match outcome:
        case Succeeded(result=result):
            ended = _end(task, TaskState.SUCCEEDED, now_ms, result=result)
            detail: dict[str, object] = {"result_bytes": len(result.encode())}
        case Failed(code=code, details=details):
            ended = _end(task, TaskState.FAILED, now_ms, code=code, details=details)
            detail = {"code": code}
    detail["state"] = ended.state.value
    return Change(task=ended, history=(_by(task, now_ms, "RESOLVED", by, detail),))


def cancel(task: Task, *, by: Operator, now_ms: int) -> Change | Declined:
    """End a QUEUED task (waiting for its first offer or a retry's back-off) CANCELLED."""
    if task.state in (TaskState.OFFERED, TaskState.RUNNING):
        return _declined(
            task,
            "cancelled",
            f"its attempt {task.attempt_id} is under way: only a QUEUED task can be",
        )
    if task.state not in ACTS_ON["cancel"]:
        return _declined(task, "cancelled", "only a QUEUED task can be")
    ended = _end(task, TaskState.CANCELLED, now_ms)
    return Change(task=ended, history=(_by(task, now_ms, "CANCELLED", by, {}),))


def _declined(task: Task, done: str, why: str) -> Declined:
    return Declined(message=f"task {task.task_id!r} is {task.state}: {why} {done}")


def _by(
    task: Task, now_ms: int, kind: str, by: Operator, detail: Mapping[str, object]
) -> HistoryEntry:
    """An operator's line in the history: what was done, by which credential, under which
    request id."""
    said = {"by": by.credential_id, "request_id": by.request_id, **detail}
    return _note(task, now_ms, kind, task.attempt_id, json.dumps(said))


# ------------------------------------------------------------ the task's next state


def _after_attempt(task: Task, attempt: Attempt, now_ms: int, timing: Timing) -> Change:
    """The task's next state now that its current attempt has ended as `attempt` says."""
    outcome = attempt.outcome
    ended = _note(task, now_ms, attempt.state, attempt.attempt_id, _outcome_detail(outcome))
    match outcome:
        case Succeeded(result=result):
            task = _end(task, TaskState.SUCCEEDED, now_ms, result=result)
        case Failed(code=code, details=details, retryable=False):
            task = _end(task, TaskState.FAILED, now_ms, code=code, details=details)
        case Failed(code=code, details=details, retryable=True):
            task = _retry_or(task, TaskState.FAILED, now_ms, timing, code=code, details=details)
        case Unknown(code=code):
            task = attrs.evolve(task, uncertain=True)
            if task.idempotency is Idempotency.IDEMPOTENT:
                task = _retry_or(task, TaskState.FAILED, now_ms, timing, code=code)
            else:
                task = _end(task, TaskState.NEEDS_REVIEW, now_ms, code=code)
        case None:  # withdrawn: nothing ran, no attempt was used
            if now_ms < task.deadline_at_ms:
                task = attrs.evolve(task, state=TaskState.QUEUED, available_at_ms=now_ms)
            else:
                task = _end(task, TaskState.FAILED, now_ms, code=DEADLINE_EXCEEDED)
    moved = _note(task, now_ms, task.state, attempt.attempt_id, "")
    return Change(task=task, attempt=attempt, history=(ended, moved))


def _retry_or(
    task: Task, otherwise: TaskState, now_ms: int, timing: Timing, *, code: str, details: str = ""
) -> Task:
    if task.started_attempts < task.max_attempts and now_ms < task.deadline_at_ms:
        available_at_ms = now_ms + timing.backoff_ms(task.started_attempts)
        return attrs.evolve(
            task,
            state=TaskState.QUEUED,
            available_at_ms=available_at_ms,
            failure_code=code,
            failure_details=details,
        )
    return _end(task, otherwise, now_ms, code=code, details=details)


def _end(
    task: Task,
    state: TaskState,
    now_ms: int,
    *,
    result: str | None = None,
    code: str = "",
    details: str = "",
) -> Task:
    return attrs.evolve(
        task,
        state=state,
        result=result,
        failure_code=code,
        failure_details=details,
        finished_at_ms=now_ms,
    )


def _outcome_detail(outcome: Outcome | None) -> str:
    """An accepted outcome in short: the attempt and the task keep the result and details."""
    match outcome:
        case Succeeded(result=result):
            return json.dumps({"result_bytes": len(result.encode())})
        case Failed(code=code, retryable=retryable):
            return json.dumps({"code": code, "retryable": retryable})
        case Unknown(code=code):
            return json.dumps({"code": code})
        case None:
            return ""


def _note(task: Task, now_ms: int, kind: str, attempt_id: str, detail: str) -> HistoryEntry:
    return HistoryEntry(
        task_id=task.task_id, at_ms=now_ms, kind=str(kind), attempt_id=attempt_id, detail=detail
    )
