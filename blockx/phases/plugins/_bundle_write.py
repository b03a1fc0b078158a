"""The `bundle_write` plugin: a task's outputs, rows of column values, as a new bundle.

Each output is a row (an object of column values) or an array of rows.

Config: `{"path": "DIR", "rows_per_file": N}` (N default 100,000); DIR is
taken under the worker's `io.bundleRoot` when that is set. The bundle
at DIR is written whole or not at all (`blockx.phases.bundles.write_bundle`): a
reader never sees a half-written one, and a task run again leaves one bundle
at DIR. Runs on a worker thread, never cancelled half-way.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final

import trio

from blockx.errors import shown
from blockx.io import IOScopeError
from blockx.phases._config import config_integer
from blockx.phases.bundles import BundleError, write_bundle
from blockx.phases.plugins._model import PluginFailed, PluginRequest, decoded_output, parse_config
from blockx.slots import PluginResult

NAME: Final = "bundle_write"
MAX_ROWS_PER_FILE: Final = 10_000_000


def _rows(outputs: Sequence[bytes]) -> list[dict[str, Any]]:
    rows = []
    for index, output in enumerate(outputs):
        value = decoded_output(NAME, index, output)
        for number, row in enumerate(value if type(value) is list else [value]):
            if type(row) is not dict or not all(isinstance(key, str) for key in row):
                where = (
                    f"output {index} item {number}" if type(value) is list else f"output {index}"
                )
                raise PluginFailed(
                    message=f"{NAME}: {where} must be an object of column values (an output "
                    f"may be an array of them), got {shown(row)}; nothing was written"
                )
            rows.append(row)
    return rows


def _write(path: str, task_id: str, rows: list[dict[str, Any]], rows_per_file: int) -> None:
    try:
        write_bundle(path, task_id, rows, rows_per_file=rows_per_file)
    except BundleError as error:
        raise PluginFailed(message=f"{NAME}: {error.message}; nothing was written") from error
    except OSError as error:
        raise PluginFailed(
            message=f"{NAME}: cannot write the bundle {path!r}: {error}; nothing was written",
            retryable=True,
        ) from error


class BundleWritePlugin:
    """Writes each task's outputs as the bundle at `config_json.path`."""

    name: Final = NAME
    usage: Final = (
        'config {"path": "DIR", "rows_per_file": N}: the outputs\' rows (objects of column '
        "values, or arrays of them) as a Parquet bundle at DIR, written whole or not at all"
    )

    async def run(self, request: PluginRequest) -> PluginResult:
        config = parse_config(NAME, request.handler.config_json, ("path", "rows_per_file"))
        path = config.get("path")
        if not isinstance(path, str) or not path:
            raise PluginFailed(
                message=f"{NAME}: config_json.path is required: the bundle's directory; "
                f"got {shown(path)}"
            )
        bounds = (100_000, 1, MAX_ROWS_PER_FILE)
        rows_per_file = config_integer(NAME, config, "rows_per_file", bounds, PluginFailed)
        if request.io is not None:
            try:
                path = request.io.bundle_path(path)
            except IOScopeError as error:
                raise PluginFailed(message=f"{NAME}: config_json.path: {error.message}") from error
        rows = _rows(request.outputs)
        await trio.to_thread.run_sync(_write, path, request.task_id, rows, rows_per_file)
        return PluginResult(plugin_type=NAME, ok=True, records_written=len(rows), detail=path)
