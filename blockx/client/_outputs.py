"""Reading the outputs a worker kept in a task's result (the `result` plugin).

The worker sends them as one JSON array of text, `TaskResult.outputs_json`;
this turns it into values for the caller. Pure: never does IO.
"""

from __future__ import annotations

import json
from typing import Any

from blockx._proto.blockx.worker import v1 as pb
from blockx.errors import BlockxError


class InvalidOutputs(BlockxError):
    """The `outputs_json` of task `task_id`'s result is not a JSON array."""

    def __init__(self, *, task_id: str, reason: str) -> None:
        self.task_id = task_id
        self.reason = reason
        super().__init__(f"the outputs_json of task {task_id} {reason}")


def task_outputs(result: pb.TaskResult) -> list[Any] | None:
    """The values of the task's calls that its result kept, in call order; None if none were.

    Only a task whose result handler is the `result` plugin keeps them. Bytes
    inside a value arrive as `{"$bytes": <base64>}`; integers arrive exact.
    Raises `InvalidOutputs` if what the worker sent is not a JSON array.
    """
    if not result.outputs_json:
        return None
    try:
        outputs = json.loads(result.outputs_json)
    except json.JSONDecodeError as error:
        raise InvalidOutputs(task_id=result.task_id, reason=f"is not JSON ({error})") from error
    except RecursionError as error:
        raise InvalidOutputs(task_id=result.task_id, reason="is nested too deeply") from error
    if not isinstance(outputs, list):
        kind = "an object" if isinstance(outputs, dict) else type(outputs).__name__
        raise InvalidOutputs(task_id=result.task_id, reason=f"is {kind}, not an array")
    return outputs


_OUTPUTS_JSON = "outputsJson"


def readable(message: Any) -> dict[str, Any]:
    """`message` as JSON, with the outputs a task result kept shown as JSON values.

    The wire carries them as text (`outputsJson`); printed, they are `outputs`
    in the same place. Text that is not a JSON array is printed as it came.
    """
    document: dict[str, Any] = message.to_dict()
    if isinstance(message, pb.TaskResult):
        return outputs_shown(document)
    result = getattr(message, "result", None)
    if isinstance(result, pb.TaskResult) and "result" in document:
        document["result"] = outputs_shown(document["result"])
    return document


def outputs_shown(document: dict[str, Any]) -> dict[str, Any]:
    """A `TaskResult` as protobuf JSON (`document`), with its `outputsJson` text shown as
    `outputs`, its JSON values, in the same place; as it came if that text is not a JSON
    array."""
    text = document.get(_OUTPUTS_JSON)
    if text is None:
        return document
    try:
        outputs = json.loads(text)
    except (ValueError, RecursionError):
        return document
    if not isinstance(outputs, list):
        return document
    return dict(
        ("outputs", outputs) if key == _OUTPUTS_JSON else (key, value)
        for key, value in document.items()
    )
