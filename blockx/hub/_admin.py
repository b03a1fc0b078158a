"""What an operator does to a hub's database directly: queues, credentials, tasks.

The command line's `hub queue ...` (create, list, pause, resume, limit),
`credential ...`, `submit` (one task, or a file of them) and `task show` are
these, and so are the tests' set-ups. Each runs in its own
transaction on a `Store`; a running hub sees the result at its next look.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from blockx.hub import _ops
from blockx.hub._admin_api import list_credentials, list_queues
from blockx.hub._api import load_task
from blockx.hub._auth import new_token
from blockx.hub._model import ANY_QUEUE, Credential, Right, Submission
from blockx.hub._store import Store


class UnknownQueue(LookupError):
    def __init__(self, queue_id: str) -> None:
        self.queue_id = queue_id
        super().__init__(f"no queue {queue_id!r}")


def create_queue(store: Store, queue_id: str, now_ms: int) -> bool:
    """Create queue `queue_id`; False if it exists already."""
    return store.read(_ops.create_queue(queue_id, now_ms))


def create_credential(store: Store, queue_id: str, rights: frozenset[Right], now_ms: int) -> str:
    """A new credential on `queue_id` (or `ANY_QUEUE`) with `rights`: its token, shown once."""
    if queue_id != ANY_QUEUE and not store.read(lambda tx: tx.queue_exists(queue_id)):
        raise UnknownQueue(queue_id)
    credential_id, token, secret_hash = new_token()
    credential = Credential(
        credential_id=credential_id, queue_id=queue_id, rights=rights, created_at_ms=now_ms
    )
    store.read(_ops.create_credential(credential, secret_hash))
    return token


def submit(
    store: Store, submission: Submission, now_ms: int
) -> _ops.Submitted | _ops.SubmitRefusal:
    """Queue a task (a repeat of the same task id returns the task as it is)."""
    return store.read(_ops.submit(submission, now_ms, _ops.TimeOrderedIds(lambda: now_ms)))


def set_key_limit(store: Store, queue_id: str, key: str, max_running: int) -> None:
    """Set a concurrency key's limit (`key` "": the queue's for every key); 0 removes it."""
    if not store.read(_ops.set_key_limit(queue_id, key, max_running)):
        raise UnknownQueue(queue_id)


def submit_many(
    store: Store, submissions: Sequence[Submission], now_ms: int
) -> list[_ops.Submitted | _ops.SubmitRefusal]:
    """Queue tasks in one transaction, each on its own (as `submit` does one)."""
    ids = _ops.TimeOrderedIds(lambda: now_ms)  # one for all: they keep the file's order
    submits = [_ops.submit(submission, now_ms, ids) for submission in submissions]
    return store.read(lambda tx: [submit(tx) for submit in submits])


def show_task(store: Store, task_id: str) -> dict[str, Any] | None:
    """Task `task_id` in its JSON form, with its attempts and history; None if there is none."""
    return store.read(load_task(task_id))


def show_queues(store: Store, now_ms: int) -> list[dict[str, Any]]:
    """Every queue in its JSON form: paused, tasks by state, the oldest queued one's age."""
    return store.read(list_queues(now_ms))


def pause_queue(store: Store, queue_id: str, paused: bool) -> None:
    """Pause (or resume) `queue_id`: every hub of the database offers none of its tasks
    (or offers them again) from its next claim on."""
    if not store.read(_ops.pause_queue(queue_id, paused)):
        raise UnknownQueue(queue_id)


def show_credentials(store: Store) -> list[dict[str, Any]]:
    """Every credential in its JSON form (never its secret)."""
    return store.read(list_credentials)


def revoke_credential(store: Store, credential_id: str) -> bool:
    """Revoke a credential: refused from now on, its sessions closed by every hub within
    a second; False if there is no such credential."""
    return store.read(_ops.revoke_credential(credential_id))
