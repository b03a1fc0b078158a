"""The `dbscan` builder: a DuckDB query's rows, streamed into calls.

Config: `{"query": "SELECT ...", "parameters": [...] or {...}, "database":
"FILE", "attach": {"name": "sqlite:FILE" | "duckdb:FILE" | "postgresql://..."},
...}` plus the row keys of `blockx.phases.builders._rows` (`function`,
`rows_per_call`, `rows`, `args`). The query runs in DuckDB: over files
(`read_parquet`, `read_csv`, `read_json`), over the attached databases (read
only, each under its name) or over `database` (a DuckDB file; a private
in-memory one by default). No payload. The connection comes from the task's
IO scope; the query and every read of its rows run on a worker thread,
abandoned (not waited for) when the task is cancelled or the phase IO
timeout passes, and DuckDB is told to interrupt the query then. The SQLite
and PostgreSQL scanners are loaded from their Python packages, never
downloaded.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any, Final, TypeVar

import attrs
import trio

from blockx.calls import CallSpec
from blockx.errors import shown
from blockx.io import IOScopeError, shown_target
from blockx.phases.builders._json import json_type, parse_config
from blockx.phases.builders._model import BuilderFailed, BuildRequest, collect
from blockx.phases.builders._rows import ROW_KEYS, ROWS_USAGE, RowCalls

NAME: Final = "dbscan"
CONFIG_KEYS: Final = ("query", "parameters", "database", "attach", *ROW_KEYS)
_IDENTIFIER: Final = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,62}")
_SCANNERS: Final = {"sqlite": "sqlite_scanner", "postgres": "postgres_scanner"}
T = TypeVar("T")


@attrs.frozen(kw_only=True)
class _Attach:
    name: str
    kind: str
    """"sqlite", "duckdb" or "postgres"."""
    target: str


@attrs.frozen(kw_only=True)
class _Scan:
    query: str
    parameters: list[object] | dict[str, object]
    database: str
    attach: tuple[_Attach, ...]
    rows: RowCalls


def _attach(name: object, value: object) -> _Attach:
    if not isinstance(name, str) or not _IDENTIFIER.fullmatch(name):
        raise BuilderFailed(
            message=f"{NAME}: config_json.attach key {shown(name)} is not a database name "
            "(letters, digits and _, not starting with a digit)"
        )
    where = f"config_json.attach.{name}"
    if not isinstance(value, str) or not value:
        raise BuilderFailed(
            message=f"{NAME}: {where} must be sqlite:FILE, duckdb:FILE or a postgresql:// URL, "
            f"got {shown(value)}"
        )
    if value.startswith(("postgresql://", "postgres://")):
        return _Attach(name=name, kind="postgres", target=value)
    kind, colon, target = value.partition(":")
    if not colon or kind not in ("sqlite", "duckdb") or not target:
        raise BuilderFailed(
            message=f"{NAME}: {where} must be sqlite:FILE, duckdb:FILE or a postgresql:// URL, "
            f"got {shown(value)}"
        )
    return _Attach(name=name, kind=kind, target=target)


def _scan(request: BuildRequest) -> _Scan:
    config = parse_config(NAME, request.function_call.config_json, CONFIG_KEYS)
    query = config.get("query")
    if not isinstance(query, str) or not query.strip():
        raise BuilderFailed(
            message=f"{NAME}: config_json.query is required: the SQL whose rows become calls; "
            f"got {shown(query)}"
        )
    parameters = config.get("parameters", [])
    if not isinstance(parameters, list | dict):
        raise BuilderFailed(
            message=f"{NAME}: config_json.parameters must be an array (for ?) or an object "
            f"(for $name), got {json_type(parameters)}"
        )
    database = config.get("database", ":memory:")
    if not isinstance(database, str) or not database:
        raise BuilderFailed(
            message=f"{NAME}: config_json.database must be a DuckDB file, got {shown(database)}"
        )
    attach = config.get("attach", {})
    if not isinstance(attach, dict):
        raise BuilderFailed(
            message=f"{NAME}: config_json.attach must be an object of name -> database, "
            f"got {json_type(attach)}"
        )
    if request.payload.strip():
        raise BuilderFailed(message=f"{NAME}: takes no payload; its config says what to scan")
    return _Scan(
        query=query,
        parameters=parameters,
        database=database,
        attach=tuple(_attach(name, value) for name, value in attach.items()),
        rows=RowCalls.from_config(NAME, config),
    )


def _load_scanner(connection: Any, kind: str) -> None:
    """Load the DuckDB extension that reads `kind` from its Python package."""
    import duckdb  # noqa: PLC0415 - loaded with the first scan

    extension = _SCANNERS[kind]
    module = importlib.import_module(f"duckdb_extension_{extension}")
    root = Path(str(module.__file__)).parent / "extensions"
    path = root / f"v{duckdb.__version__}" / f"{extension}.duckdb_extension"
    connection.execute(f"LOAD '{path}'")


def _quoted(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def _start(connection: Any, scan: _Scan) -> Any:
    """Attach the databases and run the query (a worker thread); a reader of its rows in
    Arrow batches (which become Python values several times faster than row tuples)."""
    import duckdb  # noqa: PLC0415

    for attach in scan.attach:
        what = f"{attach.kind} {shown_target(attach.target)!r} as {attach.name!r}"
        if attach.kind != "postgres" and not Path(attach.target).is_file():
            raise BuilderFailed(message=f"{NAME}: cannot attach {what}: no such file")
        options = "READ_ONLY" if attach.kind == "duckdb" else f"TYPE {attach.kind}, READ_ONLY"
        try:
            if attach.kind in _SCANNERS:
                _load_scanner(connection, attach.kind)
            connection.execute(f'ATTACH {_quoted(attach.target)} AS "{attach.name}" ({options})')
            # The catalog is read lazily: read it now, so a bad database is named as such.
            connection.execute(
                "SELECT 1 FROM duckdb_tables() WHERE database_name = ? LIMIT 1", [attach.name]
            ).fetchall()
        except duckdb.Error as error:
            raise BuilderFailed(
                message=f"{NAME}: cannot attach {what}: {error}",
                retryable=isinstance(error, duckdb.IOException),
            ) from error
    try:
        connection.execute(scan.query, scan.parameters)
        if connection.description is None:
            raise BuilderFailed(message=f"{NAME}: config_json.query returns no rows to scan")
        return connection.to_arrow_reader(scan.rows.rows_per_read)
    except duckdb.Error as error:
        raise BuilderFailed(message=f"{NAME}: config_json.query failed: {error}") from error


def _read(reader: Any, scan: _Scan, first: int) -> list[CallSpec]:
    """The next rows' calls (a worker thread); [] at the end."""
    import duckdb  # noqa: PLC0415

    try:
        batch = reader.read_next_batch()
    except StopIteration:
        return []
    except duckdb.Error as error:
        raise BuilderFailed(message=f"{NAME}: reading the query's rows failed: {error}") from error
    columns = batch.to_pydict()
    rows = list(zip(*columns.values(), strict=True))
    return scan.rows.calls(list(columns), rows, first)


class DbscanBuilder:
    """Streams the rows of a DuckDB query into calls, `rows_per_call` rows each."""

    name: Final = NAME
    usage: Final = (
        'config {"query": "SELECT ...", "parameters": [...], "attach": {"name": '
        '"sqlite:FILE" | "duckdb:FILE" | "postgresql://..."}, "database": "FILE", '
        f"{ROWS_USAGE}}}: a call per rows_per_call rows of the query; no payload"
    )

    async def build(self, request: BuildRequest) -> list[CallSpec]:
        return await collect(self.stream(request))

    async def stream(self, request: BuildRequest) -> AsyncIterator[list[CallSpec]]:
        scan = _scan(request)
        if request.io is None:
            raise BuilderFailed(message=f"{NAME}: this task has no IO scope to connect through")
        try:
            connection = await request.io.connect("duckdb", scan.database)
        except IOScopeError as error:
            raise BuilderFailed(message=f"{NAME}: {error.message}", retryable=True) from error
        reader = await _interruptible(connection, _start, connection, scan)
        first = 0
        while calls := await _interruptible(connection, _read, reader, scan, first):
            first += len(calls)
            yield calls


async def _interruptible(connection: Any, work: Callable[..., T], *args: Any) -> T:
    """`work` on a worker thread; cancelled (the task ended, the phase IO timeout), the
    thread is left to end and DuckDB is told to stop the query it runs, so an abandoned
    scan neither burns a CPU nor keeps the connection busy."""
    try:
        return await trio.to_thread.run_sync(work, *args, abandon_on_cancel=True)
    except trio.Cancelled:
        connection.interrupt()
        raise
