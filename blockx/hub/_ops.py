"""Operations on the hub's database: each reads rows, asks the rules, writes what they say.

An operation is a function of one open transaction (`Tx`). The committer runs
many of them in one transaction; none of them commits. Control messages go
through `answered`, which keeps the answer as a receipt under the sender's
message id, in the same transaction as the change it answers: a repeated id
gets the very same answer, and an answer is never sent for a change that was
not committed.
"""

from __future__ import annotations

import hashlib
import secrets
import time
from collections.abc import Callable, Sequence
from typing import Final, TypeAlias

import attrs

from blockx.hub import _rules
from blockx.hub._model import Attempt, Credential, Submission, Task, TaskState
from blockx.hub._rules import Change, Refusal, Timing
from blockx.hub._store import Keys, Tx
from blockx.hubwire import (
    CODE_FORM,
    Answer,
    AttemptRef,
    Capability,
    ControlMessage,
    Disposition,
    Failed,
    Finish,
    Granted,
    InvalidJson,
    JsonTooLarge,
    Offer,
    Recorded,
    RefusalCode,
    Refused,
    Renew,
    Resume,
    ResumedAttempt,
    Start,
    Succeeded,
    compact,
    encode_message,
    parse_json,
)

Decide: TypeAlias = Callable[[Tx], Answer]
"""Works out the answer to one control message (and makes the change it asks for)."""


def new_id() -> str:
    """A one-off id (a hub's own, a command's task): 32 hex digits, the first 12 the time in
    milliseconds. A hub makes its task and attempt ids with a `TimeOrderedIds`."""
    return f"{time.time_ns() // 1_000_000:012x}{secrets.token_hex(10)}"


_COUNTER_LIMIT: Final = 0x10000


@attrs.define
class TimeOrderedIds:
    """Makes task and attempt ids that sort in the order they were made, by this maker.

    32 hex digits: 12 of the time in milliseconds (`now_ms`), 4 of a counter
    within that millisecond, 16 random (as a UUIDv7 with a counter, RFC 9562
    section 6.2). New rows go to the end of the tables' indexes instead of
    anywhere in them. `seq` makes the tasks' submission order (`Task.seq`) from
    the same time and counter, whatever id a producer chose. A clock that steps
    back, or more than 65,536 numbers in a millisecond, borrow from the next.
    """

    now_ms: Callable[[], int]
    _last_ms: int = 0
    _counter: int = 0

    def __call__(self) -> str:
        return f"{self.seq():016x}{secrets.token_hex(8)}"

    def seq(self) -> int:
        """The next of this maker's increasing numbers: the time in milliseconds times
        65,536 plus a counter within it."""
        now_ms = self.now_ms()
        if now_ms > self._last_ms:
            self._last_ms, self._counter = now_ms, 0
        else:
            self._counter += 1
            if self._counter == _COUNTER_LIMIT:
                self._last_ms, self._counter = self._last_ms + 1, 0
        return self._last_ms * _COUNTER_LIMIT + self._counter


class Reused:
    """A message id that came again with a different message."""


REUSED: Final = Reused()


def digest(message: ControlMessage) -> str:
    """What identifies a control message's content, for telling resends from reuses."""
    return hashlib.sha256(encode_message(message)).hexdigest()[:32]


def answered(
    instance_id: str,
    message: ControlMessage,
    now_ms: int,
    decide: Callable[[Tx], Answer],
) -> _Answered:
    """`decide` once per message id: its encoded answer, kept as the message's receipt."""
    return _Answered(
        instance_id=instance_id,
        message_id=message.message_id,
        fingerprint=digest(message),
        now_ms=now_ms,
        decide=decide,
        keys=Keys(attempts=_attempts_named(message), receipts=((instance_id, message.message_id),)),
    )


@attrs.frozen(kw_only=True)
class _Answered:
    instance_id: str
    message_id: str
    fingerprint: str
    now_ms: int
    decide: Callable[[Tx], Answer]
    keys: Keys
    """What the committer reads for a whole batch at once (`Tx.prefetch`)."""

    def __call__(self, tx: Tx) -> bytes | Reused:
        return self.answer(tx)[0]

    def answer(self, tx: Tx) -> tuple[bytes | Reused, Answer | None]:
        """The encoded answer, and the answer itself if it was decided now (not kept)."""
        kept = tx.receipt(self.instance_id, self.message_id)
        if kept is not None:
            return (kept[1] if kept[0] == self.fingerprint else REUSED), None
        answer = self.decide(tx)
        encoded = encode_message(answer)
        tx.keep_receipt(self.instance_id, self.message_id, self.fingerprint, encoded, self.now_ms)
        return encoded, answer


def _attempts_named(message: ControlMessage) -> tuple[str, ...]:
    match message:
        case Start(attempt_id=attempt_id) | Renew(attempt_id=attempt_id):
            return (attempt_id,)
        case Finish(attempt_id=attempt_id):
            return (attempt_id,)
        case Resume(attempts=refs):
            return tuple(ref.attempt_id for ref in refs)
        case _:
            return ()


def _write(tx: Tx, change: Change, *, before: Task, new_attempt: bool = False) -> None:
    if change.task != before:
        tx.update_task(change.task)
    if change.attempt is not None:
        tx.put_attempt(change.attempt, new=new_attempt)
    tx.note(change.history)


# --------------------------------------------------------------- control messages


def start(message: Start, instance_id: str, now_ms: int, timing: Timing) -> Callable[[Tx], Answer]:
    return _lease(_rules.start, message, instance_id, now_ms, timing)


def renew(message: Renew, instance_id: str, now_ms: int, timing: Timing) -> Callable[[Tx], Answer]:
    return _lease(_rules.renew, message, instance_id, now_ms, timing)


def _lease(
    rule: Callable[..., Change | Refusal],
    message: Start | Renew,
    instance_id: str,
    now_ms: int,
    timing: Timing,
) -> Callable[[Tx], Answer]:
    """A Start or a Renew: what `rule` makes of it, answered with the lease it grants."""

    def decide(tx: Tx) -> Answer:
        found = _attempt_and_task(tx, message.attempt_id)
        if isinstance(found, Refusal):
            return _refused(message, found)
        attempt, task = found
        result = rule(
            task,
            attempt,
            instance_id=instance_id,
            epoch=message.epoch,
            now_ms=now_ms,
            timing=timing,
        )
        if isinstance(result, Refusal):
            return _refused(message, result)
        if result.attempt != attempt or result.task != task:
            _write(tx, result, before=task)
        assert result.attempt is not None
        return Granted(
            reply_to=message.message_id,
            attempt_id=message.attempt_id,
            lease_deadline_ms=result.attempt.lease_deadline_ms,
        )

    return decide


def finish(
    message: Finish, instance_id: str, now_ms: int, timing: Timing
) -> Callable[[Tx], Answer]:
    problem = check_report(message)

    def decide(tx: Tx) -> Answer:
        found = problem or _attempt_and_task(tx, message.attempt_id)
        if isinstance(found, Refusal):
            return _refused(message, found)
        attempt, task = found
        result = _rules.finish(
            task,
            attempt,
            instance_id=instance_id,
            epoch=message.epoch,
            outcome=message.outcome,
            now_ms=now_ms,
            timing=timing,
        )
        if isinstance(result, Refusal):
            return _refused(message, result)
        change, disposition = result
        _write(tx, change, before=task)
        return Recorded(
            reply_to=message.message_id, attempt_id=message.attempt_id, disposition=disposition
        )

    return decide


def finished_then_offer(
    instance_id: str,
    message: Finish,
    now_ms: int,
    timing: Timing,
    claim: Claim,
) -> Callable[[Tx], tuple[bytes | Reused, list[Offer] | None]]:
    """`finish` answered as `answered` does, then, if it ended the attempt as its task's
    outcome just now, `claim` in the same transaction: the offer that takes the attempt's
    place rides on the finish's commit instead of waiting for one of its own. The offers
    are None when no claim ran."""
    decide = finish(message, instance_id, now_ms, timing)
    return _FinishedThenOffer(finished=answered(instance_id, message, now_ms, decide), claim=claim)


@attrs.frozen(kw_only=True)
class _FinishedThenOffer:
    finished: _Answered
    claim: Claim

    @property
    def keys(self) -> Keys:
        return attrs.evolve(self.finished.keys, claims=self.claim.keys.claims)

    def __call__(self, tx: Tx) -> tuple[bytes | Reused, list[Offer] | None]:
        encoded, decided = self.finished.answer(tx)
        if isinstance(decided, Recorded) and decided.disposition is Disposition.ACCEPTED:
            return encoded, self.claim(tx)
        return encoded, None


def _refused(message: Start | Renew | Finish, refusal: Refusal) -> Refused:
    return Refused(
        reply_to=message.message_id,
        attempt_id=message.attempt_id,
        code=refusal.code,
        message=refusal.message,
    )


def check_report(message: Finish) -> Refusal | None:
    """Why the hub cannot take a report as it is (size, the JSON rules, code form), or
    None; a refusal of a text names the path of what breaks a rule (`result.items[3]`)."""
    match message.outcome:
        case Succeeded(result=text):
            texts = [("result", text)]
        case Failed(details=text):
            texts = [("details", text)]
        case _:
            texts = []
    code = getattr(message.outcome, "code", None)
    if code is not None and not CODE_FORM.fullmatch(code):
        return _invalid(f"code {code!r} must match {CODE_FORM.pattern}")
    for name, text in texts:
        try:
            value = parse_json(text, name)
        except JsonTooLarge as error:
            return Refusal(code=RefusalCode.TOO_LARGE, message=str(error))
        except InvalidJson as error:
            return _invalid(str(error))
        if name == "result" and value is None:
            return _invalid("result must not be null")
    return None


def resume(
    attempts: Sequence[AttemptRef], instance_id: str, now_ms: int
) -> Callable[[Tx], tuple[ResumedAttempt, ...]]:
    def look(tx: Tx) -> tuple[ResumedAttempt, ...]:
        found = []
        for ref in attempts:
            status, deadline = _rules.resume_status(
                tx.attempt(ref.attempt_id), instance_id=instance_id, epoch=ref.epoch, now_ms=now_ms
            )
            found.append(
                ResumedAttempt(
                    attempt_id=ref.attempt_id,
                    epoch=ref.epoch,
                    status=status,
                    lease_deadline_ms=deadline,
                )
            )
        return tuple(found)

    return look


def _invalid(message: str) -> Refusal:
    return Refusal(code=RefusalCode.INVALID_REPORT, message=message)


def _attempt_and_task(tx: Tx, attempt_id: str) -> tuple[Attempt, Task] | Refusal:
    attempt = tx.attempt(attempt_id)
    task = None if attempt is None else tx.task(attempt.task_id)
    if attempt is None or task is None:
        return Refusal(code=RefusalCode.UNKNOWN_ATTEMPT, message=f"no attempt {attempt_id!r}")
    return attempt, task


# ----------------------------------------------------------------- offers, lapses


MAX_CLAIM_ROUNDS: Final = 8
"""How many times one claim reads on past tasks whose concurrency keys are at their
limits: a queue whose head holds tasks of more full keys than that offers less than it
could, until their attempts end."""


def offer(
    queue_id: str,
    capabilities: Sequence[Capability],
    instance_id: str,
    *,
    room: int,
    now_ms: int,
    timing: Timing,
    new_id: Callable[[], str],
) -> Claim:
    """Offer up to `room` matching tasks of `queue_id` to `instance_id`, in offer order,
    keeping each concurrency key within its limit."""
    return Claim(
        queue_id=queue_id,
        capabilities=tuple(capability.key for capability in capabilities),
        instance_id=instance_id,
        room=room,
        now_ms=now_ms,
        timing=timing,
        new_id=new_id,
    )


@attrs.frozen(kw_only=True)
class Claim:
    """Offers tasks to a worker (see `offer`)."""

    queue_id: str
    capabilities: tuple[str, ...]
    instance_id: str
    room: int
    now_ms: int
    timing: Timing
    new_id: Callable[[], str]

    @property
    def keys(self) -> Keys:
        return Keys(
            claims=tuple((self.queue_id, key, self.room, self.now_ms) for key in self.capabilities)
        )

    def __call__(self, tx: Tx) -> list[Offer]:
        queue_id, room, now_ms = self.queue_id, self.room, self.now_ms
        offers: list[Offer] = []
        counts = _KeyCounts(queue_id)
        for _ in range(MAX_CLAIM_ROUNDS):
            wanted = room - len(offers)
            found = tx.offerable(
                queue_id, self.capabilities, now_ms, wanted, passed_keys=counts.passed
            )
            candidates = counts.learn(tx, found)
            chosen = _rules.choose_offers(
                candidates,
                now_ms=now_ms,
                room=wanted,
                live_by_key=counts.live,
                limit_by_key=counts.limits,
            )
            for task in chosen:
                offers.append(
                    _offer_one(
                        tx,
                        task,
                        instance_id=self.instance_id,
                        now_ms=now_ms,
                        timing=self.timing,
                        attempt_id=self.new_id(),
                    )
                )
                counts.live[task.concurrency_key] = counts.live.get(task.concurrency_key, 0) + 1
            if len(chosen) == wanted or len(found) < wanted:
                break
            counts.passed.update(
                t.concurrency_key for t in candidates if t.concurrency_key and t not in chosen
            )
        return offers


@attrs.define
class _KeyCounts:
    """What one claim knows of the concurrency keys of the tasks it has read."""

    queue_id: str
    seen: set[str] = attrs.Factory(set)
    limits: dict[str, int] = attrs.Factory(dict)
    """The limit of each key seen that has one."""
    live: dict[str, int] = attrs.Factory(dict)
    """Live attempts of each key with a limit, those this claim offered included."""
    passed: set[str] = attrs.Factory(set)
    """Keys whose tasks the claim reads no more: full, or held by another hub's claim."""

    def learn(self, tx: Tx, tasks: list[Task]) -> list[Task]:
        """`tasks` but for those of keys passed over, once the limits of their keys not seen
        before are known, each held for the transaction, and their live attempts counted."""
        new = {t.concurrency_key for t in tasks if t.concurrency_key} - self.seen
        if new:
            self.seen |= new
            limits = tx.key_limits(self.queue_id, new)
            held = tx.hold_keys(self.queue_id, limits.keys())
            self.passed |= limits.keys() - held
            self.limits.update(limits)
            self.live.update(tx.live_by_key(self.queue_id, held))
        return [t for t in tasks if t.concurrency_key not in self.passed]


def _offer_one(
    tx: Tx, task: Task, *, instance_id: str, now_ms: int, timing: Timing, attempt_id: str
) -> Offer:
    change = _rules.offer(
        task, attempt_id=attempt_id, instance_id=instance_id, now_ms=now_ms, timing=timing
    )
    _write(tx, change, before=task, new_attempt=True)
    attempt = change.attempt
    assert attempt is not None
    return Offer(
        attempt_id=attempt.attempt_id,
        epoch=attempt.epoch,
        task_id=task.task_id,
        capability=task.capability,
        payload=task.payload,
        offer_deadline_ms=attempt.offer_deadline_ms,
        attempt_timeout_ms=task.attempt_timeout_ms,
        task_deadline_ms=task.deadline_at_ms,
    )


@attrs.frozen(kw_only=True)
class Swept:
    """What a sweep ended: (instance id, attempt id) of each lapsed attempt, and how many
    queued tasks ran out of time; `next_due_ms` is when the next one is due."""

    attempts: tuple[tuple[str, str], ...]
    timed_out: int
    next_due_ms: int | None


def sweep(now_ms: int, timing: Timing, limit: int) -> Callable[[Tx], Swept]:
    """End lapsed offers and leases, and queued tasks past their deadline (up to `limit` each)."""

    def run(tx: Tx) -> Swept:
        lapsed = []
        for attempt in tx.due_attempts(now_ms, limit):
            task = tx.task(attempt.task_id)
            assert task is not None
            change = _rules.expire(task, attempt, now_ms, timing)
            if change is not None:
                _write(tx, change, before=task)
                lapsed.append((attempt.instance_id, attempt.attempt_id))
        timed_out = 0
        for task in tx.overdue_tasks(now_ms, limit):
            change = _rules.time_out(task, now_ms)
            if change is not None:
                _write(tx, change, before=task)
                timed_out += 1
        return Swept(attempts=tuple(lapsed), timed_out=timed_out, next_due_ms=tx.next_due_ms())

    return run


# ------------------------------------------------------------------------ tasks


@attrs.frozen(kw_only=True)
class SubmitRefusal:
    field: str
    message: str
    status: int = 404
    """404: no such queue; 409: a task of that id exists with other content; 400: a value
    the submission cannot have."""


@attrs.frozen(kw_only=True)
class Submitted:
    task: Task
    created: bool
    """False for a repeat of an earlier submission of the same task id."""


def submit(
    submission: Submission, now_ms: int, ids: TimeOrderedIds
) -> Callable[[Tx], Submitted | SubmitRefusal]:
    """Queue a task; a repeat of the same submission (same task id) returns the task.

    A delayed task waits as a retry's back-off does (`available_at_ms`); its total
    deadline counts from its submission, and must leave it time to run."""

    def run(tx: Tx) -> Submitted | SubmitRefusal:
        if not tx.queue_exists(submission.queue_id):
            return SubmitRefusal(field="queue", message=f"no queue {submission.queue_id!r}")
        available_at_ms = max(now_ms + submission.delay_ms, submission.run_at_ms)
        if available_at_ms >= now_ms + submission.total_deadline_ms:
            field = "run_at_ms" if submission.run_at_ms else "delay_ms"
            message = f"{field} must come before the task's total deadline (total_deadline_ms)"
            return SubmitRefusal(field=field, message=message, status=400)
        task = Task(
            task_id=submission.task_id or ids(),
            queue_id=submission.queue_id,
            capability=submission.capability,
            payload=submission.payload,
            idempotency=submission.idempotency,
            max_attempts=submission.max_attempts,
            attempt_timeout_ms=submission.attempt_timeout_ms,
            created_at_ms=now_ms,
            deadline_at_ms=now_ms + submission.total_deadline_ms,
            state=TaskState.QUEUED,
            available_at_ms=available_at_ms,
            priority=submission.priority,
            seq=ids.seq(),
            concurrency_key=submission.concurrency_key,
        )
        # An id made here is new; only a producer's own id may name a task already there.
        existing = tx.task(task.task_id) if submission.task_id else None
        if existing is not None:
            if _same_submission(existing, task):
                return Submitted(task=existing, created=False)
            return SubmitRefusal(
                field="task_id",
                message=f"task {task.task_id!r} exists with other content",
                status=409,
            )
        tx.insert_task(task)
        tx.note([_rules.submitted(task, now_ms)])
        return Submitted(task=task, created=True)

    return run


def _same_submission(existing: Task, new: Task) -> bool:
    """Whether `new` repeats `existing`: the same fields, and the same payload text but
    for its spacing (a producer that sends again may write it out anew)."""
    keep = (
        "queue_id",
        "capability",
        "idempotency",
        "max_attempts",
        "attempt_timeout_ms",
        "priority",
        "concurrency_key",
    )
    return all(getattr(existing, name) == getattr(new, name) for name in keep) and (
        existing.payload == new.payload or compact(existing.payload) == compact(new.payload)
    )


# ----------------------------------------------------------------- operators


def create_queue(queue_id: str, now_ms: int) -> Callable[[Tx], bool]:
    """Create queue `queue_id`; False if it exists already."""

    def run(tx: Tx) -> bool:
        if tx.queue_exists(queue_id):
            return False
        tx.create_queue(queue_id, now_ms)
        return True

    return run


def create_credential(credential: Credential, secret_hash: str) -> Callable[[Tx], None]:
    return lambda tx: tx.create_credential(credential, secret_hash)


def set_key_limit(queue_id: str, key: str, max_running: int) -> Callable[[Tx], bool]:
    """Set the limit of concurrency key `key` of `queue_id` (`key` "": every key's that has
    none of its own; 0 removes it); False if there is no such queue."""

    def run(tx: Tx) -> bool:
        if not tx.queue_exists(queue_id):
            return False
        tx.set_key_limit(queue_id, key, max_running)
        return True

    return run


def pause_queue(queue_id: str, paused: bool) -> Callable[[Tx], bool]:
    """Pause (or resume) a queue: paused, it takes submissions and offers nothing, on every
    hub of the database. False if there is no such queue."""
    return lambda tx: tx.pause_queue(queue_id, paused)


def revoke_credential(credential_id: str) -> Callable[[Tx], bool]:
    """Revoke a credential: its requests are refused from this commit on, and the hubs
    close its sessions at their next look (`revoked_among`). False if there is none."""
    return lambda tx: tx.revoke_credential(credential_id)


def revoked_among(credential_ids: frozenset[str]) -> Callable[[Tx], set[str]]:
    return lambda tx: tx.revoked_among(credential_ids)


def forget_receipts(before_ms: int, limit: int) -> Callable[[Tx], int]:
    """Drop up to `limit` answers kept for message ids older than `before_ms`, and the
    answers kept for operators' request ids; how many of the first."""

    def run(tx: Tx) -> int:
        tx.forget_operator_answers(before_ms)
        return tx.forget_receipts(before_ms, limit)

    return run


def forget_tasks(before_ms: int, limit: int) -> Callable[[Tx], int]:
    """Delete up to `limit` tasks that ended for good before `before_ms`, with their
    attempts, evidence and history; how many."""
    return lambda tx: tx.forget_tasks(before_ms, limit)
