"""A task IO scope's PostgreSQL backend against a real server."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import psycopg
import pytest
import trio

from blockx.io import IOScopeError, IOSystem
from tests.e2e.postgres_server import postgres_server


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
