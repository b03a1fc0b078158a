"""The table_upserts plugin against real SQLite and DuckDB files."""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import duckdb
import pytest

from blockx.phases.plugins import PluginFailed, TableUpsertsPlugin
from blockx.slots import PluginResult
from tests.plugin_runs import run_plugin


async def upsert(
    config: dict[str, Any], values: Sequence[object], task_id: str = "t1"
) -> PluginResult:
    return await run_plugin(TableUpsertsPlugin(), config, values, task_id)


def sqlite_rows(
    path: Path, sql: str = "select * from results order by id"
) -> list[tuple[Any, ...]]:
    with sqlite3.connect(path) as connection:
        return connection.execute(sql).fetchall()


def duckdb_rows(path: Path) -> list[tuple[Any, ...]]:
    with duckdb.connect(str(path)) as connection:
        return connection.execute("select * from results order by id").fetchall()


async def test_sqlite_rows_are_upserted_by_key_and_a_rerun_writes_each_key_once(
    tmp_path: Path,
) -> None:
    db = tmp_path / "out.db"
    config = {"database": str(db), "table": "results", "key": "id", "create": True}
    first = [{"id": 1, "value": "a", "score": 0.5}, {"id": 2, "value": "b", "score": None}]
    result = await upsert(config, first)
    assert (result.ok, result.records_written) == (True, 2)
    assert result.detail == f"results in sqlite {db}"
    await upsert(config, first)  # the same task run again
    assert sqlite_rows(db) == [(1, "a", 0.5), (2, "b", None)]
    await upsert(config, [{"id": 2, "value": "B"}, {"id": 3, "value": "c", "score": 1.5}])
    assert sqlite_rows(db) == [(1, "a", 0.5), (2, "B", None), (3, "c", 1.5)]
    columns = sqlite_rows(db, "select name, type, pk from pragma_table_info('results')")
    assert columns == [("id", "INTEGER", 1), ("value", "TEXT", 0), ("score", "REAL", 0)]


async def test_a_composite_key_and_nested_values(tmp_path: Path) -> None:
    db = tmp_path / "out.db"
    config = {"database": f"sqlite:{db}", "table": "t", "key": ["a", "b"], "create": True}
    await upsert(config, [{"a": "x", "b": 1, "data": {"k": [1, 2]}, "raw": b"\x00\x01"}])
    await upsert(config, [{"a": "x", "b": 1, "data": [3]}, {"a": "x", "b": 2, "data": None}])
    rows = sqlite_rows(db, "select a, b, data, raw from t order by b")
    assert rows == [("x", 1, "[3]", b"\x00\x01"), ("x", 2, None, None)]


@pytest.mark.parametrize(
    ("values", "message"),
    [
        (
            [{"id": 1, "value": "a"}, {"id": 2, "colour": "red"}],
            "table_upserts: output 1 has column 'colour', which table 'results' lacks "
            "(its columns: id, value); nothing was written",
        ),
        (
            [{"value": "a"}],
            "table_upserts: output 0 lacks key column 'id'; nothing was written",
        ),
        (
            [{"id": 1, "value": "a"}, [1, 2]],
            "table_upserts: output 1 item 0 must be an object of column values (an output "
            "may be an array of them), got int; nothing was written",
        ),
        (
            [{"id": 1, "bad name": 2}],
            "table_upserts: output 0 has a key 'bad name' that is not a column name; "
            "nothing was written",
        ),
    ],
)
async def test_outputs_that_do_not_fit_fail_naming_what_and_write_nothing(
    tmp_path: Path, values: list[object], message: str
) -> None:
    db = tmp_path / "out.db"
    with sqlite3.connect(db) as connection:
        connection.execute("create table results (id integer primary key, value text)")
        connection.execute("insert into results values (0, 'kept')")
    config = {"database": str(db), "table": "results", "key": "id"}
    with pytest.raises(PluginFailed) as raised:
        await upsert(config, values)
    assert raised.value.message == message
    assert not raised.value.retryable
    assert sqlite_rows(db) == [(0, "kept")]


async def test_a_task_that_fails_mid_write_leaves_the_table_as_it_was(tmp_path: Path) -> None:
    db = tmp_path / "out.db"
    with sqlite3.connect(db) as connection:
        connection.execute(
            "create table results (id integer primary key, value integer check (value >= 0))"
        )
        connection.execute("insert into results values (1, 10)")
    config = {"database": str(db), "table": "results", "key": "id"}
    values = [{"id": 1, "value": 11}, {"id": 2, "value": 20}, {"id": 3, "value": -1}]
    with pytest.raises(PluginFailed) as raised:
        await upsert(config, values)
    assert raised.value.message.startswith(
        "table_upserts: sqlite refused the upsert into 'results': CHECK constraint failed"
    )
    assert raised.value.retryable
    assert sqlite_rows(db) == [(1, 10)]


async def test_a_missing_table_is_named_unless_create_is_set(tmp_path: Path) -> None:
    db = tmp_path / "out.db"
    with pytest.raises(PluginFailed) as raised:
        await upsert({"database": str(db), "table": "results", "key": "id"}, [{"id": 1}])
    assert raised.value.message == (
        f"table_upserts: table 'results' does not exist in sqlite {str(db)!r} "
        "(config_json.create makes it); nothing was written"
    )


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"table": "t", "key": "id"}, "table_upserts: config_json.database is required"),
        ({"database": "x.db", "table": "drop table", "key": "id"}, "config_json.table must be"),
        ({"database": "x.db", "table": "t", "key": []}, "config_json.key must be"),
        ({"database": "x.db", "table": "t", "key": ["a", "a"]}, "config_json.key must be"),
        ({"database": "x.db", "table": "t", "key": "id", "create": 1}, "create must be true"),
        ({"database": "duckdb:", "table": "t", "key": "id"}, "database names no file"),
        ({"database": "x.db", "table": "t", "key": "id", "mode": 1}, "mode"),
    ],
)
async def test_a_bad_config_is_refused_naming_the_setting(
    config: dict[str, Any], message: str
) -> None:
    with pytest.raises(PluginFailed) as raised:
        await upsert(config, [{"id": 1}])
    assert message in raised.value.message
    assert not raised.value.retryable


async def test_duckdb_rows_are_upserted_by_key_in_one_transaction(tmp_path: Path) -> None:
    db = tmp_path / "out.duckdb"
    config = {"database": f"duckdb:{db}", "table": "results", "key": "id", "create": True}
    await upsert(config, [{"id": 1, "value": "a", "n": 1}, {"id": 2, "value": "b", "n": 2}])
    await upsert(config, [{"id": 2, "value": "B", "n": 20}])
    await upsert(config, [{"id": 2, "value": "B", "n": 20}])  # run again
    assert duckdb_rows(db) == [(1, "a", 1), (2, "B", 20)]
    with pytest.raises(PluginFailed) as raised:  # the third row breaks the key's type
        await upsert(config, [{"id": 3, "value": "c", "n": 3}, {"id": "x", "value": "d"}])
    assert raised.value.message.startswith("table_upserts: duckdb refused the upsert")
    assert duckdb_rows(db) == [(1, "a", 1), (2, "B", 20)]


async def test_no_outputs_write_nothing_and_connect_to_nothing(tmp_path: Path) -> None:
    db = tmp_path / "never.db"
    result = await upsert({"database": str(db), "table": "t", "key": "id", "create": True}, [])
    assert (result.ok, result.records_written) == (True, 0)
    assert not db.exists()


async def test_an_output_may_be_an_array_of_rows(tmp_path: Path) -> None:
    """A call over a batch of rows returns its rows as one output."""
    db = tmp_path / "out.db"
    config = {"database": str(db), "table": "results", "key": "id", "create": True}
    batches: list[object] = [
        [{"id": 1, "value": "a"}, {"id": 2, "value": "b"}],
        [],
        {"id": 3, "value": "c"},
        [{"id": 1, "value": "A"}],
    ]
    result = await upsert(config, batches)
    assert result.records_written == 4
    assert sqlite_rows(db) == [(1, "A"), (2, "b"), (3, "c")]


async def test_rows_may_be_arrays_of_the_configured_columns(tmp_path: Path) -> None:
    db = tmp_path / "out.db"
    config = {
        "database": str(db),
        "table": "results",
        "key": "id",
        "create": True,
        "columns": ["id", "value"],
    }
    result = await upsert(config, [[[1, "a"], [2, "b"]], [{"id": 3, "value": "c"}], [[2, "B"]]])
    assert result.records_written == 4
    assert sqlite_rows(db) == [(1, "a"), (2, "B"), (3, "c")]


@pytest.mark.parametrize(
    ("columns", "values", "message"),
    [
        (["id", "value"], [[[1, "a", 3]]], "output 0 item 0 has 3 values; config_json.columns"),
        (["value"], [[["a"]]], "config_json.columns must hold every key column (id)"),
        ("id", [[[1]]], "config_json.columns must be a list of distinct column names"),
        (None, [[[1, "a"]]], "output 0 item 0 must be an object of column values (an output"),
    ],
)
async def test_array_rows_need_columns_that_fit(
    tmp_path: Path, columns: object, values: list[object], message: str
) -> None:
    config: dict[str, Any] = {"database": str(tmp_path / "o.db"), "table": "t", "key": "id"}
    if columns is not None:
        config["columns"] = columns
    with pytest.raises(PluginFailed) as raised:
        await upsert({**config, "create": True}, values)
    assert message in raised.value.message


async def test_many_rows_per_statement_keep_the_last_value_of_a_repeated_key(
    tmp_path: Path,
) -> None:
    """SQLite takes hundreds of rows per statement; a key repeated inside one statement or
    across statements ends with its last value, as row by row would."""
    db = tmp_path / "out.db"
    config = {"database": str(db), "table": "results", "key": "id", "create": True}
    rows = [{"id": n % 600, "value": f"v{n}"} for n in range(1001)]
    result = await upsert(config, [rows])
    assert result.records_written == 1001
    expected = {n % 600: f"v{n}" for n in range(1001)}
    assert sqlite_rows(db) == sorted(expected.items())


async def test_a_database_file_s_missing_directory_is_made(tmp_path: Path) -> None:
    db = tmp_path / "new" / "dir" / "out.db"
    config = {"database": str(db), "table": "results", "key": "id", "create": True}
    assert (await upsert(config, [{"id": 1, "value": "a"}])).records_written == 1
    assert sqlite_rows(db) == [(1, "a")]
