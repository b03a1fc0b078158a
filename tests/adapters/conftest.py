"""Fixtures of the adapter tests: the hub's databases."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.postgres_server import PostgresServer, create_database, postgres_in_background


@pytest.fixture(scope="session")
def postgres(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PostgresServer]:
    """One real PostgreSQL on loopback for the whole run; each test makes its own database."""
    with postgres_in_background(tmp_path_factory.mktemp("postgres")) as server:
        yield server


@pytest.fixture
def postgres_url(postgres: PostgresServer) -> str:
    """A fresh, empty database of its own on `postgres`."""
    name = f"hub_{uuid.uuid4().hex[:16]}"
    create_database(postgres.admin_url, name)
    return f"postgresql://{postgres.user}@127.0.0.1:{postgres.port}/{name}"


@pytest.fixture(params=["sqlite", "postgresql"])
def hub_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A fresh, empty hub database: a SQLite file, or a PostgreSQL database (`postgres_url`)."""
    if request.param == "sqlite":
        return str(tmp_path / "hub.sqlite3")
    url: str = request.getfixturevalue("postgres_url")
    return url
