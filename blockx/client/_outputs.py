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


def readable(message: Any) -> dict[str, Any]:
    """`message` as JSON, with the outputs a task result kept shown as JSON values.

    The wire carries them as text (`outputsJson`); printed, they are `outputs`
    in the same place. Text that is not a JSON array is printed as it came.
    """
    document: dict[str, Any] = message.to_dict()
    if isinstance(message, pb.TaskResult):
        return _outputs_shown(message, document)
    result = getattr(message, "result", None)
    if isinstance(result, pb.TaskResult) and "result" in document:
        document["result"] = _outputs_shown(result, document["result"])
    return document


def _outputs_shown(result: pb.TaskResult, document: dict[str, Any]) -> dict[str, Any]:
    try:
        outputs = task_outputs(result)
    except InvalidOutputs:
        return document
    if outputs is None:
        return document
    return dict(
        ("outputs", outputs) if key == "outputsJson" else (key, value)
        for key, value in document.items()
    )
