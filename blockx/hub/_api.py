"""The producers' HTTP JSON API, and the JSON forms of submissions and tasks.

    POST /v1/queues/{queue}/tasks      submit a task (201 with the task; 200 for a repeat)
    GET  /v1/queues/{queue}/tasks      list a queue's tasks (?state=...&limit=...)
    GET  /v1/tasks/{task}              one task with its attempts, evidence and history
                                       (?wait_ms=...: once it has ended, or that time passed)

and the operators' requests on queues and credentials (`_admin_api`).

Every request carries `Authorization: Bearer <token>` of a credential with
the producer right on the queue (or admin), or, without that header, the
cookie of a dashboard session (`_browser`: its token stands in, and what
changes anything needs its CSRF token too). A bad request is answered 400
with `{"error": ..., "field": ...}` naming the JSON key that is wrong, or the
path in the payload (`payload.items[3].price`). Payloads, results and details
are served as the texts the hub was given (`RawJson`), never decoded and
written again.
`submission_from_json` and `task_json` are the same forms the command line
uses.
"""

from __future__ import annotations

import math
import re
import urllib.parse
from collections.abc import Callable, Collection, Mapping
from typing import Any, Final, TypeAlias

import attrs
import trio

from blockx.errors import InvalidValue
from blockx.hub import _ops
from blockx.hub._admin_api import AdminWork, admin_request
from blockx.hub._auth import check, credential_ids
from blockx.hub._browser import BrowserSessions, Refusal
from blockx.hub._committer import Committer
from blockx.hub._model import (
    DEFAULT_PRIORITY,
    MAX_PRIORITY,
    Attempt,
    Credential,
    HistoryEntry,
    Idempotency,
    Right,
    Submission,
    Task,
    TaskState,
)
from blockx.hub._store import Keys, StoreError, Tx
from blockx.hubwire import (
    CONVERTER,
    MAX_BATCH_BYTES,
    MAX_BATCH_TASKS,
    MAX_ID_CHARS,
    MAX_JSON_BYTES,
    MAX_NESTING,
    Capability,
    InvalidJson,
    Outcome,
    RawJson,
    array_items,
    dumps,
    object_members,
    parse_json,
)
from blockx.net.http import BadRequest, Connection, Request, read_body, respond_keeping
from blockx.process.clock import EpochClock

MAX_BODY_BYTES: Final = MAX_JSON_BYTES + 64 * 1024
DEFAULTS: Final[Mapping[str, object]] = {
    "idempotency": Idempotency.NON_IDEMPOTENT.value,
    "max_attempts": 3,
    "total_deadline_ms": 3_600_000,
    "attempt_timeout_ms": 300_000,
}
"""What a submission that does not say gets: the safe choice (not idempotent)."""
LIMITS: Final = {
    "max_attempts": 100,
    "total_deadline_ms": 30 * 86_400_000,
    "attempt_timeout_ms": 30 * 86_400_000,
}
MAX_RUN_AT_MS: Final = 2**53
"""Beyond any time a task could wait for (its total deadline bounds it anyway)."""
SUBMISSION_KEYS: Final = (
    "handler",
    "handler_version",
    "payload_version",
    "payload",
    "task_id",
    *DEFAULTS,
    "priority",
    "run_at_ms",
    "delay_ms",
    "concurrency_key",
)
MAX_LIST: Final = 1_000
MAX_WAIT_MS: Final = 30_000
"""The longest a task's reader may wait for it to end (well within `REQUEST_TIMEOUT_S`)."""
_QUEUE_TASKS: Final = re.compile(r"/v1/queues/([^/]+)/tasks")
_QUEUE_BATCH: Final = re.compile(r"/v1/queues/([^/]+)/tasks:batch")
_TASK: Final = re.compile(r"/v1/tasks/([^/]+)")
_ENDED: Final = frozenset(state.value for state in TaskState if state.is_terminal)


class InvalidSubmission(InvalidValue):
    """A key of a submission (its JSON form) is missing or wrong."""


def submission_from_json(text: str, queue_id: str) -> Submission:
    """The submission the JSON text `text` describes; `InvalidSubmission` naming the key
    (or the path in the payload) otherwise. The payload is kept as the very text the
    submission holds, so numbers reach the handler and the reader as written."""
    try:
        document = parse_json(text, "", max_bytes=MAX_BODY_BYTES, max_nesting=MAX_NESTING + 1)
    except InvalidJson as error:
        raise InvalidSubmission(
            field=error.field or "(body)", value=error.value, allowed=error.allowed
        ) from None
    if not isinstance(document, dict):
        raise InvalidSubmission(field="(body)", value=document, allowed="must be a JSON object")
    unknown = sorted(set(document) - set(SUBMISSION_KEYS))
    if unknown:
        raise InvalidSubmission(
            field=unknown[0],
            value=document[unknown[0]],
            allowed=f"keys: {', '.join(SUBMISSION_KEYS)}",
        )
    fields = {**DEFAULTS, **document}
    texts = {
        name: _text(fields, name) for name in ("handler", "handler_version", "payload_version")
    }
    if "payload" not in fields:
        raise InvalidSubmission(field="payload", value=None, allowed="is required (any JSON value)")
    payload = object_members(text)["payload"]
    size = len(payload.encode())
    InvalidSubmission.check(
        size <= MAX_JSON_BYTES,
        field="payload",
        value=f"{size} bytes",
        allowed=f"at most {MAX_JSON_BYTES} bytes of JSON",
    )
    idempotency = fields["idempotency"]
    InvalidSubmission.check(
        idempotency in set(Idempotency),
        field="idempotency",
        value=idempotency,
        allowed=" or ".join(Idempotency),
    )
    task_id = fields.get("task_id", "")
    InvalidSubmission.check(
        isinstance(task_id, str) and len(task_id) <= MAX_ID_CHARS,
        field="task_id",
        value=task_id,
        allowed=f"a string of at most {MAX_ID_CHARS} characters",
    )
    priority, run_at_ms, delay_ms, concurrency_key = _scheduling(fields)
    return Submission(
        queue_id=queue_id,
        capability=Capability(**texts),
        payload=payload,
        idempotency=Idempotency(idempotency),
        task_id=task_id,
        **{name: _count(fields, name) for name in LIMITS},
        priority=priority,
        run_at_ms=run_at_ms,
        delay_ms=delay_ms,
        concurrency_key=concurrency_key,
    )


def _scheduling(fields: Mapping[str, object]) -> tuple[int, int, int, str]:
    """A submission's priority, run_at_ms, delay_ms and concurrency key, checked."""
    priority = fields.get("priority", DEFAULT_PRIORITY)
    InvalidSubmission.check(
        type(priority) is int and 0 <= priority <= MAX_PRIORITY,
        field="priority",
        value=priority,
        allowed=f"an integer from 0 to {MAX_PRIORITY} (higher goes first)",
    )
    InvalidSubmission.check(
        "run_at_ms" not in fields or "delay_ms" not in fields,
        field="delay_ms",
        value=fields.get("delay_ms"),
        allowed="run_at_ms or delay_ms, not both",
    )
    run_at_ms, delay_ms = fields.get("run_at_ms", 0), fields.get("delay_ms", 0)
    InvalidSubmission.check(
        type(run_at_ms) is int and 0 <= run_at_ms < MAX_RUN_AT_MS,
        field="run_at_ms",
        value=run_at_ms,
        allowed="epoch milliseconds (an integer) before the task's total deadline",
    )
    InvalidSubmission.check(
        type(delay_ms) is int and 0 <= delay_ms <= LIMITS["total_deadline_ms"],
        field="delay_ms",
        value=delay_ms,
        allowed="milliseconds (an integer from 0) less than total_deadline_ms",
    )
    key = fields.get("concurrency_key", "")
    InvalidSubmission.check(
        isinstance(key, str) and len(key) <= MAX_ID_CHARS,
        field="concurrency_key",
        value=key,
        allowed=f"a string of at most {MAX_ID_CHARS} characters",
    )
    assert isinstance(priority, int)
    assert isinstance(run_at_ms, int)
    assert isinstance(delay_ms, int)
    assert isinstance(key, str)
    return priority, run_at_ms, delay_ms, key


def _text(fields: Mapping[str, object], name: str) -> str:
    value = fields.get(name)
    InvalidSubmission.check(
        isinstance(value, str) and 0 < len(value) <= MAX_ID_CHARS,
        field=name,
        value=value,
        allowed=f"is required: a string of 1 to {MAX_ID_CHARS} characters",
    )
    assert isinstance(value, str)
    return value


def _count(fields: Mapping[str, object], name: str) -> int:
    value = fields[name]
    InvalidSubmission.check(
        type(value) is int and 0 < value <= LIMITS[name],
        field=name,
        value=value,
        allowed=f"an integer from 1 to {LIMITS[name]}",
    )
    assert isinstance(value, int)
    return value


def task_json(
    task: Task, attempts: list[Attempt] | None = None, history: list[HistoryEntry] | None = None
) -> dict[str, Any]:
    """A task as the API and the command line show it."""
    shown: dict[str, Any] = {
        "task_id": task.task_id,
        "queue_id": task.queue_id,
        "handler": task.capability.handler,
        "handler_version": task.capability.handler_version,
        "payload_version": task.capability.payload_version,
        "payload": RawJson(task.payload),
        "idempotency": task.idempotency.value,
        "max_attempts": task.max_attempts,
        "attempt_timeout_ms": task.attempt_timeout_ms,
        "priority": task.priority,
        "concurrency_key": task.concurrency_key or None,
        "state": task.state.value,
        "created_at_ms": task.created_at_ms,
        "deadline_at_ms": task.deadline_at_ms,
        "available_at_ms": task.available_at_ms,
        "started_attempts": task.started_attempts,
        "uncertain": task.uncertain,
        "result": None if task.result is None else RawJson(task.result),
        "failure": None
        if not task.failure_code
        else {"code": task.failure_code, "details": _json_text(task.failure_details)},
        "finished_at_ms": task.finished_at_ms or None,
    }
    if attempts is not None:
        shown["attempts"] = [_attempt_json(attempt) for attempt in attempts]
    if history is not None:
        shown["evidence"] = [_entry_json(e) for e in history if e.kind == "EVIDENCE"]
        shown["history"] = [_entry_json(e) for e in history]
    return shown


def _attempt_json(attempt: Attempt) -> dict[str, Any]:
    return {
        "attempt_id": attempt.attempt_id,
        "epoch": attempt.epoch,
        "instance_id": attempt.instance_id,
        "state": attempt.state.value,
        "offered_at_ms": attempt.offered_at_ms,
        "started_at_ms": attempt.started_at_ms or None,
        "lease_deadline_ms": attempt.lease_deadline_ms or None,
        "renewals": attempt.renewals,
        "renewed_at_ms": attempt.renewed_at_ms or None,
        "finished_at_ms": attempt.finished_at_ms or None,
        "outcome": None if attempt.outcome is None else _outcome_json(attempt.outcome),
    }


def _outcome_json(outcome: Outcome) -> dict[str, Any]:
    """An attempt's reported outcome, its result or details shown as the JSON they are
    (checked when the report came), not as strings."""
    shown: dict[str, Any] = CONVERTER.unstructure(outcome)
    for key in ("result", "details"):
        if key in shown:
            shown[key] = RawJson(shown[key])
    return shown


def _entry_json(entry: HistoryEntry) -> dict[str, Any]:
    return {
        "at_ms": entry.at_ms,
        "kind": entry.kind,
        "attempt_id": entry.attempt_id or None,
        "detail": _json_or_text(entry.detail),
    }


def _json_text(text: str) -> RawJson | None:
    """Failure details: a JSON text (a handler's, checked when it came, or the hub's own)."""
    return RawJson(text) if text else None


def _json_or_text(text: str) -> object:
    """A history entry's detail as the hub wrote it: a JSON object's text or plain words."""
    if not text:
        return None
    return RawJson(text) if text.startswith("{") else text


def load_task(task_id: str) -> Callable[[Tx], dict[str, Any] | None]:
    """The JSON form of task `task_id` with its attempts and history, or None."""

    def read(tx: Tx) -> dict[str, Any] | None:
        return load_tasks(tx, [task_id]).get(task_id)

    return read


def load_tasks(tx: Tx, task_ids: Collection[str]) -> dict[str, dict[str, Any]]:
    """The JSON forms of those of `task_ids` that exist, with their attempts and history."""
    tasks = [task for task_id in sorted(task_ids) if (task := tx.task(task_id)) is not None]
    records = tx.records([task.task_id for task in tasks]) if tasks else {}
    return {task.task_id: task_json(task, *records[task.task_id]) for task in tasks}


@attrs.define(eq=False)
class _Reader:
    """One reader waiting for a task to end: `ended` is set by the commit that ends it,
    which brings the task as it then is when it knew of the reader before it began."""

    ended: trio.Event = attrs.Factory(trio.Event)
    shown: dict[str, Any] | None = None


class TaskWatch:
    """Who waits for which task to end. The committer's `Tail`: run last in each
    transaction, it reads the tasks the transaction ended that someone waits for, and once
    that is committed hands each reader its task, so none needs a read of its own."""

    def __init__(self) -> None:
        self._waiting: dict[str, set[_Reader]] = {}

    def watch(self, task_id: str) -> _Reader:
        """A reader woken by the first commit after this call that ends `task_id`."""
        reader = _Reader()
        self._waiting.setdefault(task_id, set()).add(reader)
        return reader

    def wake_all(self) -> None:
        """Wake every reader now, with nothing to show: each reads the task as it is."""
        for readers in self._waiting.values():
            for reader in readers:
                reader.ended.set()
        self._waiting.clear()

    def forget(self, task_id: str, reader: _Reader) -> None:
        readers = self._waiting.get(task_id)
        if readers is not None:
            readers.discard(reader)
            if not readers:
                del self._waiting[task_id]

    def operation(self) -> Callable[[Tx], tuple[frozenset[str], dict[str, Any]]]:
        wanted = frozenset(self._waiting)

        def ended(tx: Tx) -> tuple[frozenset[str], dict[str, Any]]:
            task_ids = tx.ended_tasks()
            return task_ids, load_tasks(tx, task_ids & wanted)

        return ended

    def committed(self, result: tuple[frozenset[str], dict[str, Any]]) -> None:
        task_ids, shown = result
        for task_id in task_ids & self._waiting.keys():
            for reader in self._waiting.pop(task_id):
                reader.shown = shown.get(task_id)
                reader.ended.set()


class ProducerApi:
    """Answers the requests of one HTTP connection after another (HTTP/1.1 keep-alive)."""

    def __init__(
        self,
        committer: Committer,
        *,
        clock: EpochClock,
        ids: _ops.TimeOrderedIds,
        on_queued: Callable[[], None],
        on_submit: Callable[[], None],
        watch: TaskWatch,
        recheck_ms: int | None,
        browsers: BrowserSessions,
        more_admin: Callable[[bytes, str], AdminWork | None],
    ) -> None:
        self._committer = committer
        self._browsers = browsers
        self._more_admin = more_admin
        """The admin requests answered from the hub's own state (`_live`)."""
        self._clock = clock
        self._ids = ids
        self._watch = watch
        self._recheck_s = math.inf if recheck_ms is None else recheck_ms / 1000
        """How often a waiting reader looks again for an end it may not hear of (another
        hub's, on a shared database); None: never."""
        self.draining = False
        self._on_queued = on_queued
        """Called once a submission waits for its commit: offers claimed then share it."""
        self._on_submit = on_submit
        """Called once a submission queued a new task."""

    def drain(self) -> None:
        """The hub stops: readers waiting for a task to end (`wait_ms`) answer now, and
        so does every later one."""
        self.draining = True
        self._watch.wake_all()

    async def serve(
        self, stream: trio.abc.Stream, connection: Connection, request: Request
    ) -> bool:
        """Answer `request`; whether the connection is kept for the client's next one (never
        once the hub drains)."""
        try:
            status, body = await self._answer(stream, connection, request)
        except StoreError as error:
            status, body = 503, {"error": unreachable(error)}
        text = dumps(body) + "\n"
        return await respond_keeping(
            stream,
            connection,
            request,
            status,
            text,
            content_type="application/json",
            keep=not self.draining,
        )

    async def _answer(
        self, stream: trio.abc.Stream, connection: Connection, request: Request
    ) -> Answer:
        """The answer to `request`: its credential is checked in the same transaction as
        the work it asks for (one commit), and a refusal for the credential comes first."""
        target = urllib.parse.urlsplit(request.target.decode("ascii", "replace"))
        now_ms = self._clock.now_ms()
        token = self._browsers.caller(request, now_ms)
        if isinstance(token, Refusal):
            return token.status, {"error": token.error}
        admin = admin_request(request.method, target.path, target.query, now_ms)
        if admin is None:
            admin = self._more_admin(request.method, target.path)
        if admin is not None:
            return await self._committer.do(_as_producer(token, None, admin))
        if (match := _TASK.fullmatch(target.path)) is not None and request.method == b"GET":
            query = urllib.parse.parse_qs(target.query)
            return await self._task(token, urllib.parse.unquote(match[1]), query)
        queue_id, work, submits = await self._route(stream, connection, request, target)
        queued = self._on_queued if submits else None
        answer = await self._committer.do(_as_producer(token, queue_id, work), queued=queued)
        if answer[0] == 201:
            self._on_submit()
        return answer

    async def _route(
        self,
        stream: trio.abc.Stream,
        connection: Connection,
        request: Request,
        target: urllib.parse.SplitResult,
    ) -> tuple[str | None, Work, bool]:
        """What `request` asks for, the queue it needs the producer right on (None: the
        work checks the queue of what it reads), and whether it may queue a task."""
        if (match := _QUEUE_TASKS.fullmatch(target.path)) is not None:
            queue_id = urllib.parse.unquote(match[1])
            if request.method == b"POST":
                submission = await self._submission(stream, connection, request, queue_id)
                return queue_id, submission, not isinstance(submission, _Fixed)
            if request.method == b"GET":
                return queue_id, _listing(queue_id, urllib.parse.parse_qs(target.query)), False
            return queue_id, _fixed(405, "GET or POST"), False
        if (match := _QUEUE_BATCH.fullmatch(target.path)) is not None:
            queue_id = urllib.parse.unquote(match[1])
            if request.method != b"POST":
                return queue_id, _fixed(405, "POST"), False
            batch = await self._batch(stream, connection, request, queue_id)
            return queue_id, batch, not isinstance(batch, _Fixed)
        unknown = _fixed(404, f"no such resource: {request.method.decode()} {target.path}")
        return None, unknown, False

    async def _task(self, token: str, task_id: str, query: dict[str, list[str]]) -> Answer:
        """Task `task_id`; with `wait_ms`, once it has ended or that much time has passed.

        The reader watches the task before each read, so an end committed after the read
        wakes it, with the task as that commit left it (or, if the commit began before
        the reader watched, it reads once more)."""
        wait_text = query.get("wait_ms", ["0"])[0]
        if not wait_text.isdigit() or int(wait_text) > MAX_WAIT_MS:
            refused = _fixed(400, f"wait_ms must be 0 to {MAX_WAIT_MS}", "wait_ms")
            return await self._committer.do(_as_producer(token, None, refused))
        deadline = trio.current_time() + int(wait_text) / 1000
        read = _as_producer(token, None, _read_task(task_id))
        while True:
            reader = self._watch.watch(task_id)
            try:
                status, body = await self._committer.do(read)
                if (
                    status != 200
                    or body["state"] in _ENDED
                    or trio.current_time() >= deadline
                    or self.draining
                ):
                    return status, body
                with trio.move_on_at(min(deadline, trio.current_time() + self._recheck_s)):
                    await reader.ended.wait()
                if reader.shown is not None:
                    return 200, reader.shown  # as the commit that ended it left it
            finally:
                self._watch.forget(task_id, reader)

    async def _submission(
        self,
        stream: trio.abc.Stream,
        connection: Connection,
        request: Request,
        queue_id: str,
    ) -> Work:
        """What submitting the request's body does: queue the task, or refuse the body."""
        body = await body_text(stream, connection, request, MAX_BODY_BYTES)
        if isinstance(body, _Fixed):
            return body
        try:
            submission = submission_from_json(body, queue_id)
        except InvalidSubmission as error:
            return _fixed(400, str(error), error.field)
        submit = _ops.submit(submission, self._clock.now_ms(), self._ids)

        def run(tx: Tx, credential: Credential) -> Answer:
            outcome = submit(tx)
            if isinstance(outcome, _ops.SubmitRefusal):
                return outcome.status, {"error": outcome.message, "field": outcome.field}
            return (201 if outcome.created else 200), task_json(outcome.task)

        return run

    async def _batch(
        self,
        stream: trio.abc.Stream,
        connection: Connection,
        request: Request,
        queue_id: str,
    ) -> Work:
        """What submitting a batch does: in one transaction, each task queued or refused on
        its own, answered by its index; a body that is no array of tasks is refused whole."""
        body = await body_text(stream, connection, request, MAX_BATCH_BYTES)
        if isinstance(body, _Fixed):
            return body
        try:
            items = array_items(body, "(body)")
        except InvalidJson as error:
            return _fixed(400, str(error), error.field)
        if not 0 < len(items) <= MAX_BATCH_TASKS:
            return _fixed(
                400, f"a batch holds 1 to {MAX_BATCH_TASKS} tasks, not {len(items)}", "(body)"
            )
        now_ms = self._clock.now_ms()
        submits = [_submit_item(item, queue_id, now_ms, self._ids) for item in items]

        def run(tx: Tx, credential: Credential) -> Answer:
            results = [{"index": index, **submit(tx)} for index, submit in enumerate(submits)]
            return 200, {"results": results}

        return run


def unreachable(error: StoreError) -> str:
    """What a request is answered (503) when the database cannot be reached."""
    return f"the hub cannot reach its database: {error.reason}"


async def body_text(
    stream: trio.abc.Stream,
    connection: Connection,
    request: Request,
    limit: int,
    *,
    field: str | None = "(body)",
) -> str | _Fixed:
    """The request's body as text, or the refusal of a body too large, malformed, or not
    UTF-8 (naming `field`)."""
    try:
        return (await read_body(stream, connection, request, limit)).decode()
    except BadRequest as error:
        return _fixed(error.status, str(error))
    except UnicodeDecodeError as error:
        return _fixed(400, f"the body is not UTF-8: {error}", field)


def _submit_item(
    text: str, queue_id: str, now_ms: int, ids: _ops.TimeOrderedIds
) -> Callable[[Tx], dict[str, Any]]:
    """One task of a batch: how it was taken (status, task id), or why not (status, error,
    the key or path at fault)."""
    try:
        submit = _ops.submit(submission_from_json(text, queue_id), now_ms, ids)
    except InvalidSubmission as error:
        refused = {"status": 400, "error": str(error), "field": error.field}
        return lambda tx: refused

    def run(tx: Tx) -> dict[str, Any]:
        outcome = submit(tx)
        if isinstance(outcome, _ops.SubmitRefusal):
            return {"status": outcome.status, "error": outcome.message, "field": outcome.field}
        return {"status": 201 if outcome.created else 200, "task_id": outcome.task.task_id}

    return run


Answer: TypeAlias = tuple[int, Any]
"""An HTTP status and the JSON body to answer with."""
Work: TypeAlias = Callable[[Tx, Credential], Answer]
"""What a request asks for, done in a transaction for the credential that asked."""


def _as_producer(token: str, queue_id: str | None, work: Work) -> Callable[[Tx], Answer]:
    """`work`, if `token` is a valid credential with the producer right on `queue_id`."""
    return _AsProducer(token=token, queue_id=queue_id, work=work)


@attrs.frozen(kw_only=True)
class _AsProducer:
    token: str
    queue_id: str | None
    work: Work

    @property
    def keys(self) -> Keys:
        """The credential and the queue, read with the rest of the batch's rows."""
        queues = () if self.queue_id is None else (self.queue_id,)
        return Keys(credentials=credential_ids(self.token), queues=queues)

    def __call__(self, tx: Tx) -> Answer:
        credential = check(tx, self.token)
        if credential is None:
            return 401, {"error": "no valid credential (Authorization: Bearer <token>)"}
        if self.queue_id is not None and not credential.allows(Right.PRODUCER, self.queue_id):
            return 403, {"error": f"this credential may not use queue {self.queue_id!r}"}
        return self.work(tx, credential)


@attrs.frozen
class _Fixed:
    """Work whose answer is known before it runs: a refusal, once the credential passed."""

    answer: Answer

    def __call__(self, tx: Tx, credential: Credential) -> Answer:
        return self.answer


def _fixed(status: int, error: str, field: str | None = None) -> _Fixed:
    return _Fixed((status, {"error": error} if field is None else {"error": error, "field": field}))


def _listing(queue_id: str, query: dict[str, list[str]]) -> Work:
    state = query.get("state", [""])[0] or None
    if state is not None and state not in set(TaskState):
        return _fixed(400, f"state must be one of {', '.join(TaskState)}", "state")
    limit_text = query.get("limit", ["100"])[0]
    if not limit_text.isdigit() or not 0 < int(limit_text) <= MAX_LIST:
        return _fixed(400, f"limit must be 1 to {MAX_LIST}", "limit")
    limit = int(limit_text)

    def run(tx: Tx, credential: Credential) -> Answer:
        tasks = tx.tasks_of_queue(queue_id, state, limit)
        return 200, {"tasks": [task_json(task) for task in tasks]}

    return run


def _read_task(task_id: str) -> Work:
    read = load_task(task_id)

    def run(tx: Tx, credential: Credential) -> Answer:
        shown = read(tx)
        if shown is None or not credential.allows(Right.PRODUCER, shown["queue_id"]):
            return 404, {"error": f"no task {task_id!r}"}
        return 200, shown

    return run
