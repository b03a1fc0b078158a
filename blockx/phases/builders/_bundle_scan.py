"""The `bundle_scan` builder: a bundle's rows, streamed into calls.

Config: `{"path": "DIR", "columns": ["col", ...]}` plus the row keys of
`blockx.phases.builders._rows` (`function`, `rows_per_call`, `rows`,
`args`). Reads the bundle at DIR (under the worker's `io.bundleRoot` when that is set;
`blockx.phases.bundles`) file by file, in manifest
order: each file is checked against the manifest's size, checksum and row
count before a row of it becomes a call, so a damaged bundle fails the task
naming the file. `columns` picks and orders the columns (all, in the
schema's order, by default). No payload. Reads run on a worker thread.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any, Final

import trio

from blockx.calls import CallSpec
from blockx.errors import shown
from blockx.io import IOScopeError
from blockx.phases.builders._json import parse_config
from blockx.phases.builders._model import BuilderFailed, BuildRequest, collect
from blockx.phases.builders._rows import ROW_KEYS, ROWS_USAGE, RowCalls
from blockx.phases.bundles import BundleError, open_verified, read_manifest

NAME: Final = "bundle_scan"


class _Reader:
    """The bundle's rows as calls, one read at a time (every method on a worker thread)."""

    def __init__(self, path: str, columns: list[str] | None, rows: RowCalls) -> None:
        self._path = path
        self._columns = columns
        self._rows = rows
        self._files: Iterator[dict[str, Any]] = iter(())
        self._batches: Iterator[Any] = iter(())
        self._next_call = 0

    def open(self) -> None:
        self._files = iter(self._failing_as_builder(read_manifest, self._path)["files"])

    def read(self) -> list[CallSpec]:
        """The next rows' calls; [] at the end of the bundle."""
        while True:
            batch = next(self._batches, None)
            if batch is not None and batch.num_rows:
                break
            if batch is None:
                entry = next(self._files, None)
                if entry is None:
                    return []
                parquet = self._failing_as_builder(open_verified, self._path, entry)
                names = parquet.schema_arrow.names
                missing = [c for c in self._columns or () if c not in names]
                if missing:
                    raise BuilderFailed(
                        message=f"{NAME}: config_json.columns names a column the bundle lacks: "
                        f"{', '.join(map(repr, missing))} (its columns: {', '.join(names)})"
                    )
                self._batches = parquet.iter_batches(
                    batch_size=self._rows.rows_per_read, columns=self._columns
                )
        names = batch.schema.names
        rows = list(zip(*(column.to_pylist() for column in batch.columns), strict=True))
        calls = self._rows.calls(names, rows, self._next_call)
        self._next_call += len(calls)
        return calls

    @staticmethod
    def _failing_as_builder(read: Any, *args: Any) -> Any:
        try:
            return read(*args)
        except BundleError as error:
            raise BuilderFailed(message=f"{NAME}: {error.message}") from error
        except OSError as error:
            raise BuilderFailed(
                message=f"{NAME}: cannot read the bundle: {error}", retryable=True
            ) from error


def _reader(request: BuildRequest) -> _Reader:
    config = parse_config(NAME, request.function_call.config_json, ("path", "columns", *ROW_KEYS))
    path = config.get("path")
    if not isinstance(path, str) or not path:
        raise BuilderFailed(
            message=f"{NAME}: config_json.path is required: the bundle's directory; "
            f"got {shown(path)}"
        )
    columns = config.get("columns")
    if columns is not None and (
        not isinstance(columns, list)
        or not columns
        or not all(isinstance(column, str) for column in columns)
    ):
        raise BuilderFailed(
            message=f"{NAME}: config_json.columns must be a non-empty list of column names, "
            f"got {shown(columns)}"
        )
    if request.payload.strip():
        raise BuilderFailed(message=f"{NAME}: takes no payload; its config says what to scan")
    if request.io is not None:
        try:
            path = request.io.bundle_path(path)
        except IOScopeError as error:
            raise BuilderFailed(message=f"{NAME}: config_json.path: {error.message}") from error
    return _Reader(path, columns, RowCalls.from_config(NAME, config))


class BundleScanBuilder:
    """Streams a bundle's rows into calls, `rows_per_call` rows each."""

    name: Final = NAME
    usage: Final = (
        f'config {{"path": "DIR", "columns": [...], {ROWS_USAGE}}}: a call per rows_per_call '
        "rows of the bundle at DIR, each file checked against its manifest; no payload"
    )

    async def build(self, request: BuildRequest) -> list[CallSpec]:
        return await collect(self.stream(request))

    async def stream(self, request: BuildRequest) -> AsyncIterator[list[CallSpec]]:
        reader = _reader(request)
        await trio.to_thread.run_sync(reader.open, abandon_on_cancel=True)
        while calls := await trio.to_thread.run_sync(reader.read, abandon_on_cancel=True):
            yield calls
