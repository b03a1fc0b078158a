"""Task IO scopes over real SQLite and DuckDB files: sharing, admission, closing, refusals."""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path

import pytest
import trio
import trio.testing

from blockx.calls import encode_value
from blockx.io import IOScopeError, IOSystem, shown_target
from blockx.phases.plugins import PluginRequest, TableUpsertsPlugin
from blockx.slots import ResultHandler

LIMITS = {"sqlite": 2, "duckdb": 1, "postgres": 1}


def query_one(connection: sqlite3.Connection, sql: str) -> object:
    return connection.execute(sql).fetchone()[0]


async def test_a_task_shares_one_connection_per_target_and_the_close_ends_them(
    tmp_path: Path,
) -> None:
    system = IOSystem(LIMITS)
    scope = system.open_scope("t1")
    first = await scope.connect("sqlite", str(tmp_path / "a.db"))
    again = await scope.connect("sqlite", str(tmp_path / "a.db"))
    other = await scope.connect("sqlite", str(tmp_path / "b.db"))
    assert first is again
    assert other is not first
    assert query_one(first, "select 41 + 1") == 42
    assert (scope.connections, system.open_scopes) == (2, 1)

    assert scope.close() is False  # it holds connections: they need `aclose`
    await scope.aclose()
    assert scope.all_closed.is_set()
    assert system.open_scopes == 0
    for connection in (first, other):
        with pytest.raises(sqlite3.ProgrammingError, match="closed"):
            connection.execute("select 1")
    with pytest.raises(IOScopeError, match="t1: its IO scope is closed"):
        await scope.connect("sqlite", str(tmp_path / "a.db"))


async def test_a_scope_that_never_connected_closes_at_once() -> None:
    system = IOSystem(LIMITS)
    scope = system.open_scope("t1")
    assert scope.close() is True
    assert scope.all_closed.is_set()
    assert system.open_scopes == 0


async def test_a_connection_waits_for_its_backends_admission(tmp_path: Path) -> None:
    system = IOSystem({**LIMITS, "sqlite": 1})
    holder = system.open_scope("holder")
    await holder.connect("sqlite", str(tmp_path / "a.db"))
    waiter = system.open_scope("waiter")
    got: list[object] = []

    async def wait_for_one() -> None:
        got.append(await waiter.connect("sqlite", str(tmp_path / "b.db")))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(wait_for_one)
        await trio.testing.wait_all_tasks_blocked()
        assert got == []  # the one connection SQLite may have is taken
        assert system.admission("sqlite").borrowed_tokens == 1
        await holder.aclose()
    assert len(got) == 1
    await waiter.aclose()
    assert system.admission("sqlite").borrowed_tokens == 0


async def test_a_failed_connect_names_the_backend_and_target_and_frees_its_admission(
    tmp_path: Path,
) -> None:
    system = IOSystem({**LIMITS, "sqlite": 1})
    scope = system.open_scope("t1")
    missing = str(tmp_path / "no" / "such" / "dir" / "x.db")
    with pytest.raises(IOScopeError) as raised:
        await scope.connect("sqlite", missing)
    assert raised.value.message.startswith(f"cannot connect to sqlite {missing!r}: ")
    assert system.admission("sqlite").borrowed_tokens == 0
    assert scope.close() is True


async def test_an_unknown_backend_is_refused_naming_the_known_ones() -> None:
    scope = IOSystem(LIMITS).open_scope("t1")
    with pytest.raises(IOScopeError) as raised:
        await scope.connect("mysql", "db")
    assert raised.value.message == (
        "unknown IO backend 'mysql'; known backends: sqlite, duckdb, postgres"
    )


def test_limits_for_an_unknown_backend_are_refused() -> None:
    with pytest.raises(ValueError, match="no backend named mysql"):
        IOSystem({"mysql": 1})


async def test_duckdb_connects_to_a_file_through_the_scope(tmp_path: Path) -> None:
    scope = IOSystem(LIMITS).open_scope("t1")
    connection = await scope.connect("duckdb", str(tmp_path / "d.duckdb"))
    rows = await trio.to_thread.run_sync(
        lambda: connection.execute("select sum(range) from range(5)").fetchall()
    )
    assert rows == [(10,)]
    await scope.aclose()


async def test_a_closed_system_opens_no_scope_and_closes_those_left(tmp_path: Path) -> None:
    system = IOSystem(LIMITS)
    left = system.open_scope("left")
    connection = await left.connect("sqlite", str(tmp_path / "a.db"))
    with pytest.raises(IOScopeError, match="already has an open IO scope"):
        system.open_scope("left")
    await system.aclose()
    assert left.all_closed.is_set()
    with pytest.raises(sqlite3.ProgrammingError):
        connection.execute("select 1")
    with pytest.raises(IOScopeError) as raised:
        system.open_scope("late")
    assert raised.value.message == ("the worker's IO subsystem is closed (the worker is stopping)")


async def test_a_connect_cancelled_while_opening_closes_what_opens_late() -> None:
    release = threading.Event()
    closed = threading.Event()

    class Late:
        def close(self) -> None:
            closed.set()

    def slow(target: str) -> Late:
        release.wait(10)
        return Late()

    system = IOSystem({"slow": 1}, connectors={"slow": slow})
    scope = system.open_scope("t1")
    async with trio.open_nursery() as nursery:
        nursery.start_soon(scope.connect, "slow", "x")
        await trio.testing.wait_all_tasks_blocked()  # on the thread, inside `slow`
        nursery.cancel_scope.cancel()
    assert system.admission("slow").borrowed_tokens == 0
    assert scope.close() is True  # the late connection was never the scope's
    release.set()
    assert await trio.to_thread.run_sync(closed.wait, 10)


@pytest.mark.parametrize(
    ("target", "shown"),
    [
        ("postgresql://writer:s3cret@db:5432/out", "postgresql://writer:***@db:5432/out"),
        ("postgresql://writer@db/out", "postgresql://writer@db/out"),
        ("/var/data/out.db", "/var/data/out.db"),
        (":memory:", ":memory:"),
    ],
)
def test_a_target_is_shown_without_its_password(target: str, shown: str) -> None:
    assert shown_target(target) == shown


def test_bundle_paths_stay_under_the_bundle_root(tmp_path: Path) -> None:
    root = tmp_path / "bundles"
    root.mkdir()
    scope = IOSystem(LIMITS, bundle_root=str(root)).open_scope("t1")
    assert scope.bundle_path("daily/2026-12-04") == str(root / "daily" / "2026-12-04")
    assert scope.bundle_path(str(root / "b1")) == str(root / "b1")
    for outside in ("../elsewhere", "/etc", ".", "a/../../x"):
        with pytest.raises(IOScopeError) as raised:
            scope.bundle_path(outside)
        assert raised.value.message == (
            f"bundle path {outside!r} is not inside io.bundleRoot {str(root)!r}"
        )
    free = IOSystem(LIMITS).open_scope("t2")
    assert free.bundle_path("../anywhere") == "../anywhere"  # no root: as given


async def test_table_upserts_writes_to_the_worker_s_database_when_a_task_names_none(
    tmp_path: Path,
) -> None:
    database = tmp_path / "default.db"
    scope = IOSystem(LIMITS, table_database=str(database)).open_scope("t1")
    request = PluginRequest(
        task_id="t1",
        handler=ResultHandler(
            type="table_upserts", config_json='{"table": "t", "key": "id", "create": true}'
        ),
        outputs=(encode_value({"id": 1, "v": "x"}),),
        task_code_epoch="e1",
        io=scope,
    )
    try:
        result = await TableUpsertsPlugin().run(request)
    finally:
        await scope.aclose()
    assert result.detail == f"t in sqlite {database}"
    with sqlite3.connect(database) as connection:
        assert connection.execute("select * from t").fetchall() == [(1, "x")]
