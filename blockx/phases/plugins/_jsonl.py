"""The `jsonl` plugin: appends one JSON line per output to a file.

Line: `{"task_id": ..., "index": i, "value": ...}`; bytes inside a value become
`{"$bytes": <base64>}`. All or nothing per task as far as this plugin can
tell: every line is encoded before the file is touched, so an unencodable
value writes nothing, and the batch goes out in one append then `fsync`.
Everything runs in a worker thread so the Trio loop never blocks on encoding
or on the disk.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from typing import Final

import trio

from blockx.errors import shown
from blockx.phases.plugins._model import (
    PluginFailed,
    PluginRequest,
    decoded_output,
    json_ready,
    parse_config,
)
from blockx.slots import PluginResult

NAME: Final = "jsonl"


_ENCODER: Final = json.JSONEncoder(allow_nan=False, separators=(",", ":"))
"""One encoder for every line: `json.dumps` with options makes a new one per call."""


def encode_lines(task_id: str, outputs: Sequence[bytes]) -> bytes:
    """The lines for `outputs`, or `PluginFailed` naming the first output that has none."""
    prefix = f'{{"task_id":{_ENCODER.encode(task_id)},"index":'
    lines: list[str] = []
    for index, output in enumerate(outputs):
        value = decoded_output(NAME, index, output)
        try:
            # An integer's JSON is its decimal form: spelled out here, since the encoder
            # builds its machinery anew for every value that is not a string.
            encoded = str(value) if type(value) is int else _ENCODER.encode(json_ready(value))
        except (TypeError, ValueError, RecursionError) as error:
            raise PluginFailed(
                message=f"{NAME}: output {index} cannot be written as JSON ({error}); "
                "nothing was written"
            ) from error
        lines.append(f'{prefix}{index},"value":{encoded}}}\n')
    return "".join(lines).encode("utf-8")


def append_durably(path: str, data: bytes) -> None:
    """Append `data` to `path` in one write and fsync it; creates parent directories.

    With O_APPEND one write lands after whatever other tasks appended, never
    interleaved with it on a local file system.
    """
    parent = os.path.dirname(path)
    if parent:
        os.makedirs(parent, exist_ok=True)
    with open(path, "ab") as file:
        file.write(data)
        file.flush()
        os.fsync(file.fileno())


def _write_batch(path: str, task_id: str, outputs: Sequence[bytes]) -> None:
    data = encode_lines(task_id, outputs)
    try:
        append_durably(path, data)
    except OSError as error:
        raise PluginFailed(
            message=f"{NAME}: cannot append to {path!r}: {error}", retryable=True
        ) from error


class JsonlPlugin:
    """Appends each task's outputs to the JSON-lines file named by `config_json.path`."""

    name: Final = NAME
    usage: Final = (
        'config {"path": "FILE"}: appends one JSON line per output to FILE (on the worker)'
    )

    async def run(self, request: PluginRequest) -> PluginResult:
        config = parse_config(NAME, request.handler.config_json, ("path",))
        path = config.get("path")
        if path is None:
            raise PluginFailed(
                message=f"{NAME}: config_json.path is required: the file to append lines to"
            )
        if not isinstance(path, str) or not path:
            raise PluginFailed(
                message=f"{NAME}: config_json.path must be a non-empty string, got {shown(path)}"
            )
        # Not abandoned on cancellation: a write that has started is let finish,
        # so a phase deadline never leaves a thread appending behind the task's back.
        await trio.to_thread.run_sync(_write_batch, path, request.task_id, request.outputs)
        return PluginResult(
            plugin_type=NAME, ok=True, records_written=len(request.outputs), detail=path
        )
