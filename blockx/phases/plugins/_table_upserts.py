"""The `table_upserts` plugin: upserts each output's rows into a table by key.

Config: `{"database": ..., "table": "name", "key": "col" or ["col", ...],
"create": false, "columns": ["col", ...]}`. `database` is a SQLite file (a
bare path or `sqlite:PATH`), a DuckDB file (`duckdb:PATH`) or a PostgreSQL
URL (`postgresql://...`); the worker's `io.tableDatabase` when omitted.
Each output is a row or an array of rows (a call over a batch of rows
returns one). A row is an object whose keys are columns
of the table and which holds every key column, or, when `columns` is given,
an array of those columns' values in that order (cheaper to make, send and
decode). A row whose key is already in the table replaces the other columns
it names. One transaction per task: a task run again writes each key once,
and a task that fails mid-write leaves the table as it was. With `create`, a
missing table is made from the first output's rows (a column's type from its
first value; the key columns its primary key). Outputs are decoded one at a
time, so only one output's rows are in memory. Lists and objects inside a row
are stored as JSON text, bytes as a blob.

The connection comes from the task's IO scope; every statement runs on a
worker thread, never cancelled half-way (a phase timeout waits for the
transaction to end).
"""

from __future__ import annotations

import itertools
import json
import os
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
CONFIG_KEYS: Final = ("database", "table", "key", "create", "columns")
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
    columns: tuple[str, ...] = ()
    """The columns of a row given as an array, in order (empty: rows are objects only)."""


def _names(config: dict[str, object], field: str) -> list[str] | None:
    """A column name or a list of distinct ones, from `field` of the config."""
    value = config.get(field)
    names = [value] if isinstance(value, str) else value
    if (
        not isinstance(names, list)
        or not names
        or not all(isinstance(n, str) and _IDENTIFIER.fullmatch(n) for n in names)
        or len(set(names)) != len(names)
    ):
        return None
    return names


def _target(config_json: str, default_database: str = "") -> _Target:
    config = parse_config(NAME, config_json, CONFIG_KEYS)
    database = config.get("database", default_database or None)
    if not isinstance(database, str) or not database:
        raise PluginFailed(
            message=f"{NAME}: config_json.database is required (this worker sets no "
            "io.tableDatabase): a SQLite file, duckdb:PATH or a postgresql:// URL; "
            f"got {shown(database)}"
        )
    table = config.get("table")
    if not isinstance(table, str) or not _IDENTIFIER.fullmatch(table):
        raise PluginFailed(
            message=f"{NAME}: config_json.table must be a table name (letters, digits and _, "
            f"not starting with a digit), got {shown(table)}"
        )
    keys = _names(config, "key")
    if keys is None:
        raise PluginFailed(
            message=f"{NAME}: config_json.key must be a column name or a list of distinct "
            f"column names, got {shown(config.get('key'))}"
        )
    columns = _names(config, "columns") if "columns" in config else []
    if columns is None or isinstance(config.get("columns"), str):
        raise PluginFailed(
            message=f"{NAME}: config_json.columns must be a list of distinct column names "
            f"(the order of a row given as an array), got {shown(config.get('columns'))}"
        )
    if columns and not set(keys) <= set(columns):
        raise PluginFailed(
            message=f"{NAME}: config_json.columns must hold every key column "
            f"({', '.join(keys)}), got {', '.join(columns)}"
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
    return _Target(
        dialect=dialect,
        database=target,
        table=table,
        key=tuple(keys),
        create=create,
        columns=tuple(columns),
    )


Groups = dict[tuple[str, ...], list[Sequence[object]]]
"""One output's rows: their values by the columns they name, in that order."""


def _output_groups(index: int, output: bytes, target: _Target) -> Groups:
    """The rows of one output, grouped by their columns; each row checked to be an object
    of columns holding the key (each distinct set of columns is checked once), or an array
    of `config_json.columns` values."""
    value = decoded_output(NAME, index, output)
    rows: list[Any] = value if type(value) is list else [value]
    groups: Groups = {}
    width = len(target.columns)
    for number, row in enumerate(rows):
        kind = type(row)
        if kind is dict:
            shape = tuple(row)
            group = groups.get(shape)
            if group is None:
                _check_shape(index, row, target.key)
                group = groups[shape] = []
            group.append(tuple(row.values()))
        elif kind is list and width:
            if len(row) != width:
                raise PluginFailed(
                    message=f"{NAME}: output {index} item {number} has {len(row)} values; "
                    f"config_json.columns names {width}; nothing was written"
                )
            groups.setdefault(target.columns, []).append(row)
        else:
            where = f"output {index} item {number}" if type(value) is list else f"output {index}"
            arrays = " or an array of config_json.columns values" if width else ""
            raise PluginFailed(
                message=f"{NAME}: {where} must be an object of column values{arrays} (an "
                f"output may be an array of them), got {kind.__name__}; nothing was written"
            )
    return groups


def _check_shape(index: int, row: dict[Any, object], key: tuple[str, ...]) -> None:
    for column in row:
        if not isinstance(column, str) or not _IDENTIFIER.fullmatch(column):
            raise PluginFailed(
                message=f"{NAME}: output {index} has a key {shown(column)} that is not "
                "a column name; nothing was written"
            )
    for column in key:
        if column not in row:
            raise PluginFailed(
                message=f"{NAME}: output {index} lacks key column {column!r}; nothing was written"
            )


def _groups_by_output(outputs: Sequence[bytes], target: _Target) -> Iterator[tuple[int, Groups]]:
    """Each output's rows, decoded one output at a time (a task's outputs may hold
    millions of rows: only one output's are ever in memory)."""
    for index, output in enumerate(outputs):
        groups = _output_groups(index, output, target)
        if groups:
            yield index, groups


def _stored(value: object) -> object:
    """A row value as the driver takes it: lists and objects as JSON text."""
    if isinstance(value, list | dict):
        return json.dumps(json_ready(value), separators=(",", ":"))
    return value


def _columns_sql(target: _Target, groups: Groups) -> str:
    """The column definitions of a table made for the rows of `groups`: each column's first
    value that is not null gives its type (text if none has one)."""
    types: dict[str, str | None] = {}
    for shape, rows in groups.items():
        for row in rows:
            for column, value in zip(shape, row, strict=True):
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
    by_output = _groups_by_output(outputs, target)
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
            if target.dialect.backend == "postgres":
                # Concurrent CREATE TABLE IF NOT EXISTS of one table can both pass the
                # check and one fail on the catalogue: tasks creating it take turns.
                lock = f"SELECT pg_advisory_xact_lock(hashtext({target.dialect.placeholder}))"
                connection.execute(lock, (f"blockx.table_upserts.{target.table}",))
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
        for index, groups in itertools.chain((first,), by_output):
            for shape, values in groups.items():
                _check_columns(target, index, shape, columns)
                _upsert_values(connection, target, shape, values)
                written += len(values)
    except BaseException:
        connection.rollback()
        raise
    connection.commit()
    return written


_NESTED: Final = frozenset({list, dict})
_SQLITE_VARIABLES: Final = 999
"""Bound values one SQLite statement may take (the lowest limit any build has)."""


def _check_columns(target: _Target, index: int, shape: tuple[str, ...], columns: list[str]) -> None:
    for column in shape:
        if column not in columns:
            raise PluginFailed(
                message=f"{NAME}: output {index} has column {column!r}, which table "
                f"{target.table!r} lacks (its columns: {', '.join(columns)}); "
                "nothing was written"
            )


def _upsert_values(
    connection: Any, target: _Target, shape: tuple[str, ...], values: list[Sequence[object]]
) -> None:
    """Rows of the columns `shape` (SQLite: many rows per statement, which halves its cost
    per row; the others take one statement for many rows)."""
    if not _NESTED.isdisjoint(map(type, itertools.chain.from_iterable(values))):
        values = [tuple(map(_stored, row)) for row in values]
    if target.dialect.backend == "sqlite":
        per = max(1, min(500, _SQLITE_VARIABLES // len(shape)))
        whole = len(values) - len(values) % per
        if whole:
            sql = _statement(target, shape, per)
            for start in range(0, whole, per):
                connection.execute(
                    sql, list(itertools.chain.from_iterable(values[start : start + per]))
                )
        if whole < len(values):
            connection.executemany(_statement(target, shape, 1), values[whole:])
    elif target.dialect.backend == "postgres":
        with connection.cursor() as cursor:
            cursor.executemany(_statement(target, shape, 1), values)
    else:  # a DuckDB cursor is a connection of its own: not this transaction's
        connection.executemany(_statement(target, shape, 1), values)


def _statement(target: _Target, shape: tuple[str, ...], rows: int) -> str:
    """The upsert of `rows` rows of the columns `shape`."""
    names = ", ".join(f'"{c}"' for c in shape)
    marks = "(" + ", ".join(target.dialect.placeholder for _ in shape) + ")"
    others = [c for c in shape if c not in target.key]
    action = (
        "DO UPDATE SET " + ", ".join(f'"{c}" = excluded."{c}"' for c in others)
        if others
        else "DO NOTHING"
    )
    key = ", ".join(f'"{c}"' for c in target.key)
    return (
        f'INSERT INTO "{target.table}" ({names}) VALUES {", ".join([marks] * rows)} '
        f"ON CONFLICT ({key}) {action}"
    )


def _make_parent(target: _Target) -> None:
    """A database file's directory, made if missing (as jsonl and bundle_write do)."""
    if target.dialect.backend != "postgres" and target.database != ":memory:":
        parent = os.path.dirname(target.database)
        if parent:
            try:
                os.makedirs(parent, exist_ok=True)
            except OSError as error:
                raise PluginFailed(
                    message=f"{NAME}: cannot make the directory of {target.database!r}: {error}",
                    retryable=True,
                ) from error


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
        '"key": "COL" | ["COL", ...], "create": false, "columns": [...]}: each output, a row '
        "or an array of rows (objects, or arrays of the columns' values), upserted into T by key"
    )

    async def run(self, request: PluginRequest) -> PluginResult:
        if request.io is None:
            raise PluginFailed(message=f"{NAME}: this task has no IO scope to connect through")
        target = _target(request.handler.config_json, request.io.table_database)
        where = f"{target.table} in {target.dialect.backend} {shown_target(target.database)}"
        written = 0
        if request.outputs:
            await trio.to_thread.run_sync(_make_parent, target)
            try:
                connection = await request.io.connect(target.dialect.backend, target.database)
            except IOScopeError as error:
                raise PluginFailed(message=f"{NAME}: {error.message}", retryable=True) from error
            written = await trio.to_thread.run_sync(_write, connection, target, request.outputs)
        return PluginResult(plugin_type=NAME, ok=True, records_written=written, detail=where)
