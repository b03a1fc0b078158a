"""The PostgreSQL helper itself: a fresh server answers, and keeps a committed row across a restart.

psycopg's blocking calls run in a worker thread; every test runs under `fail_after`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import psycopg
import pytest
import trio

from tests.e2e.postgres_server import postgres_server

FAIL_AFTER_S = 60


def query(url: str, statement: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(url, connect_timeout=5) as connection:
        return connection.execute(statement).fetchall()


def commit(url: str, *statements: str) -> None:
    """Run `statements` in one transaction and commit it."""
    with psycopg.connect(url, connect_timeout=5) as connection:
        for statement in statements:
            connection.execute(statement)
        connection.commit()


async def test_server_accepts_a_connection_and_a_query(tmp_path: Path) -> None:
    with trio.fail_after(FAIL_AFTER_S):
        async with postgres_server(tmp_path) as pg:
            assert pg.url == f"postgresql://{pg.user}@127.0.0.1:{pg.port}/{pg.dbname}"
            rows = await trio.to_thread.run_sync(query, pg.url, "select 1")
            postmaster = pg.postmaster_pid()
    assert rows == [(1,)]
    assert postmaster is not None
    assert not Path(f"/proc/{postmaster}").exists(), "the server outlived its context"


async def test_committed_row_survives_a_restart(tmp_path: Path) -> None:
    with trio.fail_after(FAIL_AFTER_S):
        async with postgres_server(tmp_path) as pg:
            await trio.to_thread.run_sync(
                commit,
                pg.url,
                "create table kept (value text)",
                "insert into kept values ('before the restart')",
            )
            await pg.stop()
            with pytest.raises(psycopg.OperationalError):
                await trio.to_thread.run_sync(query, pg.url, "select 1")
            await pg.start()
            rows = await trio.to_thread.run_sync(query, pg.url, "select value from kept")
    assert rows == [("before the restart",)]
