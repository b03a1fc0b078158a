"""The dbscan builder against real DuckDB: files, attached SQLite, row shapes, refusals."""

from __future__ import annotations

import datetime
import decimal
import json
import sqlite3
from pathlib import Path
from typing import Any

import duckdb
import pytest
import trio

from blockx.calls import decode_args
from blockx.io import IOSystem
from blockx.phases.builders import BuilderFailed, BuildRequest, DbscanBuilder
from blockx.phases.builders._rows import RowCalls
from blockx.slots import FunctionCall
from tests.plugin_runs import LIMITS, run_stream


def args_of(batches: list[list[Any]]) -> list[list[Any]]:
    return [decode_args(call.args)[0] for batch in batches for call in batch]


@pytest.fixture
def people_csv(tmp_path: Path) -> Path:
    path = tmp_path / "people.csv"
    path.write_text("id,name,age\n1,ann,31\n2,bob,45\n3,cy,27\n4,dee,52\n5,eve,38\n")
    return path


async def test_a_csv_query_becomes_one_call_per_rows_per_call_rows(people_csv: Path) -> None:
    config = {
        "query": f"SELECT id, upper(name) AS name FROM read_csv('{people_csv}') "
        "WHERE age > ? ORDER BY id",
        "parameters": [30],
        "function": "etl.load",
        "rows_per_call": 2,
        "args": ["people"],
    }
    batches = await run_stream(DbscanBuilder(), config)
    calls = [call for batch in batches for call in batch]
    assert [call.call_id for call in calls] == ["0", "1"]
    assert {call.function for call in calls} == {"etl.load"}
    assert args_of(batches) == [
        ["people", [{"id": 1, "name": "ANN"}, {"id": 2, "name": "BOB"}]],
        ["people", [{"id": 4, "name": "DEE"}, {"id": 5, "name": "EVE"}]],
    ]


@pytest.mark.parametrize(
    ("shape", "expected"),
    [
        ("records", [{"id": 1, "age": 31}, {"id": 2, "age": 45}]),
        ("columns", {"id": [1, 2], "age": [31, 45]}),
        ("tuples", [[1, 31], [2, 45]]),
    ],
)
async def test_rows_take_the_shape_asked_for(people_csv: Path, shape: str, expected: Any) -> None:
    config = {
        "query": f"SELECT id, age FROM '{people_csv}' ORDER BY id LIMIT 2",
        "function": "etl.load",
        "rows": shape,
    }
    assert args_of(await run_stream(DbscanBuilder(), config)) == [[expected]]


async def test_a_large_scan_streams_in_whole_calls_numbered_in_order(tmp_path: Path) -> None:
    parquet = tmp_path / "n.parquet"
    duckdb.sql(f"COPY (SELECT range AS n FROM range(20000)) TO '{parquet}' (FORMAT parquet)")
    config = {"query": f"SELECT n FROM '{parquet}' ORDER BY n", "function": "m.f"}
    batches = await run_stream(DbscanBuilder(), config)
    assert len(batches) > 1  # read a few calls at a time, not all at once
    calls = [call for batch in batches for call in batch]
    assert [call.call_id for call in calls] == [str(i) for i in range(20)]
    rows = [row for args in args_of(batches) for row in args[0]]
    assert rows == [{"n": n} for n in range(20000)]


async def test_an_attached_sqlite_database_is_read_without_downloading(tmp_path: Path) -> None:
    database = tmp_path / "src.db"
    with sqlite3.connect(database) as connection:
        connection.execute("create table t (k text, v real)")
        connection.executemany("insert into t values (?, ?)", [("a", 1.5), ("b", 2.5)])
    config = {
        "query": "SELECT k, v * 2 AS v FROM src.t ORDER BY k",
        "attach": {"src": f"sqlite:{database}"},
        "function": "m.f",
    }
    assert args_of(await run_stream(DbscanBuilder(), config)) == [
        [[{"k": "a", "v": 3.0}, {"k": "b", "v": 5.0}]]
    ]


async def test_values_msgpack_lacks_travel_as_text() -> None:
    config = {
        "query": "SELECT DATE '2026-12-04' AS d, TIMESTAMP '2026-12-04 10:30:00' AS ts, "
        "12.50::DECIMAL(6,2) AS price, INTERVAL 90 SECOND AS wait, 'x'::BLOB AS raw, "
        "170141183460469231731687303715884105727::HUGEINT AS big, "
        "'550e8400-e29b-41d4-a716-446655440000'::UUID AS id",
        "function": "m.f",
    }
    [[row]] = [args[0] for args in args_of(await run_stream(DbscanBuilder(), config))]
    assert row == {
        "d": datetime.date(2026, 12, 4).isoformat(),
        "ts": "2026-12-04T10:30:00",
        "price": str(decimal.Decimal("12.50")),
        "wait": [0, 0, 90_000_000_000],  # months, days, nanoseconds
        "raw": b"x",
        "big": "170141183460469231731687303715884105727",
        "id": "550e8400-e29b-41d4-a716-446655440000",
    }


async def test_an_empty_result_streams_no_calls(people_csv: Path) -> None:
    config = {"query": f"SELECT * FROM '{people_csv}' WHERE age > 99", "function": "m.f"}
    assert await run_stream(DbscanBuilder(), config) == []


@pytest.mark.parametrize(
    ("config", "payload", "message"),
    [
        ({"function": "m.f"}, b"", "dbscan: config_json.query is required"),
        ({"query": "SELECT 1"}, b"", "dbscan: config_json.function is required"),
        ({"query": "SELECT 1", "function": "m.f", "parameters": 3}, b"", "parameters must be"),
        ({"query": "SELECT 1", "function": "m.f", "rows": "rows"}, b"", "rows must be one of"),
        ({"query": "SELECT 1", "function": "m.f", "rows_per_call": 0}, b"", "rows_per_call"),
        ({"query": "SELECT 1", "function": "m.f", "attach": {"1x": "sqlite:a"}}, b"", "1x"),
        ({"query": "SELECT 1", "function": "m.f", "attach": {"a": "mysql:x"}}, b"", "attach.a"),
        ({"query": "SELECT 1", "function": "m.f", "colour": 1}, b"", "colour"),
        ({"query": "SELECT 1", "function": "m.f"}, b"{}", "takes no payload"),
        ({"query": "SELEC 1", "function": "m.f"}, b"", "dbscan: config_json.query failed"),
        (
            {"query": "SELECT * FROM read_csv('/nonexistent/x.csv')", "function": "m.f"},
            b"",
            "config_json.query failed: IO Error",
        ),
        (
            {"query": "SELECT 1", "function": "m.f", "attach": {"s": "sqlite:/nonexistent/x"}},
            b"",
            "dbscan: cannot attach sqlite '/nonexistent/x' as 's': no such file",
        ),
        (
            {"query": "SELECT 1", "function": "m.f", "attach": {"s": f"sqlite:{__file__}"}},
            b"",
            f"dbscan: cannot attach sqlite {__file__!r} as 's': ",
        ),
    ],
)
async def test_a_bad_config_or_query_fails_the_builder_naming_it(
    config: dict[str, Any], payload: bytes, message: str
) -> None:
    with pytest.raises(BuilderFailed) as raised:
        await run_stream(DbscanBuilder(), config, payload)
    assert message in raised.value.message


def test_a_value_that_cannot_be_sent_fails_naming_its_column() -> None:
    rows = RowCalls.from_config("dbscan", {"function": "m.f"})
    with pytest.raises(BuilderFailed) as raised:
        rows.calls(["id", "blob"], [(1, object())], 0)
    assert raised.value.message.startswith("dbscan: column 'blob' (value <object object at ")
    assert "cannot be sent to m.f: a object value has no call-argument form" in (
        raised.value.message
    )


async def test_a_json_lines_file_is_scanned_too(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    path.write_text('{"kind": "click", "n": 3}\n{"kind": "view", "n": 7}\n')
    config = {
        "query": f"SELECT kind, n FROM read_json('{path}') ORDER BY n",
        "function": "m.f",
        "rows": "columns",
    }
    assert args_of(await run_stream(DbscanBuilder(), config)) == [
        [{"kind": ["click", "view"], "n": [3, 7]}]
    ]


async def test_a_cancelled_scan_stops_its_query_and_frees_the_connection() -> None:
    """An abandoned scan thread would run its query for minutes and hold the connection:
    DuckDB is told to interrupt it, so the connection answers again at once."""
    scope = IOSystem(LIMITS).open_scope("t1")
    config = {"query": "SELECT sum(range) FROM range(100000000000)", "function": "m.f"}
    request = BuildRequest(
        task_id="t1",
        function_call=FunctionCall(type="dbscan", config_json=json.dumps(config)),
        payload=b"",
        task_code_epoch="e1",
        io=scope,
    )
    try:
        with trio.move_on_after(0.3) as waited:  # the task's deadline, say
            async for _batch in DbscanBuilder().stream(request):
                raise AssertionError("the query cannot have ended yet")
        assert waited.cancelled_caught
        connection = await scope.connect("duckdb", ":memory:")
        with trio.fail_after(10):  # busy until the query ends, unless it was interrupted
            answer = await trio.to_thread.run_sync(
                lambda: connection.execute("SELECT 42").fetchall(), abandon_on_cancel=True
            )
        assert answer == [(42,)]
    finally:
        await scope.aclose()
