"""The hub: a durable control plane for automatic workers.

Workers connect over WebSocket (`blockx.hubwire`), take offered
attempts of the tasks of their queue, renew leases and report outcomes;
producers submit and read tasks over HTTP JSON. State lives in a database
(SQLite file by default, PostgreSQL for several hubs), written only through
the committer, which commits in groups and answers nothing before it is
durable. `blockx hub` runs one.
"""

from blockx.hub._admin import (
    UnknownQueue,
    create_credential,
    create_queue,
    pause_queue,
    revoke_credential,
    set_key_limit,
    show_credentials,
    show_queues,
    show_task,
    submit,
)
from blockx.hub._api import InvalidSubmission, submission_from_json, task_json
from blockx.hub._cli import add_commands
from blockx.hub._config import HubConfig
from blockx.hub._model import (
    ANY_QUEUE,
    Attempt,
    AttemptState,
    Credential,
    Idempotency,
    Right,
    Submission,
    Task,
    TaskState,
)
from blockx.hub._ops import SubmitRefusal, Submitted
from blockx.hub._server import Hub
from blockx.hub._store import Store, StoreError

__all__ = [
    "ANY_QUEUE",
    "Attempt",
    "AttemptState",
    "Credential",
    "Hub",
    "HubConfig",
    "Idempotency",
    "InvalidSubmission",
    "Right",
    "Store",
    "StoreError",
    "Submission",
    "SubmitRefusal",
    "Submitted",
    "Task",
    "TaskState",
    "UnknownQueue",
    "add_commands",
    "create_credential",
    "create_queue",
    "pause_queue",
    "revoke_credential",
    "set_key_limit",
    "show_credentials",
    "show_queues",
    "show_task",
    "submission_from_json",
    "submit",
    "task_json",
]
