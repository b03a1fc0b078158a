"""Task specs from arguments, a JSON task file or a JSON-lines batch, checked before they are sent.

Every refusal is an `InvalidTaskSpec` naming the argument or the task-file key
that is wrong and what is allowed; a batch is refused whole, with an
`InvalidTaskLines` naming each bad line. Pure: never does IO.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import attrs

from blockx._proto.blockx.worker import v1 as pb
from blockx.errors import BlockxError, InvalidValue, shown

_MAX_UINT32 = 2**32 - 1
_MAX_INT64 = 2**63 - 1


class InvalidTaskSpec(InvalidValue):
    """The task's `field` (a JSON task-file key, or a `task_spec` argument) is wrong."""

    def describe(self) -> str:
        return f"task {self.field} = {shown(self.value)}: {self.allowed}"


class InvalidTaskLines(BlockxError):
    """Lines of a JSON-lines batch that are not tasks: (line number from 1, what is wrong)."""

    def __init__(self, *, problems: tuple[tuple[int, str], ...]) -> None:
        self.problems = problems
        numbers = ", ".join(str(line) for line, _ in problems)
        plural = "s" if len(problems) > 1 else ""
        super().__init__(f"{len(problems)} bad line{plural} ({numbers})")


TASK_FILE_KEYS = (
    "task_id",
    "builder",
    "config",
    "payload",
    "payload_text",
    "plugin",
    "plugin_config",
    "timeout_ms",
    "failure_policy",
    "retry",
    "labels",
)
"""The keys of a JSON task file."""
OLD_KEYS = {"writer": "plugin", "writer_config": "plugin_config"}
"""Older spellings of task-file keys, still read."""
_RETRY_KEYS = ("max_attempts", "base_backoff_ms", "jitter_percent")
_FAILURE_POLICIES = {"fail_fast": False, "best_effort": True}


def task_spec(
    task_id: str,
    *,
    builder: str,
    config: Mapping[str, Any] | None = None,
    payload: bytes = b"",
    plugin: str | None = None,
    plugin_config: Mapping[str, Any] | None = None,
    timeout_ms: int = 0,
    best_effort: bool = False,
    retry: pb.CallRetryPolicy | None = None,
    labels: Mapping[str, str] | None = None,
) -> pb.TaskSpec:
    """A `TaskSpec`; `config` and `plugin_config` are sent as JSON objects.

    No `plugin` (the result handler's type) means the plugin phase stores
    nothing. `timeout_ms` 0 is the worker's default deadline; `retry` None the
    worker's retry defaults. Raises InvalidTaskSpec
    naming the argument that is wrong.
    """
    _check_text("task_id", task_id)
    _check_text("builder", builder)
    if not isinstance(payload, bytes):
        raise InvalidTaskSpec(field="payload", value=payload, allowed="must be bytes")
    if plugin is not None:
        _check_text("plugin", plugin)
    elif plugin_config is not None:
        raise InvalidTaskSpec(field="plugin_config", value=plugin_config, allowed="needs a plugin")
    _check_int("timeout_ms", timeout_ms, _MAX_INT64)
    if not isinstance(best_effort, bool):
        raise InvalidTaskSpec(field="best_effort", value=best_effort, allowed="must be a boolean")
    if retry is not None:
        if not isinstance(retry, pb.CallRetryPolicy):
            raise InvalidTaskSpec(field="retry", value=retry, allowed="must be a CallRetryPolicy")
        for name in _RETRY_KEYS:
            _check_int(f"retry.{name}", getattr(retry, name), _MAX_UINT32)
    policy = pb.CallFailurePolicy.BEST_EFFORT if best_effort else pb.CallFailurePolicy.FAIL_FAST
    return pb.TaskSpec(
        task_id=task_id,
        function_call=pb.FunctionCallConfig(type=builder, config_json=_json_text("config", config)),
        payload=payload,
        result_handler=(
            None
            if plugin is None
            else pb.ResultHandler(
                type=plugin, config_json=_json_text("plugin_config", plugin_config)
            )
        ),
        task_timeout_ms=timeout_ms,
        call_failure_policy=policy,
        call_retry_policy=retry,
        labels=_labels("labels", labels),
    )


def task_spec_from_json(obj: Mapping[str, Any], *, task_id: str | None = None) -> pb.TaskSpec:
    """The `TaskSpec` of a JSON task file's object; `task_id` wins over the file's.

    Keys (`TASK_FILE_KEYS`): task_id (unless given here), builder (required),
    config, payload (any JSON value, sent as its JSON text) or payload_text
    (sent as UTF-8), plugin and plugin_config (also read under their older
    names writer and writer_config), timeout_ms, failure_policy
    ("fail_fast" or "best_effort"), retry ({max_attempts (required),
    base_backoff_ms, jitter_percent}: the whole policy, unset fields 0) and
    labels. null counts as absent. Raises InvalidTaskSpec naming the key.
    """
    if not isinstance(obj, Mapping):
        raise InvalidTaskSpec(field="file", value=obj, allowed="must be a JSON object")
    named: dict[str, Any] = {}
    for key, value in obj.items():
        name = OLD_KEYS.get(key, key)
        if name not in TASK_FILE_KEYS:
            allowed = f"is not a task key; the keys are {', '.join(TASK_FILE_KEYS)}"
            raise InvalidTaskSpec(field=str(key), value=value, allowed=allowed)
        if name in named:
            raise InvalidTaskSpec(field=str(key), value=value, allowed=f"gives {name!r} again")
        named[name] = value
    fields = {name: value for name, value in named.items() if value is not None}
    if task_id is None:
        task_id = _required_text(fields, "task_id")
    if "payload" in fields and "payload_text" in fields:
        raise InvalidTaskSpec(
            field="payload_text",
            value=fields["payload_text"],
            allowed="give payload or payload_text, not both",
        )
    if "payload_text" in fields:
        text = fields["payload_text"]
        if not isinstance(text, str):
            raise InvalidTaskSpec(field="payload_text", value=text, allowed="must be a string")
        payload = text.encode("utf-8")
    elif "payload" in fields:
        payload = _json_text("payload", fields["payload"], object_only=False).encode("utf-8")
    else:
        payload = b""
    policy = fields.get("failure_policy", "fail_fast")
    if not isinstance(policy, str) or policy not in _FAILURE_POLICIES:
        allowed = f"must be one of {', '.join(map(repr, _FAILURE_POLICIES))}"
        raise InvalidTaskSpec(field="failure_policy", value=policy, allowed=allowed)
    return task_spec(
        task_id,
        builder=_required_text(fields, "builder"),
        config=_optional_object(fields, "config"),
        payload=payload,
        plugin=_optional_text(fields, "plugin"),
        plugin_config=_optional_object(fields, "plugin_config"),
        timeout_ms=fields.get("timeout_ms", 0),
        best_effort=_FAILURE_POLICIES[policy],
        retry=_retry_policy(fields.get("retry")),
        labels=_labels("labels", fields.get("labels")),
    )


def task_specs_from_lines(
    lines: Iterable[bytes], *, new_task_id: Callable[[], str]
) -> list[pb.TaskSpec]:
    """The tasks of a JSON-lines batch: one task-file object per line (`task_spec_from_json`).

    Blank lines are skipped; a line without task_id gets `new_task_id()`. Every
    line is checked before any task is returned: InvalidTaskLines names each
    line that is not UTF-8, not a JSON object, not a valid task, or repeats a
    task id of an earlier line.
    """
    return [line.spec for line in task_lines(lines, new_task_id=new_task_id)]


@attrs.frozen(kw_only=True)
class TaskLine:
    """A task of a JSON-lines batch, as its line wrote it and as it is sent to a worker."""

    number: int
    """Its line's number, from 1 (blank lines count)."""
    document: dict[str, Any]
    """The line's JSON object as written: what the hub carries to a worker node, which
    reads it as a task file (no task_id there when the line had none)."""
    spec: pb.TaskSpec
    """The task checked, with `new_task_id()` for a line without task_id."""


def task_lines(
    lines: Iterable[bytes],
    *,
    new_task_id: Callable[[], str],
    also: Callable[[dict[str, Any]], object] | None = None,
) -> list[TaskLine]:
    """The tasks of a JSON-lines batch with their lines, checked as
    `task_specs_from_lines` checks them (InvalidTaskLines naming each bad line), and by
    `also` if given: it raises InvalidTaskSpec for a line's object that is a task, but
    not one the receiver takes (the hub, whose JSON has bounds a node's has not)."""
    tasks: list[TaskLine] = []
    problems: list[tuple[int, str]] = []
    first_line_of: dict[str, int] = {}
    for number, raw in enumerate(lines, start=1):
        try:
            read = _task_of_line(raw, new_task_id)
            if read is not None and also is not None:
                also(read[0])
        except InvalidTaskSpec as error:
            problems.append((number, str(error)))
            continue
        if read is None:
            continue
        document, task = read
        earlier = first_line_of.setdefault(task.task_id, number)
        if earlier != number:
            problems.append((number, f"task_id {task.task_id!r} is already on line {earlier}"))
            continue
        tasks.append(TaskLine(number=number, document=document, spec=task))
    if problems:
        raise InvalidTaskLines(problems=tuple(problems))
    return tasks


def _task_of_line(
    raw: bytes, new_task_id: Callable[[], str]
) -> tuple[dict[str, Any], pb.TaskSpec] | None:
    try:
        text = raw.decode("utf-8").strip()
    except UnicodeDecodeError as error:
        raise InvalidTaskSpec(field="line", value=raw, allowed=f"is not UTF-8 ({error})") from None
    if not text:
        return None
    try:
        document = json.loads(text)
    except json.JSONDecodeError as error:
        raise InvalidTaskSpec(
            field="line", value=text, allowed=f"is not valid JSON ({error})"
        ) from None
    if not isinstance(document, dict):
        raise InvalidTaskSpec(field="line", value=document, allowed="must be a JSON object")
    task_id = None if document.get("task_id") is not None else new_task_id()
    return document, task_spec_from_json(document, task_id=task_id)


def _retry_policy(value: object) -> pb.CallRetryPolicy | None:
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise InvalidTaskSpec(field="retry", value=value, allowed="must be a JSON object")
    for key, item in value.items():
        if key not in _RETRY_KEYS:
            allowed = f"is not a retry key; the keys are {', '.join(_RETRY_KEYS)}"
            raise InvalidTaskSpec(field=f"retry.{key}", value=item, allowed=allowed)
    if value.get("max_attempts") is None:
        raise InvalidTaskSpec(field="retry.max_attempts", value=None, allowed="is required")
    numbers = {key: value.get(key, 0) for key in _RETRY_KEYS}
    for key, number in numbers.items():
        _check_int(f"retry.{key}", number, _MAX_UINT32)
    return pb.CallRetryPolicy(**numbers)


def _check_text(key: str, value: object) -> None:
    if not isinstance(value, str) or not value:
        raise InvalidTaskSpec(field=key, value=value, allowed="must be a non-empty string")


def _check_int(key: str, value: object, maximum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= maximum:
        allowed = f"must be an integer from 0 to {maximum}"
        raise InvalidTaskSpec(field=key, value=value, allowed=allowed)


def _required_text(fields: Mapping[str, object], key: str) -> str:
    if key not in fields:
        raise InvalidTaskSpec(field=key, value=None, allowed="is required")
    value = fields[key]
    _check_text(key, value)
    assert isinstance(value, str)
    return value


def _optional_text(fields: Mapping[str, object], key: str) -> str | None:
    if key not in fields:
        return None
    return _required_text(fields, key)


def _optional_object(fields: Mapping[str, object], key: str) -> Mapping[str, Any] | None:
    value = fields.get(key)
    if value is not None and not isinstance(value, Mapping):
        raise InvalidTaskSpec(field=key, value=value, allowed="must be a JSON object")
    return value


def _json_text(key: str, value: object, *, object_only: bool = True) -> str:
    """Compact JSON of `value` ("" for None when an object is expected)."""
    if value is None and object_only:
        return ""
    if object_only and not isinstance(value, Mapping):
        raise InvalidTaskSpec(field=key, value=value, allowed="must be a JSON object (a dict)")
    try:
        return json.dumps(value, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError) as error:
        raise InvalidTaskSpec(field=key, value=value, allowed=f"must be JSON ({error})") from error


def _labels(key: str, value: object) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise InvalidTaskSpec(field=key, value=value, allowed="must be an object of strings")
    for name, text in value.items():
        if not isinstance(name, str) or not isinstance(text, str):
            raise InvalidTaskSpec(field=f"{key}.{name}", value=text, allowed="must be a string")
    return dict(value)
