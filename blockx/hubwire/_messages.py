"""The hub protocol's messages and limits: one attrs class per message, and where they go.

Values only: the codec (`_codec`) turns them into frames and back. See the
package docstring for the conversation these messages make.
"""

from __future__ import annotations

import enum
import re
import urllib.parse
from typing import Final, TypeAlias

import attrs

PROTOCOL_VERSION: Final = 1
MAX_FRAME_BYTES: Final = 1024 * 1024
"""Largest WebSocket message either side accepts."""
MAX_JSON_BYTES: Final = 256 * 1024
"""Largest result, details or payload JSON text."""
MAX_FRAME_MESSAGES: Final = 1024
MAX_BATCH_TASKS: Final = 1_000
"""The most tasks one batch submission may hold."""
MAX_BATCH_BYTES: Final = 16 * 1024 * 1024
"""The largest body of a batch submission (each task's own limits hold as well)."""
MAX_ID_CHARS: Final = 128
MAX_CAPACITY: Final = 10_000
"""The most attempts one worker may hold at once."""
MAX_INT: Final = 2**63 - 1
"""Every integer in a message is from 0 to this (a database's BIGINT)."""
CODE_FORM: Final = re.compile(r"[A-Z][A-Z0-9_]{0,63}")
"""A failure code: upper-case letters, digits and underscores, starting with a letter."""

WORKER_PATH: Final = "/v1/worker"
"""Where a worker's WebSocket connects (a GET with an upgrade)."""
API_PREFIX: Final = "/v1/"
"""Everything else under it is the producers' HTTP JSON API."""


def queue_tasks_path(queue_id: str) -> str:
    """Where a queue's tasks are submitted (POST) and listed (GET)."""
    return f"/v1/queues/{urllib.parse.quote(queue_id, safe='')}/tasks"


def queue_batch_path(queue_id: str) -> str:
    """Where many tasks of a queue are submitted in one request (POST)."""
    return queue_tasks_path(queue_id) + ":batch"


def task_path(task_id: str) -> str:
    """Where one task is read (GET)."""
    return f"/v1/tasks/{urllib.parse.quote(task_id, safe='')}"


class ErrorCode(enum.StrEnum):
    """Why the hub closes a connection (sent in `Error`)."""

    PROTOCOL_ERROR = "PROTOCOL_ERROR"
    """A malformed frame or a message out of order."""
    VERSION_MISMATCH = "VERSION_MISMATCH"
    AUTH_FAILED = "AUTH_FAILED"
    """Unknown or revoked credential."""
    PERMISSION_DENIED = "PERMISSION_DENIED"
    """The credential has no worker right on the queue."""
    MESSAGE_ID_REUSED = "MESSAGE_ID_REUSED"
    """A message id came again with a different message."""
    SESSION_EXPIRED = "SESSION_EXPIRED"
    """No message within the session TTL."""
    UNAVAILABLE = "UNAVAILABLE"
    """The hub is shutting down or cannot reach its database: reconnect later."""


class RefusalCode(enum.StrEnum):
    """Why a Start, Renew or Finish is refused (the connection stays open)."""

    UNKNOWN_ATTEMPT = "UNKNOWN_ATTEMPT"
    """No such attempt for this instance."""
    NOT_OFFERED = "NOT_OFFERED"
    """The attempt is no longer offered (withdrawn, or started by another instance)."""
    LEASE_LOST = "LEASE_LOST"
    """The attempt's lease ended, or the attempt is no longer the task's current one."""
    NOT_STARTED = "NOT_STARTED"
    """A Renew or Finish for an attempt whose Start was never granted."""
    TOO_LARGE = "TOO_LARGE"
    """A result or details above `MAX_JSON_BYTES`."""
    INVALID_REPORT = "INVALID_REPORT"
    """A result or details that is not JSON text, or a malformed failure code."""


class Disposition(enum.StrEnum):
    """What the hub made of a Finish."""

    ACCEPTED = "ACCEPTED"
    """It ended the attempt and decided the task's next state."""
    EVIDENCE_ONLY = "EVIDENCE_ONLY"
    """It arrived after the lease ended or contradicts the task's state: kept as
    evidence in the task's history, never counted as the task's outcome."""


class AttemptStatus(enum.StrEnum):
    """An attempt as `Resume` finds it."""

    OFFERED = "OFFERED"
    RUNNING = "RUNNING"
    LOST = "LOST"


# --- values ------------------------------------------------------------------------


@attrs.frozen(kw_only=True)
class Capability:
    """What a worker can run: an exact handler, its version and the payload version."""

    handler: str
    handler_version: str
    payload_version: str

    @property
    def key(self) -> str:
        """One string for the triple, as tasks are matched on it."""
        return f"{self.handler}\x1f{self.handler_version}\x1f{self.payload_version}"


NODE_TASK_HANDLER: Final = "blockx.task"
NODE_TASK_VERSION: Final = "v1"


def node_task_capability(deployment: str) -> Capability:
    """The capability of a worker node's task sent through the hub: its payload is a task
    as the task files write it (`examples/tasks/*.json`), for nodes of `deployment`
    ("block", "bundle"), so a task for one profile is never offered to another's node."""
    return Capability(
        handler=f"{NODE_TASK_HANDLER}.{deployment}",
        handler_version=NODE_TASK_VERSION,
        payload_version=NODE_TASK_VERSION,
    )


@attrs.frozen(kw_only=True)
class AttemptRef:
    attempt_id: str
    epoch: int


@attrs.frozen(kw_only=True)
class Succeeded:
    result: str
    """JSON text of the result."""


@attrs.frozen(kw_only=True)
class Failed:
    code: str
    details: str = "{}"
    """JSON text."""
    retryable: bool = False
    """Whether running the task again is known to be safe and may succeed."""


@attrs.frozen(kw_only=True)
class Unknown:
    """Whether the attempt had its effect is not known (a handler error, a lost lease)."""

    code: str


Outcome: TypeAlias = Succeeded | Failed | Unknown


@attrs.frozen(kw_only=True)
class ResumedAttempt:
    attempt_id: str
    epoch: int
    status: AttemptStatus
    lease_deadline_ms: int = 0
    """For RUNNING: when the lease ends; for OFFERED: when the offer ends."""


# --- worker -> hub -------------------------------------------------------------------


@attrs.frozen(kw_only=True)
class Hello:
    protocol_version: int
    credential: str


@attrs.frozen(kw_only=True)
class OpenSession:
    message_id: str
    instance_id: str
    queue_id: str
    capabilities: tuple[Capability, ...]
    capacity: int


@attrs.frozen(kw_only=True)
class Heartbeat:
    """The session is alive; `capacity` attempts may be held at once from now on."""

    capacity: int


@attrs.frozen(kw_only=True)
class Start:
    message_id: str
    attempt_id: str
    epoch: int


@attrs.frozen(kw_only=True)
class Renew:
    message_id: str
    attempt_id: str
    epoch: int


@attrs.frozen(kw_only=True)
class Finish:
    message_id: str
    attempt_id: str
    epoch: int
    outcome: Outcome


@attrs.frozen(kw_only=True)
class Resume:
    message_id: str
    attempts: tuple[AttemptRef, ...]


@attrs.frozen(kw_only=True)
class Drain:
    message_id: str


# --- hub -> worker -------------------------------------------------------------------


@attrs.frozen(kw_only=True)
class Welcome:
    protocol_version: int
    hub_id: str


@attrs.frozen(kw_only=True)
class SessionOpened:
    reply_to: str
    session_ttl_ms: int


@attrs.frozen(kw_only=True)
class HeartbeatAck:
    session_ttl_ms: int


@attrs.frozen(kw_only=True)
class Offer:
    """Run this attempt (after a granted Start) before `offer_deadline_ms`."""

    attempt_id: str
    epoch: int
    task_id: str
    capability: Capability
    payload: str
    """JSON text."""
    offer_deadline_ms: int
    attempt_timeout_ms: int
    task_deadline_ms: int


@attrs.frozen(kw_only=True)
class Granted:
    """A Start or Renew granted: the attempt may run until `lease_deadline_ms`."""

    reply_to: str
    attempt_id: str
    lease_deadline_ms: int


@attrs.frozen(kw_only=True)
class Refused:
    reply_to: str
    attempt_id: str
    code: RefusalCode
    message: str


@attrs.frozen(kw_only=True)
class Recorded:
    reply_to: str
    attempt_id: str
    disposition: Disposition


@attrs.frozen(kw_only=True)
class Resumed:
    reply_to: str
    attempts: tuple[ResumedAttempt, ...]


@attrs.frozen(kw_only=True)
class DrainAck:
    """No more offers; `offered` are the attempts offered before this ack."""

    reply_to: str
    offered: tuple[str, ...]


@attrs.frozen(kw_only=True)
class Error:
    code: ErrorCode
    message: str


ToHub: TypeAlias = Hello | OpenSession | Heartbeat | Start | Renew | Finish | Resume | Drain
ControlMessage: TypeAlias = OpenSession | Start | Renew | Finish | Resume | Drain
"""Messages that carry a message id and are answered once, by receipt."""
ToWorker: TypeAlias = (
    Welcome
    | SessionOpened
    | HeartbeatAck
    | Offer
    | Granted
    | Refused
    | Recorded
    | Resumed
    | DrainAck
    | Error
)
Message: TypeAlias = ToHub | ToWorker
Answer: TypeAlias = SessionOpened | Granted | Refused | Recorded | Resumed | DrainAck
