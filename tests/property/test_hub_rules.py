"""The hub's rules under random traffic: tasks are offered, started, renewed, reported on,
forgotten by their workers and overtaken by time, in any order, by the right and the
wrong instance, under the current and stale epochs.

The machine keeps tasks and attempts as the rules hand them back (what the
store would write) and checks, after every step:

* a task that ended never changes again;
* epochs count the task's attempts, 1, 2, 3 ..., the newest being the task's
  current attempt, and at most that one is live (offered or running);
* the task's state agrees with its current attempt's;
* no more attempts start than the task allows;
* a SUCCEEDED task's result is the one its current attempt reported;
* a non-idempotent task never runs again after an attempt of unknown effect:
  it goes to NEEDS_REVIEW;
* a delayed task is never offered before its time, and a claim offers the
  offerable tasks by priority, then availability, then submission order,
  passing over only those whose concurrency key is at its limit;
* no concurrency key ever has more live attempts (offered or running) than
  its limit;
* a report is accepted only from the instance holding a running attempt under
  its own epoch, within its lease; anything else is refused or evidence only,
  and evidence never ends a task as it reports;
* an operator's retry, resolve or cancel applies only in the states it names
  (else it is declined and changes nothing), touches no attempt (an attempt
  that ended never changes again; a retried task's next attempt has the next
  epoch), and adds one history line naming its credential; an ended task
  changes only by an operator's action; a task's history only grows.
"""

from __future__ import annotations

import itertools
import json
from typing import Final

from hypothesis import event, note
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from blockx.hub import Attempt, AttemptState, Idempotency, Task, TaskState
from blockx.hub._rules import (
    Change,
    Declined,
    Operator,
    Refusal,
    Timing,
    can_offer,
    cancel,
    choose_offers,
    expire,
    finish,
    offer,
    offer_order,
    renew,
    resolve,
    retry,
    start,
    time_out,
)
from blockx.hubwire import Capability, Disposition, Failed, Outcome, Succeeded, Unknown

TIMING = Timing(lease_ms=1_000, offer_ttl_ms=500, retry_backoff_ms=100, max_retry_backoff_ms=400)
CAPABILITY = Capability(handler="h", handler_version="1", payload_version="1")
INSTANCES = ("a", "b")
OUTCOMES = st.one_of(
    st.builds(Succeeded, result=st.integers(0, 9).map(str)),
    st.builds(
        Failed,
        code=st.sampled_from(["BAD", "BUSY"]),
        details=st.just("{}"),
        retryable=st.booleans(),
    ),
    st.builds(Unknown, code=st.just("LOST")),
)
UNCERTAIN = (AttemptState.UNKNOWN, AttemptState.LEASE_EXPIRED)
KEY_LIMITS = {"k1": 1, "k2": 2}
"""Key "k3" has no limit."""
STARTED = (AttemptState.RUNNING, AttemptState.SUCCEEDED, AttemptState.FAILED, *UNCERTAIN)
ACTS_ON: Final = {
    "retry": (TaskState.NEEDS_REVIEW, TaskState.FAILED),
    "resolve": (TaskState.NEEDS_REVIEW,),
    "cancel": (TaskState.QUEUED,),
}
"""The states each operator action applies to."""


class HubRules(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.now_ms = 0
        self.tasks: dict[str, Task] = {}
        self.attempts: dict[str, Attempt] = {}
        self.ended: dict[str, Task] = {}
        self.ended_attempts: dict[str, Attempt] = {}
        self.history: dict[str, list[str]] = {}
        """Each task's history lines' kinds, as the changes appended them."""
        self.acted: dict[str, list[tuple[int, str]]] = {}
        """(epoch, action) of every operator action a task took."""
        self.resolved: dict[str, Outcome] = {}
        self.ids = (f"x{n}" for n in itertools.count())
        self.delays: dict[str, int] = {}

    def live_by_key(self) -> dict[str, int]:
        live: dict[str, int] = {}
        for task in self.tasks.values():
            if task.concurrency_key and task.state in (TaskState.OFFERED, TaskState.RUNNING):
                live[task.concurrency_key] = live.get(task.concurrency_key, 0) + 1
        return live

    # ------------------------------------------------------------------ helpers

    def apply(self, change: Change) -> None:
        self.tasks[change.task.task_id] = change.task
        if change.attempt is not None:
            self.attempts[change.attempt.attempt_id] = change.attempt
        assert all(entry.task_id == change.task.task_id for entry in change.history)
        assert all(entry.at_ms == self.now_ms for entry in change.history)
        self.history.setdefault(change.task.task_id, []).extend(e.kind for e in change.history)

    def pick(self, data: st.DataObject) -> tuple[Attempt, str]:
        """An attempt (a live one, mostly) and who speaks for it (its instance, mostly)."""
        live = sorted(a.attempt_id for a in self.attempts.values() if a.state.is_live)
        mostly_live = bool(live) and data.draw(st.integers(0, 3)) > 0
        pool = live if mostly_live else sorted(self.attempts)
        attempt = self.attempts[data.draw(st.sampled_from(pool))]
        speaker = data.draw(st.sampled_from([attempt.instance_id] * 3 + list(INSTANCES)))
        return attempt, speaker

    def attempts_of(self, task_id: str) -> list[Attempt]:
        return sorted(
            (a for a in self.attempts.values() if a.task_id == task_id), key=lambda a: a.epoch
        )

    # -------------------------------------------------------------------- rules

    @rule(
        idempotent=st.booleans(),
        max_attempts=st.integers(1, 3),
        deadline_ms=st.integers(1, 8_000),
        timeout_ms=st.integers(1, 2_000),
        priority=st.sampled_from([0, 5, 5, 9]),
        delay_ms=st.sampled_from([0, 0, 0, 200, 1_000]),
        key=st.sampled_from(["", "k1", "k2", "k3"]),
    )
    def submit(  # noqa: PLR0917 - Hypothesis passes a rule's arguments by name
        self,
        idempotent: bool,
        max_attempts: int,
        deadline_ms: int,
        timeout_ms: int,
        priority: int,
        delay_ms: int,
        key: str,
    ) -> None:
        task_id = next(self.ids)
        self.delays[task_id] = delay_ms
        self.tasks[task_id] = Task(
            task_id=task_id,
            queue_id="q",
            capability=CAPABILITY,
            payload="{}",
            idempotency=Idempotency.IDEMPOTENT if idempotent else Idempotency.NON_IDEMPOTENT,
            max_attempts=max_attempts,
            attempt_timeout_ms=timeout_ms,
            created_at_ms=self.now_ms,
            deadline_at_ms=self.now_ms + deadline_ms,
            state=TaskState.QUEUED,
            available_at_ms=self.now_ms + delay_ms,
            priority=priority,
            seq=len(self.delays),
            concurrency_key=key,
        )

    @rule(ms=st.sampled_from([1, 50, 300]) | st.integers(0, 1_500))
    def time_passes(self, ms: int) -> None:
        self.now_ms += ms

    @precondition(lambda self: any(can_offer(t, self.now_ms) for t in self.tasks.values()))
    @rule(room=st.integers(1, 3), instance=st.sampled_from(INSTANCES), and_start=st.booleans())
    def claim(self, room: int, instance: str, and_start: bool) -> None:
        live = self.live_by_key()
        chosen = choose_offers(
            self.tasks.values(),
            now_ms=self.now_ms,
            room=room,
            live_by_key=live,
            limit_by_key=KEY_LIMITS,
        )
        note(f"claim {room} for {instance}: {[t.task_id for t in chosen]}")
        self.check_claim(chosen, room, live)
        for task in chosen:
            self.offer_one(task, instance, and_start)

    def check_claim(self, chosen: list[Task], room: int, live: dict[str, int]) -> None:
        """Every task passed over for a chosen one, or left out of a claim with room, could
        not be offered or had its key at its limit."""
        assert chosen == sorted(chosen, key=offer_order)
        for task in chosen:
            assert task.created_at_ms + self.delays[task.task_id] <= self.now_ms
        last = offer_order(chosen[-1]) if len(chosen) == room else None
        for task in self.tasks.values():
            if task in chosen or not can_offer(task, self.now_ms):
                continue
            if last is None or offer_order(task) < last:
                key = task.concurrency_key
                taken = live.get(key, 0) + sum(t.concurrency_key == key for t in chosen)
                assert key in KEY_LIMITS, task
                assert taken >= KEY_LIMITS[key], task

    def offer_one(self, task: Task, instance: str, and_start: bool) -> None:
        offered = offer(
            task, attempt_id=next(self.ids), instance_id=instance, now_ms=self.now_ms, timing=TIMING
        )
        self.apply(offered)
        assert offered.attempt is not None
        if and_start:  # what a worker does at once, mostly
            started = start(
                offered.task,
                offered.attempt,
                instance_id=instance,
                epoch=offered.attempt.epoch,
                now_ms=self.now_ms,
                timing=TIMING,
            )
            assert isinstance(started, Change)
            self.apply(started)

    @precondition(lambda self: bool(self.attempts))
    @rule(
        data=st.data(),
        verb=st.sampled_from(["start", "renew"]),
        epoch_shift=st.sampled_from([0, 0, 0, -1, 1]),
    )
    def start_or_renew(self, data: st.DataObject, verb: str, epoch_shift: int) -> None:
        attempt, instance = self.pick(data)
        task = self.tasks[attempt.task_id]
        do = start if verb == "start" else renew
        result = do(
            task,
            attempt,
            instance_id=instance,
            epoch=attempt.epoch + epoch_shift,
            now_ms=self.now_ms,
            timing=TIMING,
        )
        note(f"{verb} {attempt.attempt_id} by {instance} shift {epoch_shift}: {result}")
        event(f"{verb}: {result.code if isinstance(result, Refusal) else 'granted'}")
        if isinstance(result, Refusal):
            return
        assert (instance, epoch_shift) == (attempt.instance_id, 0)
        assert result.attempt is not None
        lease = result.attempt.lease_deadline_ms
        assert (
            self.now_ms
            < lease
            <= min(result.attempt.started_at_ms + task.attempt_timeout_ms, task.deadline_at_ms)
        )
        assert lease >= attempt.lease_deadline_ms  # a lease never shrinks
        renewed = (result.attempt.renewals, result.attempt.renewed_at_ms)
        if verb == "renew":  # counted, with its time; a start (again) counts none
            assert renewed == (attempt.renewals + 1, self.now_ms)
        else:
            assert renewed == (attempt.renewals, attempt.renewed_at_ms)
        self.apply(result)

    @precondition(lambda self: bool(self.attempts))
    @rule(data=st.data(), epoch_shift=st.sampled_from([0, 0, 0, -1]), outcome=OUTCOMES)
    def report(self, data: st.DataObject, epoch_shift: int, outcome: Outcome) -> None:
        attempt, instance = self.pick(data)
        task = self.tasks[attempt.task_id]
        result = finish(
            task,
            attempt,
            instance_id=instance,
            epoch=attempt.epoch + epoch_shift,
            outcome=outcome,
            now_ms=self.now_ms,
            timing=TIMING,
        )
        note(f"report {outcome} on {attempt.attempt_id} by {instance}: {result}")
        if isinstance(result, Refusal):
            event(f"report: {result.code}")
            return
        event(f"report: {result[1]}")
        assert (instance, epoch_shift) == (attempt.instance_id, 0)
        change, disposition = result
        if disposition is Disposition.ACCEPTED:
            assert attempt.state is AttemptState.RUNNING
            assert self.now_ms < attempt.lease_deadline_ms
            assert task.attempt_id == attempt.attempt_id
            assert change.attempt is not None
            assert change.attempt.outcome == outcome
        else:
            lapsed = expire(task, attempt, self.now_ms, TIMING)
            assert change.task == (task if lapsed is None else lapsed.task)  # decides nothing
            assert change.history[-1].kind == "EVIDENCE"
        self.apply(change)

    @rule()
    def sweep(self) -> None:
        for attempt in list(self.attempts.values()):
            change = expire(self.tasks[attempt.task_id], attempt, self.now_ms, TIMING)
            if change is not None:
                assert change.attempt is not None
                assert not change.attempt.state.is_live
                self.apply(change)
        for task in list(self.tasks.values()):
            timed_out = time_out(task, self.now_ms)
            if timed_out is not None:
                assert timed_out.task.failure_code == "DEADLINE_EXCEEDED"
                self.apply(timed_out)

    @precondition(lambda self: bool(self.tasks))
    @rule(
        data=st.data(),
        action=st.sampled_from(["retry", "resolve", "resolve", "cancel"]),
        outcome=st.builds(Succeeded, result=st.just("7"))
        | st.builds(Failed, code=st.just("GONE"), details=st.just("[1]"), retryable=st.just(False)),
    )
    def operator_acts(self, data: st.DataObject, action: str, outcome: Succeeded | Failed) -> None:
        applies = sorted(t.task_id for t in self.tasks.values() if t.state in ACTS_ON[action])
        mostly_applies = bool(applies) and data.draw(st.integers(0, 3)) > 0
        task = self.tasks[
            data.draw(st.sampled_from(applies if mostly_applies else sorted(self.tasks)))
        ]
        by = Operator(credential_id="c1", request_id=next(self.ids))
        match action:
            case "retry":
                result = retry(task, by=by, now_ms=self.now_ms)
            case "resolve":
                result = resolve(task, outcome, by=by, now_ms=self.now_ms)
            case _:
                result = cancel(task, by=by, now_ms=self.now_ms)
        note(f"{action} {task.task_id} ({task.state}): {result}")
        event(f"{action} {task.state}: {'declined' if isinstance(result, Declined) else 'done'}")
        if isinstance(result, Declined):
            assert task.state not in ACTS_ON[action]
            assert task.task_id in result.message
            assert task.state in result.message
            return
        assert task.state in ACTS_ON[action]
        assert result.attempt is None  # no action touches an attempt
        [entry] = result.history
        assert json.loads(entry.detail)["by"] == "c1"
        self.apply(result)
        self.acted.setdefault(task.task_id, []).append((task.epoch, action))
        if action == "resolve":
            self.resolved[task.task_id] = outcome
        if result.task.state.is_terminal:
            self.ended[task.task_id] = result.task
        else:
            assert result.task.max_attempts == task.max_attempts + 1
            assert result.task.epoch == task.epoch  # the next offer makes the next epoch
            del self.ended[task.task_id]

    # --------------------------------------------------------------- invariants

    @invariant()
    def ended_tasks_never_change(self) -> None:
        for task_id, task in self.tasks.items():
            if task_id in self.ended:
                assert task == self.ended[task_id]
            elif task.state.is_terminal:
                self.ended[task_id] = task
                assert task.finished_at_ms == self.now_ms

    @invariant()
    def ended_attempts_never_change(self) -> None:
        for attempt_id, attempt in self.attempts.items():
            if attempt_id in self.ended_attempts:
                assert attempt == self.ended_attempts[attempt_id]
            elif not attempt.state.is_live:
                self.ended_attempts[attempt_id] = attempt

    @invariant()
    def histories_name_each_operator_action(self) -> None:
        kinds = {"retry": "RETRIED", "resolve": "RESOLVED", "cancel": "CANCELLED"}
        for task_id, history in self.history.items():
            acted = sorted(kinds[action] for _, action in self.acted.get(task_id, ()))
            assert sorted(k for k in history if k in ("RETRIED", "RESOLVED", "CANCELLED")) == (
                acted
            )

    @invariant()
    def epochs_count_attempts_and_only_the_newest_lives(self) -> None:
        for task in self.tasks.values():
            attempts = self.attempts_of(task.task_id)
            assert [a.epoch for a in attempts] == list(range(1, len(attempts) + 1))
            assert task.epoch == len(attempts)
            if attempts:
                assert task.attempt_id == attempts[-1].attempt_id
            assert all(not a.state.is_live for a in attempts[:-1])
            current = attempts[-1].state if attempts else None
            expected = {
                TaskState.OFFERED: AttemptState.OFFERED,
                TaskState.RUNNING: AttemptState.RUNNING,
            }.get(task.state)
            if expected is not None:
                assert current is expected
            else:
                assert current is None or not current.is_live

    @invariant()
    def attempts_started_stay_within_the_budget(self) -> None:
        for task in self.tasks.values():
            started = [a for a in self.attempts_of(task.task_id) if a.state in STARTED]
            assert task.started_attempts == len(started) <= task.max_attempts

    @invariant()
    def outcomes_come_from_the_current_attempt(self) -> None:
        for task in self.tasks.values():
            attempts = self.attempts_of(task.task_id)
            acted = self.acted.get(task.task_id, [])
            resolved = (task.epoch, "resolve") in acted
            if task.state is TaskState.SUCCEEDED and resolved:
                assert attempts[-1].state in UNCERTAIN
                assert self.resolved[task.task_id] == Succeeded(result=task.result or "")
            elif task.state is TaskState.SUCCEEDED:
                assert attempts[-1].state is AttemptState.SUCCEEDED
                assert isinstance(attempts[-1].outcome, Succeeded)
                assert task.result == attempts[-1].outcome.result
            else:
                assert task.result is None
            if task.state is TaskState.NEEDS_REVIEW:
                assert task.idempotency is Idempotency.NON_IDEMPOTENT
                assert attempts[-1].state in UNCERTAIN
            if task.idempotency is Idempotency.NON_IDEMPOTENT:
                # Never run again after an uncertain attempt unless an operator said so.
                for uncertain in (a.epoch for a in attempts if a.state in UNCERTAIN):
                    assert (uncertain, "retry") in acted or (
                        uncertain == task.epoch
                        and (task.state is TaskState.NEEDS_REVIEW or resolved)
                    )
            assert task.uncertain == any(a.state in UNCERTAIN for a in attempts)

    @invariant()
    def no_key_runs_more_than_its_limit(self) -> None:
        for key, live in self.live_by_key().items():
            assert live <= KEY_LIMITS.get(key, live)

    @invariant()
    def failure_details_are_json(self) -> None:
        for task in self.tasks.values():
            if task.failure_details:
                json.loads(task.failure_details)


TestHubRules = HubRules.TestCase
