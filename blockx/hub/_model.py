"""The hub's records: queues, credentials, tasks, attempts, and what a producer submits.

Plain immutable values, as the store reads them from the database and the
rules (`_rules`) hand them back changed. Times are epoch milliseconds.
"""

from __future__ import annotations

import enum
from typing import Final

import attrs

from blockx.hubwire import Capability, Outcome


class TaskState(enum.StrEnum):
    QUEUED = "QUEUED"
    """Waiting for an offer (possibly not before `available_at_ms`: a delay, a retry's
    back-off)."""
    OFFERED = "OFFERED"
    """Its current attempt was offered to a worker, which has not started it yet."""
    RUNNING = "RUNNING"
    """Its current attempt runs under a lease."""
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    NEEDS_REVIEW = "NEEDS_REVIEW"
    """An attempt may have had its effect and running it again is not known to be
    safe: a person decides (an operator retries or resolves it)."""
    CANCELLED = "CANCELLED"
    """An operator cancelled it while it waited in the queue."""

    @property
    def is_terminal(self) -> bool:
        return self in _TERMINAL

    @property
    def is_retained(self) -> bool:
        """Ended for good: kept for `taskRetentionMs` after its end, then deleted. A task
        that needs review is not: it waits for a person, however long that takes."""
        return self.is_terminal and self is not TaskState.NEEDS_REVIEW


_TERMINAL: Final = frozenset(
    {TaskState.SUCCEEDED, TaskState.FAILED, TaskState.NEEDS_REVIEW, TaskState.CANCELLED}
)


class AttemptState(enum.StrEnum):
    OFFERED = "OFFERED"
    RUNNING = "RUNNING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    UNKNOWN = "UNKNOWN"
    LEASE_EXPIRED = "LEASE_EXPIRED"
    """It was started and its lease ran out: whether it had its effect is unknown."""
    WITHDRAWN = "WITHDRAWN"
    """It was offered and never started before the offer ended."""

    @property
    def is_live(self) -> bool:
        return self in (AttemptState.OFFERED, AttemptState.RUNNING)


class Idempotency(enum.StrEnum):
    IDEMPOTENT = "IDEMPOTENT"
    """Running the task again after an attempt of unknown effect is safe."""
    NON_IDEMPOTENT = "NON_IDEMPOTENT"


class Right(enum.StrEnum):
    PRODUCER = "producer"
    """Submit tasks to the queue and read them."""
    WORKER = "worker"
    """Run the queue's tasks."""
    ADMIN = "admin"
    """Everything, on every queue."""


ANY_QUEUE: Final = "*"
MAX_PRIORITY: Final = 9
DEFAULT_PRIORITY: Final = 5
"""In the middle, so that a producer can ask for sooner or for later than ordinary work."""


@attrs.frozen(kw_only=True)
class Credential:
    credential_id: str
    queue_id: str
    """A queue id, or `ANY_QUEUE`."""
    rights: frozenset[Right]
    revoked: bool = False
    created_at_ms: int = 0

    def allows(self, right: Right, queue_id: str) -> bool:
        if self.revoked:
            return False
        if Right.ADMIN in self.rights:
            return True
        return right in self.rights and self.queue_id in (queue_id, ANY_QUEUE)


@attrs.frozen(kw_only=True)
class Submission:
    """A task as a producer submits it; the store gives it an id unless it has one."""

    queue_id: str
    capability: Capability
    payload: str
    """JSON text."""
    idempotency: Idempotency
    max_attempts: int
    total_deadline_ms: int
    """From submission to the task's end."""
    attempt_timeout_ms: int
    """The longest one attempt may run after its start."""
    task_id: str = ""
    priority: int = DEFAULT_PRIORITY
    run_at_ms: int = 0
    """Offered no sooner than this time (0: at once)."""
    delay_ms: int = 0
    """Offered no sooner than this long after submission (at most one of the two is set)."""
    concurrency_key: str = ""
    """Tasks of one key run no more at once than the queue's limit for it ("": no key)."""


@attrs.frozen(kw_only=True)
class Task:
    task_id: str
    queue_id: str
    capability: Capability
    payload: str
    idempotency: Idempotency
    max_attempts: int
    attempt_timeout_ms: int
    created_at_ms: int
    deadline_at_ms: int
    state: TaskState
    available_at_ms: int
    """A QUEUED task is offered only from this time on (a delay, or a retry's back-off)."""
    priority: int = DEFAULT_PRIORITY
    """0 to `MAX_PRIORITY`: of a queue's offerable tasks, the higher go first."""
    seq: int = 0
    """Submission order: of equal priorities and available times, the lower goes first."""
    concurrency_key: str = ""
    epoch: int = 0
    """The execution epoch of the newest attempt (0: none yet)."""
    attempt_id: str = ""
    """The newest attempt."""
    started_attempts: int = 0
    uncertain: bool = False
    """Some attempt may have had its effect without the hub learning its outcome."""
    result: str | None = None
    failure_code: str = ""
    failure_details: str = ""
    finished_at_ms: int = 0


@attrs.frozen(kw_only=True)
class TaskFilter:
    """Which of a queue's tasks an operator lists or acts on: in any of `states` (all when
    empty), of `handler`, created from `since_ms` on and before `until_ms` (None: any)."""

    states: tuple[TaskState, ...] = ()
    handler: str | None = None
    since_ms: int | None = None
    until_ms: int | None = None


@attrs.frozen(kw_only=True)
class Attempt:
    attempt_id: str
    task_id: str
    epoch: int
    instance_id: str
    state: AttemptState
    offered_at_ms: int
    offer_deadline_ms: int
    started_at_ms: int = 0
    lease_deadline_ms: int = 0
    finished_at_ms: int = 0
    outcome: Outcome | None = None
    renewals: int = 0
    """Renewals of its lease the hub granted."""
    renewed_at_ms: int = 0
    """When the last of them was granted (0: none was)."""


@attrs.frozen(kw_only=True)
class HistoryEntry:
    """One line of a task's audit history."""

    task_id: str
    at_ms: int
    kind: str
    attempt_id: str = ""
    detail: str = ""
