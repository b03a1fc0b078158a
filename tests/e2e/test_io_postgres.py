"""A task IO scope's PostgreSQL backend against a real server."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import psycopg
import pytest
import trio

from blockx.calls import decode_args
from blockx.io import IOScopeError, IOSystem
from blockx.phases.builders import DbscanBuilder
from blockx.phases.plugins import PluginFailed, TableUpsertsPlugin
from blockx.slots import PluginResult
from tests.e2e.postgres_server import postgres_server
from tests.plugin_runs import run_plugin, run_stream


async def test_a_scope_connects_to_postgres_and_its_close_ends_the_session(
    tmp_path: Path,
) -> None:
    async with postgres_server(tmp_path) as server:
        system = IOSystem({"sqlite": 1, "duckdb": 1, "postgres": 1})
        scope = system.open_scope("t1")
        connection: Any = await scope.connect("postgres", server.url)
        assert await scope.connect("postgres", server.url) is connection

        def answer() -> int:
            with connection.cursor() as cursor:
                cursor.execute("select 41 + 1")
                return int(cursor.fetchone()[0])

        assert await trio.to_thread.run_sync(answer) == 42
        assert system.admission("postgres").borrowed_tokens == 1
        await scope.aclose()
        assert connection.closed
        with pytest.raises(psycopg.OperationalError, match="closed"):
            connection.execute("select 1")
        assert system.admission("postgres").borrowed_tokens == 0


async def test_an_unreachable_postgres_is_a_clear_scope_error() -> None:
    scope = IOSystem({"sqlite": 1, "duckdb": 1, "postgres": 1}).open_scope("t1")
    url = "postgresql://nobody@127.0.0.1:1/none?connect_timeout=2"
    with pytest.raises(IOScopeError) as raised:
        await scope.connect("postgres", url)
    assert raised.value.message.startswith(f"cannot connect to postgres {url!r}: ")


async def upsert_into(
    url: str, values: list[dict[str, object]], *, create: bool, table: str = "results"
) -> PluginResult:
    config = {"database": url, "table": table, "key": ["id"], "create": create}
    return await run_plugin(TableUpsertsPlugin(), config, values)


async def test_tasks_creating_one_postgres_table_at_once_all_write(tmp_path: Path) -> None:
    async with postgres_server(tmp_path) as server:
        results: list[int] = []

        async def one_task(n: int) -> None:
            row: dict[str, object] = {"id": n, "n": n}
            written = await upsert_into(server.url, [row], create=True, table="raced")
            results.append(written.records_written)

        async with trio.open_nursery() as nursery:
            for n in range(12):
                nursery.start_soon(one_task, n)

        def count() -> int:
            with psycopg.connect(server.url) as check:
                [(rows,)] = check.execute("select count(*) from raced").fetchall()
                return int(rows)

        assert results == [1] * 12
        assert await trio.to_thread.run_sync(count) == 12


async def test_table_upserts_into_postgres_writes_each_key_once_and_all_or_nothing(
    tmp_path: Path,
) -> None:
    async with postgres_server(tmp_path) as server:
        rows = [{"id": 1, "name": "a", "n": 1}, {"id": 2, "name": "b", "n": 2}]
        result = await upsert_into(server.url, rows, create=True)
        assert result.records_written == 2
        await upsert_into(server.url, rows, create=True)  # the same task run again
        await upsert_into(server.url, [{"id": 2, "name": "B"}], create=False)
        with pytest.raises(PluginFailed) as raised:  # its second row breaks the key's type
            await upsert_into(server.url, [{"id": 3, "n": 3}, {"id": "x", "n": 4}], create=False)
        assert raised.value.message.startswith("table_upserts: postgres refused the upsert")
        assert raised.value.retryable

        def table() -> list[tuple[Any, ...]]:
            with psycopg.connect(server.url) as check:
                return check.execute("select id, name, n from results order by id").fetchall()

        assert await trio.to_thread.run_sync(table) == [(1, "a", 1), (2, "B", 2)]


async def test_a_postgres_password_never_shows_in_the_plugins_messages() -> None:
    url = "postgresql://writer:s3cret@127.0.0.1:1/none?connect_timeout=2"
    with pytest.raises(PluginFailed) as raised:
        await upsert_into(url, [{"id": 1}], create=True)
    assert "s3cret" not in raised.value.message
    assert "writer:***@127.0.0.1:1" in raised.value.message


async def test_dbscan_reads_an_attached_postgres_database(tmp_path: Path) -> None:
    async with postgres_server(tmp_path) as server:
        with psycopg.connect(server.url) as connection:
            connection.execute("create table orders (id int primary key, total numeric(8,2))")
            connection.execute("insert into orders values (1, 9.50), (2, 20.00), (3, 4.25)")
        config = {
            "query": "SELECT id, total FROM pg.orders WHERE total > ? ORDER BY id",
            "parameters": [5],
            "attach": {"pg": server.url},
            "function": "m.f",
            "rows": "tuples",
        }
        batches = await run_stream(DbscanBuilder(), config)
    [[call]] = batches
    assert decode_args(call.args)[0] == [[[1, "9.50"], [2, "20.00"]]]
