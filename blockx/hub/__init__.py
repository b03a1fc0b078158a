"""The hub: a durable control plane for automatic workers (seed 002).

Workers connect over WebSocket (`blockx.hub.protocol`), take offered
attempts of the tasks of their queue, renew leases and report outcomes;
producers submit and read tasks over HTTP JSON. State lives in a database
(SQLite file by default, PostgreSQL for several hubs), written only through
the committer, which commits in groups and answers nothing before it is
durable. `python -m blockx hub` runs one.
"""

from blockx.hub._api import InvalidSubmission, submission_from_json, task_json
from blockx.hub._cli import add_commands
from blockx.hub._config import HubConfig
from blockx.hub._model import (
    Attempt,
    AttemptState,
    Credential,
    Idempotency,
    Right,
    Submission,
    Task,
    TaskState,
)
from blockx.hub._server import WORKER_PATH, Hub
from blockx.hub._store import Store, StoreError

__all__ = [
    "WORKER_PATH",
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
    "Task",
    "TaskState",
    "add_commands",
    "submission_from_json",
    "task_json",
]
