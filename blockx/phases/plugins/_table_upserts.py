"""The `table_upserts` plugin: upserts each output's rows into a table by key.

Config: `{"database": ..., "table": "name", "key": "col" or ["col", ...],
"create": false}`. `database` is a SQLite file (a bare path or `sqlite:PATH`),
a DuckDB file (`duckdb:PATH`) or a PostgreSQL URL (`postgresql://...`). Each
output is a row or an array of rows (a call over a batch of rows returns
one); a row is an object whose keys are columns of the table and which holds
every key column; a row whose key is already in the table replaces the
other columns it names. One transaction per task: a task run again writes
each key once, and a task that fails mid-write leaves the table as it was.
With `create`, a missing table is made from the first output's rows (a
column's type from its first value; the key columns its primary key).
Outputs are decoded one at a time, so only one output's rows are in memory. Lists and objects inside
a row are stored as JSON text, bytes as a blob.

The connection comes from the task's IO scope; every statement runs on a
worker thread, never cancelled half-way (a phase timeout waits for the
transaction to end).
"""

from __future__ import annotations

import itertools
import json
import re
from collections.abc import Iterator, Sequence
from typing import Any, Final

import attrs
import trio

from blockx.errors import shown
from blockx.io import IOScopeError, shown_target
from blockx.phases.plugins._model import (
    PluginFailed,
    PluginRequest,
    decoded_output,
    json_ready,
    parse_config,
)
from blockx.slots import PluginResult

NAME: Final = "table_upserts"
CONFIG_KEYS: Final = ("database", "table", "key", "create")
_IDENTIFIER: Final = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,62}")


@attrs.frozen
class _Dialect:
    backend: str
    placeholder: str
    types: dict[type, str]


_DIALECTS: Final = {
    "sqlite": _Dialect(
        "sqlite",
        "?",
        {bool: "INTEGER", int: "INTEGER", float: "REAL", str: "TEXT", bytes: "BLOB"},
    ),
    "duckdb": _Dialect(
        "duckdb",
        "?",
        {bool: "BOOLEAN", int: "BIGINT", float: "DOUBLE", str: "VARCHAR", bytes: "BLOB"},
    ),
    "postgres": _Dialect(
        "postgres",
        "%s",
        {
            bool: "BOOLEAN",
            int: "BIGINT",
            float: "DOUBLE PRECISION",
            str: "TEXT",
            bytes: "BYTEA",
        },
    ),
}


@attrs.frozen(kw_only=True)
class _Target:
    dialect: _Dialect
    database: str
    """What the backend connects to: a file path or a URL."""
    table: str
    key: tuple[str, ...]
    create: bool


def _target(config_json: str) -> _Target:
    config = parse_config(NAME, config_json, CONFIG_KEYS)
    database = config.get("database")
    if not isinstance(database, str) or not database:
        raise PluginFailed(
            message=f"{NAME}: config_json.database is required: a SQLite file, "
            f"duckdb:PATH or a postgresql:// URL; got {shown(database)}"
        )
    table = config.get("table")
    if not isinstance(table, str) or not _IDENTIFIER.fullmatch(table):
        raise PluginFailed(
            message=f"{NAME}: config_json.table must be a table name (letters, digits and _, "
            f"not starting with a digit), got {shown(table)}"
        )
    key = config.get("key")
    keys = [key] if isinstance(key, str) else key
    if (
        not isinstance(keys, list)
        or not keys
        or not all(isinstance(k, str) and _IDENTIFIER.fullmatch(k) for k in keys)
        or len(set(keys)) != len(keys)
    ):
        raise PluginFailed(
            message=f"{NAME}: config_json.key must be a column name or a list of distinct "
            f"column names, got {shown(key)}"
        )
    create = config.get("create", False)
    if not isinstance(create, bool):
        raise PluginFailed(message=f"{NAME}: config_json.create must be true or false")
    if database.startswith(("postgresql://", "postgres://")):
        dialect, target = _DIALECTS["postgres"], database
    elif database.startswith("duckdb:"):
        dialect, target = _DIALECTS["duckdb"], database.removeprefix("duckdb:")
    else:
        dialect, target = _DIALECTS["sqlite"], database.removeprefix("sqlite:")
    if not target:
        raise PluginFailed(message=f"{NAME}: config_json.database names no file: {database!r}")
    return _Target(dialect=dialect, database=target, table=table, key=tuple(keys), create=create)


def _output_rows(index: int, output: bytes, key: tuple[str, ...]) -> list[dict[str, object]]:
    """The rows of one output (an object, or an array of objects), each checked to be an
    object of columns holding the key."""
    value = decoded_output(NAME, index, output)
    rows: list[Any] = value if type(value) is list else [value]
    for number, row in enumerate(rows):
        if type(row) is not dict:
            where = f"output {index} item {number}" if type(value) is list else f"output {index}"
            raise PluginFailed(
                message=f"{NAME}: {where} must be an object of column values (an output may "
                f"be an array of them), got {type(row).__name__}; nothing was written"
            )
        for column in row:
            if not isinstance(column, str) or not _IDENTIFIER.fullmatch(column):
                raise PluginFailed(
                    message=f"{NAME}: output {index} has a key {shown(column)} that is not "
                    "a column name; nothing was written"
                )
        for column in key:
            if column not in row:
                raise PluginFailed(
                    message=f"{NAME}: output {index} lacks key column {column!r}; "
                    "nothing was written"
                )
    return rows


def _rows_by_output(
    outputs: Sequence[bytes], key: tuple[str, ...]
) -> Iterator[tuple[int, list[dict[str, object]]]]:
    """Each output's rows, decoded one output at a time (a task's outputs may hold
    millions of rows: only one output's are ever in memory)."""
    for index, output in enumerate(outputs):
        rows = _output_rows(index, output, key)
        if rows:
            yield index, rows


def _stored(value: object) -> object:
    """A row value as the driver takes it: lists and objects as JSON text."""
    if isinstance(value, list | dict):
        return json.dumps(json_ready(value), separators=(",", ":"))
    return value


def _columns_sql(target: _Target, rows: list[dict[str, object]]) -> str:
    """The column definitions of a table made for `rows`: each column's first value that is
    not null gives its type (text if none has one)."""
    types: dict[str, str | None] = {}
    for row in rows:
        for column, value in row.items():
            if types.get(column) is None:
                types[column] = _sql_type(target.dialect, value)
    text = target.dialect.types[str]
    definitions = [f'"{column}" {kind or text}' for column, kind in types.items()]
    key = ", ".join(f'"{column}"' for column in target.key)
    return f"{', '.join(definitions)}, PRIMARY KEY ({key})"


def _sql_type(dialect: _Dialect, value: object) -> str | None:
    if value is None:
        return None
    if isinstance(value, list | dict):
        return dialect.types[str]  # stored as JSON text
    return dialect.types.get(type(value), dialect.types[str])


def _table_columns(connection: Any, target: _Target) -> list[str]:
    if target.dialect.backend == "sqlite":
        found = connection.execute(f'PRAGMA table_info("{target.table}")').fetchall()
        return [row[1] for row in found]
    schema = "current_schema()"
    cursor = connection.execute(
        "SELECT column_name FROM information_schema.columns "
        f"WHERE table_name = {target.dialect.placeholder} AND table_schema = {schema} "
        "ORDER BY ordinal_position",
        (target.table,),
    )
    return [row[0] for row in cursor.fetchall()]


def _upsert(connection: Any, target: _Target, outputs: Sequence[bytes]) -> int:
    """Every output's rows in one transaction (the caller's thread); how many."""
    table = f'"{target.table}"'
    by_output = _rows_by_output(outputs, target.key)
    first = next(by_output, None)
    if first is None:
        return 0
    if target.dialect.backend == "sqlite":
        connection.execute("BEGIN")
    elif target.dialect.backend == "duckdb":
        connection.begin()
    written = 0
    try:
        if target.create:
            sql = f"CREATE TABLE IF NOT EXISTS {table} ({_columns_sql(target, first[1])})"
            connection.execute(sql)
        columns = _table_columns(connection, target)
        if not columns:
            raise PluginFailed(
                message=f"{NAME}: table {target.table!r} does not exist in "
                f"{target.dialect.backend} {shown_target(target.database)!r} "
                "(config_json.create makes it); "
                "nothing was written"
            )
        known = set(columns)
        for index, rows in itertools.chain((first,), by_output):
            _check_columns(index, rows, known, target.table, columns)
            _upsert_rows(connection, target, rows)
            written += len(rows)
    except BaseException:
        connection.rollback()
        raise
    connection.commit()
    return written


def _check_columns(
    index: int, rows: list[dict[str, object]], known: set[str], table: str, columns: list[str]
) -> None:
    for row in rows:
        for column in row:
            if column not in known:
                raise PluginFailed(
                    message=f"{NAME}: output {index} has column {column!r}, which table "
                    f"{table!r} lacks (its columns: {', '.join(columns)}); "
                    "nothing was written"
                )


def _upsert_rows(connection: Any, target: _Target, rows: list[dict[str, object]]) -> None:
    by_shape: dict[tuple[str, ...], list[tuple[object, ...]]] = {}
    for row in rows:
        by_shape.setdefault(tuple(row), []).append(tuple(_stored(v) for v in row.values()))
    key = ", ".join(f'"{c}"' for c in target.key)
    for shape, values in by_shape.items():
        names = ", ".join(f'"{c}"' for c in shape)
        marks = ", ".join(target.dialect.placeholder for _ in shape)
        others = [c for c in shape if c not in target.key]
        action = (
            "DO UPDATE SET " + ", ".join(f'"{c}" = excluded."{c}"' for c in others)
            if others
            else "DO NOTHING"
        )
        sql = (
            f'INSERT INTO "{target.table}" ({names}) VALUES ({marks}) ON CONFLICT ({key}) {action}'
        )
        if target.dialect.backend == "postgres":
            with connection.cursor() as cursor:
                cursor.executemany(sql, values)
        else:  # a DuckDB cursor is a connection of its own: not this transaction's
            connection.executemany(sql, values)


def _write(connection: Any, target: _Target, outputs: Sequence[bytes]) -> int:
    try:
        return _upsert(connection, target, outputs)
    except PluginFailed:
        raise
    except Exception as error:  # each driver has its own error classes
        raise PluginFailed(
            message=f"{NAME}: {target.dialect.backend} refused the upsert into "
            f"{target.table!r}: {error}; nothing was written",
            retryable=True,
        ) from error


class TableUpsertsPlugin:
    """Upserts each task's outputs into a table by key, one transaction per task."""

    name: Final = NAME
    usage: Final = (
        'config {"database": "FILE" | "duckdb:FILE" | "postgresql://...", "table": "T", '
        '"key": "COL" | ["COL", ...], "create": false}: each output, an object or an array '
        "of objects, gives rows of T upserted by key"
    )

    async def run(self, request: PluginRequest) -> PluginResult:
        target = _target(request.handler.config_json)
        if request.io is None:
            raise PluginFailed(message=f"{NAME}: this task has no IO scope to connect through")
        where = f"{target.table} in {target.dialect.backend} {shown_target(target.database)}"
        written = 0
        if request.outputs:
            try:
                connection = await request.io.connect(target.dialect.backend, target.database)
            except IOScopeError as error:
                raise PluginFailed(message=f"{NAME}: {error.message}", retryable=True) from error
            written = await trio.to_thread.run_sync(_write, connection, target, request.outputs)
        return PluginResult(plugin_type=NAME, ok=True, records_written=written, detail=where)
