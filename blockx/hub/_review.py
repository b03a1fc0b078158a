"""Review and redrive: the operators' HTTP API to list tasks and retry, resolve or cancel them.

    GET  /v1/tasks?queue=Q[&state=S][&handler=H][&since_ms=T][&until_ms=T]
                  [&limit=N][&cursor=C]          a queue's tasks, oldest first, a page at a time
    POST /v1/tasks/{task}:retry                  a NEEDS_REVIEW or FAILED task: one more attempt
    POST /v1/tasks/{task}:resolve                a NEEDS_REVIEW task ends as the operator says
    POST /v1/tasks/{task}:cancel                 a QUEUED task ends CANCELLED
    POST /v1/queues/{queue}/tasks:retry          the same over a filter, at most `MAX_BULK`
    POST /v1/queues/{queue}/tasks:cancel         tasks a call (or `dry_run`: how many match)

Only an admin credential may (403 otherwise). Each action's body names a
`request_id` the client chose: the action's answer is kept under it (with the
action and its task or queue), in the same transaction as the change, so a
repeat gets the very same answer and does nothing more. What the rules
decline (409) is kept too; a request that is wrong (400) or names no task
(404) is not. The rules (`_rules.retry`, `resolve`, `cancel`) decide; each
change adds a history line naming the credential and the request id. The
dashboard's review page (`_ui`) calls the same routes with its session cookie
and CSRF token (`_browser`).
"""

from __future__ import annotations

import base64
import binascii
import re
import urllib.parse
from collections.abc import Callable, Mapping
from typing import Any, Final, NoReturn

import trio

from blockx.errors import InvalidValue
from blockx.hub import _rules
from blockx.hub._admin_api import admin_only
from blockx.hub._api import (
    MAX_BODY_BYTES,
    MAX_LIST,
    Answer,
    ProducerApi,
    Work,
    _Fixed,
    _fixed,
    body_text,
    task_json,
)
from blockx.hub._model import Credential, Task, TaskFilter, TaskState
from blockx.hub._rules import Change, Declined, Operator
from blockx.hub._store import Tx
from blockx.hubwire import (
    CODE_FORM,
    MAX_ID_CHARS,
    MAX_JSON_BYTES,
    MAX_NESTING,
    Failed,
    InvalidJson,
    RawJson,
    Succeeded,
    dumps,
    object_members,
    parse_json,
)
from blockx.net.http import Connection, Request

MAX_BULK: Final = 1_000
"""The most tasks one bulk call changes (in one transaction); the answer says if more match."""
_TASK_ACTION: Final = re.compile(r"/v1/tasks/([^/]+):(retry|resolve|cancel)")
_QUEUE_ACTION: Final = re.compile(r"/v1/queues/([^/]+)/tasks:(retry|cancel)")
_LISTING: Final = "/v1/tasks"
_FILTER_KEYS: Final = ("state", "handler", "since_ms", "until_ms")
_OUTCOME_KEYS: Final = {"SUCCEEDED": ("result",), "FAILED": ("code", "details")}


class InvalidOperatorRequest(InvalidValue):
    """A query parameter or a key of an operator's request body is wrong."""


class OperatorApi(ProducerApi):
    """The producers' API, and the operators' review and redrive."""

    async def _route(
        self,
        stream: trio.abc.Stream,
        connection: Connection,
        request: Request,
        target: urllib.parse.SplitResult,
    ) -> tuple[str | None, Work, bool]:
        task_action = _TASK_ACTION.fullmatch(target.path)
        queue_action = _QUEUE_ACTION.fullmatch(target.path)
        if target.path == _LISTING:
            if request.method != b"GET":
                return None, admin_only(_fixed(405, "GET")), False
            work = _work(lambda: listing(urllib.parse.parse_qs(target.query)))
            return None, admin_only(work), False
        if task_action is None and queue_action is None:
            return await super()._route(stream, connection, request, target)
        if request.method != b"POST":
            return None, admin_only(_fixed(405, "POST")), False
        body = await body_text(stream, connection, request, MAX_BODY_BYTES, field=None)
        if isinstance(body, _Fixed):
            return None, admin_only(body), False
        now_ms = self._clock.now_ms()
        if task_action is not None:
            task_id, action = urllib.parse.unquote(task_action[1]), task_action[2]
            work = _work(lambda: on_task(action, task_id, body, now_ms))
        else:
            assert queue_action is not None
            queue_id, action = urllib.parse.unquote(queue_action[1]), queue_action[2]
            work = _work(lambda: on_queue(action, queue_id, body, now_ms))
        return None, admin_only(work), action == "retry"  # a retry queues: offer it now


def _work(make: Callable[[], Work]) -> Work:
    """The work `make` returns, or a 400 naming the field its request got wrong."""
    try:
        return make()
    except InvalidOperatorRequest as error:
        return _fixed(400, str(error), error.field)


# ------------------------------------------------------------------- listing


def listing(query: Mapping[str, list[str]]) -> Work:
    """A page of a queue's tasks that the query's filter selects, and the cursor of the
    next page (None: this is the last). The cursor stands for the last task shown (its
    creation time and id), so a page never repeats nor skips a task, whatever is added."""
    fields = {name: values[0] for name, values in query.items() if values}
    queue_id = fields.pop("queue", "")
    _check(bool(queue_id), "queue", queue_id, "is required: the queue whose tasks to list")
    limit = _count(fields.pop("limit", "100"), "limit", MAX_LIST)
    after = _cursor(fields.pop("cursor")) if "cursor" in fields else None
    chosen = _filter(fields, tuple(TaskState), query=True)

    def run(tx: Tx, credential: Credential) -> Answer:
        tasks = tx.task_page(queue_id, chosen, after, limit + 1)
        shown, more = tasks[:limit], len(tasks) > limit
        cursor = _cursor_of(shown[-1]) if more else None
        return 200, {"tasks": [task_json(task) for task in shown], "next_cursor": cursor}

    return run


def _cursor_of(task: Task) -> str:
    text = f"{task.created_at_ms}:{task.task_id}"
    return base64.urlsafe_b64encode(text.encode()).decode().rstrip("=")


def _cursor(text: str) -> tuple[int, str]:
    try:
        decoded = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4)).decode()
    except (binascii.Error, UnicodeDecodeError):
        decoded = ""
    created_at_ms, colon, task_id = decoded.partition(":")
    ok = bool(colon) and created_at_ms.isascii() and created_at_ms.isdigit() and bool(task_id)
    _check(ok, "cursor", text, "the next_cursor of the page before, as it was given")
    return int(created_at_ms), task_id


# ------------------------------------------------------------------- actions


def on_task(action: str, task_id: str, body: str, now_ms: int) -> Work:
    """Retry, resolve or cancel one task, as its request's body says."""
    fields, request_id = _body(body, ("outcome", "result", "code", "details"))
    if action == "resolve":
        outcome = _outcome(fields, object_members(body))

        def rule(task: Task, by: Operator) -> Change | Declined:
            return _rules.resolve(task, outcome, by=by, now_ms=now_ms)

    else:
        _no_keys(fields, "request_id")
        act = _rules.retry if action == "retry" else _rules.cancel

        def rule(task: Task, by: Operator) -> Change | Declined:
            return act(task, by=by, now_ms=now_ms)

    def decide(tx: Tx, credential: Credential) -> Answer:
        task = tx.task(task_id)
        if task is None:
            return 404, {"error": f"no task {task_id!r}"}
        result = rule(task, Operator(credential_id=credential.credential_id, request_id=request_id))
        if isinstance(result, Declined):
            return 409, {"error": result.message, "state": task.state.value}
        _write(tx, result)
        return 200, task_json(result.task)

    return _kept(request_id, action, f"task:{task_id}", now_ms, decide)


def on_queue(action: str, queue_id: str, body: str, now_ms: int) -> Work:
    """Retry or cancel up to `MAX_BULK` of a queue's tasks that the body's filter selects
    (of those the action applies to, oldest first); with `dry_run`, count them only."""
    fields, request_id = _body(body, (*_FILTER_KEYS, "dry_run"))
    dry_run = fields.pop("dry_run", False)
    _check(type(dry_run) is bool, "dry_run", dry_run, "true or false")
    chosen = _filter(fields, _rules.ACTS_ON[action], query=False)  # only tasks it applies to
    act = _rules.retry if action == "retry" else _rules.cancel

    def decide(tx: Tx, credential: Credential) -> Answer:
        if not tx.queue_exists(queue_id):
            return 404, {"error": f"no queue {queue_id!r}"}
        if dry_run:
            return 200, {"dry_run": True, "count": tx.count_tasks(queue_id, chosen)}
        by = Operator(credential_id=credential.credential_id, request_id=request_id)
        tasks = tx.task_page(queue_id, chosen, None, MAX_BULK + 1)
        for task in tasks[:MAX_BULK]:
            result = act(task, by=by, now_ms=now_ms)
            assert isinstance(result, Change)  # selected in a state the action applies to
            _write(tx, result)
        return 200, {
            "dry_run": False,
            "count": len(tasks[:MAX_BULK]),
            "more": len(tasks) > MAX_BULK,
        }

    return decide if dry_run else _kept(request_id, action, f"queue:{queue_id}", now_ms, decide)


def _write(tx: Tx, change: Change) -> None:
    tx.update_task(change.task)
    tx.note(change.history)


def _kept(
    request_id: str,
    action: str,
    target: str,
    now_ms: int,
    decide: Callable[[Tx, Credential], Answer],
) -> Work:
    """`decide`, once per (request id, action, target): a repeat gets the kept answer."""

    def run(tx: Tx, credential: Credential) -> Answer:
        kept = tx.operator_answer(request_id, action, target)
        if kept is not None:
            return kept[0], RawJson(kept[1])
        status, body = decide(tx, credential)
        if status in (200, 409):
            tx.keep_operator_answer(request_id, action, target, (status, dumps(body)), now_ms)
        return status, body

    return run


# ------------------------------------------------------------------- reading requests


def _body(text: str, keys: tuple[str, ...]) -> tuple[dict[str, Any], str]:
    """The body's keys (each one of `keys` or `request_id`), and its request id."""
    try:
        document = parse_json(text, "", max_bytes=MAX_BODY_BYTES, max_nesting=MAX_NESTING + 1)
    except InvalidJson as error:
        raise InvalidOperatorRequest(
            field=error.field or "(body)", value=error.value, allowed=error.allowed
        ) from None
    _check(isinstance(document, dict), "(body)", document, "must be a JSON object")
    unknown = sorted(set(document) - {"request_id", *keys})
    if unknown:
        _wrong(unknown[0], document[unknown[0]], f"keys: {', '.join(('request_id', *keys))}")
    request_id = document.pop("request_id", None)
    ok = isinstance(request_id, str) and 0 < len(request_id) <= MAX_ID_CHARS
    _check(ok, "request_id", request_id, f"is required: a string of 1 to {MAX_ID_CHARS} characters")
    return document, request_id


def _no_keys(fields: Mapping[str, Any], *allowed: str) -> None:
    for name in fields:
        _wrong(name, fields[name], f"keys: {', '.join(allowed)}")


def _outcome(fields: Mapping[str, Any], texts: Mapping[str, str]) -> Succeeded | Failed:
    """How the operator says the attempt ended: SUCCEEDED with a `result`, or FAILED with
    a `code` (and `details`); results and details kept as the very texts received."""
    outcome = fields.get("outcome")
    if not isinstance(outcome, str) or outcome not in _OUTCOME_KEYS:
        _wrong("outcome", outcome, "is required: SUCCEEDED or FAILED")
    extra = sorted(set(fields) - {"outcome", *_OUTCOME_KEYS[outcome]})
    if extra:
        _wrong(
            extra[0], fields[extra[0]], f"keys with {outcome}: {', '.join(_OUTCOME_KEYS[outcome])}"
        )
    if outcome == "SUCCEEDED":
        _check("result" in fields, "result", None, "is required: the result (any JSON but null)")
        _check(fields["result"] is not None, "result", None, "must not be null")
        return Succeeded(result=_sized(texts["result"], "result"))
    code = fields.get("code")
    _check(
        isinstance(code, str) and CODE_FORM.fullmatch(code) is not None,
        "code",
        code,
        f"is required: a failure code matching {CODE_FORM.pattern}",
    )
    assert isinstance(code, str)
    details = _sized(texts["details"], "details") if "details" in fields else "{}"
    return Failed(code=code, details=details)


def _sized(text: str, name: str) -> str:
    size = len(text.encode())
    _check(size <= MAX_JSON_BYTES, name, f"{size} bytes", f"at most {MAX_JSON_BYTES} bytes of JSON")
    return text


def _filter(fields: Mapping[str, Any], states: tuple[TaskState, ...], *, query: bool) -> TaskFilter:
    """The filter of a listing's query (texts) or a bulk action's body (JSON values): a
    state of those given (all of them when none is named), a handler, a time range."""
    unknown = sorted(set(fields) - set(_FILTER_KEYS))
    if unknown:
        _wrong(unknown[0], fields[unknown[0]], f"keys: {', '.join(_FILTER_KEYS)}")
    state = fields.get("state")
    if state is not None:
        names = ", ".join(states)
        _check(state in states, "state", state, f"one of {names}")
        states = (TaskState(state),)
    handler = fields.get("handler")
    _check(handler is None or isinstance(handler, str), "handler", handler, "a handler's name")
    since_ms, until_ms = (
        None if fields.get(name) is None else _time(fields[name], name, query=query)
        for name in ("since_ms", "until_ms")
    )
    return TaskFilter(states=states, handler=handler, since_ms=since_ms, until_ms=until_ms)


def _time(value: object, name: str, *, query: bool) -> int:
    """A creation time in epoch milliseconds (a query's text, or a body's integer)."""
    if query and isinstance(value, str) and value.isascii() and value.isdigit():
        value = int(value)
    _check(type(value) is int and value >= 0, name, value, "epoch milliseconds (an integer)")
    assert isinstance(value, int)
    return value


def _count(text: str, name: str, most: int) -> int:
    _check(text.isascii() and text.isdigit() and 0 < int(text) <= most, name, text, f"1 to {most}")
    return int(text)


def _check(ok: bool, field: str, value: object, allowed: str) -> None:
    InvalidOperatorRequest.check(ok, field=field, value=value, allowed=allowed)


def _wrong(field: str, value: object, allowed: str) -> NoReturn:
    raise InvalidOperatorRequest(field=field, value=value, allowed=allowed)
