"""The operators' HTTP API on queues and credentials, and the JSON forms the commands print.

    GET  /v1/queues                      every queue: paused, tasks by state, oldest queued
    POST /v1/queues/{queue}:pause        the queue takes submissions and offers nothing
    POST /v1/queues/{queue}:resume       it offers again
    POST /v1/queues/{queue}:limit?max_running=N[&key=K]
                                         a concurrency key's limit (no key: the queue's
                                         for every key); 0 removes it
    GET  /v1/credentials                 every credential (never its secret)
    POST /v1/credentials/{id}:revoke     its requests are refused, its sessions closed
    GET  /v1/workers                     this hub's open worker sessions    (`_live`: they
    GET  /v1/stats                       its series of the last hour         read the hub's
    GET  /v1/events                      a stream of ticks, one a second     own state)

Every request needs a credential with the admin right (a bearer token, or
the dashboard's session cookie: `_browser`); each runs in one transaction
with the check of that credential. The same reads are what `blockx hub queue
list` and `credential list` print.
"""

from __future__ import annotations

import re
import urllib.parse
from collections.abc import Callable
from typing import Any, Final, TypeAlias

from blockx.hub import _ops
from blockx.hub._model import Credential, Right, TaskState
from blockx.hub._store import Tx

_QUEUE_ACTION: Final = re.compile(r"/v1/queues/([^/]+):(pause|resume)")
_QUEUE_LIMIT: Final = re.compile(r"/v1/queues/([^/]+):limit")
MAX_KEY_LIMIT: Final = 1_000_000
"""The largest limit a concurrency key may be given."""
_REVOKE: Final = re.compile(r"/v1/credentials/([^/]+):revoke")

AdminAnswer: TypeAlias = tuple[int, Any]
"""An HTTP status and the JSON body to answer with (as the producers' API's)."""
AdminWork: TypeAlias = Callable[[Tx, Credential], AdminAnswer]
"""What a request does, in a transaction, for the valid credential that asked."""


def credential_json(credential: Credential) -> dict[str, Any]:
    return {
        "credential_id": credential.credential_id,
        "queue_id": credential.queue_id,
        "rights": sorted(right.value for right in credential.rights),
        "revoked": credential.revoked,
        "created_at_ms": credential.created_at_ms,
    }


def list_credentials(tx: Tx) -> list[dict[str, Any]]:
    return [credential_json(credential) for credential in tx.credentials()]


def list_queues(now_ms: int) -> Callable[[Tx], list[dict[str, Any]]]:
    """Each queue: whether it is paused, its tasks by state, how many run, and how long its
    oldest queued task has waited since its submission (None: none is queued)."""

    def read(tx: Tx) -> list[dict[str, Any]]:
        counts: dict[str, dict[str, int]] = {}
        oldest: dict[str, int] = {}
        for queue_id, state, count, first_created_ms in tx.task_counts():
            counts.setdefault(queue_id, {})[state.value] = count
            if state is TaskState.QUEUED:
                oldest[queue_id] = first_created_ms
        shown = []
        for queue_id, created_at_ms, paused in tx.queue_rows():
            tasks = {
                state.value: counts.get(queue_id, {}).get(state.value, 0) for state in TaskState
            }
            shown.append(
                {
                    "queue_id": queue_id,
                    "created_at_ms": created_at_ms,
                    "paused": paused,
                    "tasks": tasks,
                    "running": tasks[TaskState.RUNNING.value],
                    "oldest_queued_age_ms": None
                    if queue_id not in oldest
                    else max(now_ms - oldest[queue_id], 0),
                }
            )
        return shown

    return read


def admin_request(method: bytes, path: str, query: str, now_ms: int) -> AdminWork | None:
    """What an admin request for `path` does; None if `path` is not one."""
    if path == "/v1/queues":
        read_queues = list_queues(now_ms)
        return _as_admin(method, lambda tx: (200, {"queues": read_queues(tx)}))
    if path == "/v1/credentials":
        return _as_admin(method, lambda tx: (200, {"credentials": list_credentials(tx)}))
    if (match := _QUEUE_ACTION.fullmatch(path)) is not None:
        queue_id = urllib.parse.unquote(match[1])
        pause = _ops.pause_queue(queue_id, match[2] == "pause")

        def paused(tx: Tx) -> AdminAnswer:
            if not pause(tx):
                return 404, {"error": f"no queue {queue_id!r}", "field": "queue"}
            return 200, next(q for q in list_queues(now_ms)(tx) if q["queue_id"] == queue_id)

        return _as_admin(method, paused, verb=b"POST")
    if (match := _QUEUE_LIMIT.fullmatch(path)) is not None:
        return _as_admin(method, _limit(urllib.parse.unquote(match[1]), query), verb=b"POST")
    if (match := _REVOKE.fullmatch(path)) is not None:
        credential_id = urllib.parse.unquote(match[1])
        revoke = _ops.revoke_credential(credential_id)

        def revoked(tx: Tx) -> AdminAnswer:
            if not revoke(tx):
                return 404, {"error": f"no credential {credential_id!r}", "field": "credential"}
            found = tx.credential(credential_id)
            assert found is not None
            return 200, credential_json(found[0])

        return _as_admin(method, revoked, verb=b"POST")
    return None


def _limit(queue_id: str, query: str) -> Callable[[Tx], AdminAnswer]:
    """Set a concurrency key's limit from the query (`max_running`, and `key`)."""
    fields = urllib.parse.parse_qs(query, keep_blank_values=True)
    key = fields.get("key", [""])[0]
    text = fields.get("max_running", [""])[0]
    if not text.isdigit() or int(text) > MAX_KEY_LIMIT:
        allowed = f"max_running must be 0 (no limit) to {MAX_KEY_LIMIT}"
        return lambda tx: (400, {"error": allowed, "field": "max_running"})
    max_running = int(text)
    limit = _ops.set_key_limit(queue_id, key, max_running)

    def run(tx: Tx) -> AdminAnswer:
        if not limit(tx):
            return 404, {"error": f"no queue {queue_id!r}", "field": "queue"}
        return 200, {"queue_id": queue_id, "key": key, "max_running": max_running}

    return run


def admin_only(work: AdminWork) -> AdminWork:
    """`work`, for a credential with the admin right (403 otherwise): the one gate of every
    operator's request."""

    def run(tx: Tx, credential: Credential) -> AdminAnswer:
        if Right.ADMIN not in credential.rights:
            return 403, {"error": "this needs a credential with the admin right"}
        return work(tx, credential)

    return run


def _as_admin(
    method: bytes, work: Callable[[Tx], AdminAnswer], *, verb: bytes = b"GET"
) -> AdminWork:
    """`work`, for a request with method `verb` by an admin (`admin_only`)."""

    def run(tx: Tx, credential: Credential) -> AdminAnswer:
        if method != verb:
            return 405, {"error": f"{method.decode()}: use {verb.decode()}"}
        return work(tx)

    return admin_only(run)
