"""What every test layer shares: Hypothesis profiles and the hub's databases.

`dev` keeps local runs short; `ci` runs ten times the examples and prints the
blob that reproduces a failure. HYPOTHESIS_PROFILE names the profile; without
it, CI=true (any value but "", "0" or "false") selects `ci`, else `dev`.

`hub_url` is a fresh hub database, once a SQLite file and once a database of
its own on one real PostgreSQL that the first test needing it starts.
`hub_tls` is how a hub is reached: once in plain text (HTTP and WS), once over
TLS (HTTPS and WSS) with certificates of a fresh test CA.
"""

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import settings

from tests.adapters.certificates import Pki, make_pki
from tests.e2e.postgres_server import PostgresServer, create_database, postgres_in_background

# Hypothesis loads its own derandomized "ci" profile by itself whenever a CI
# variable is set; basing both profiles on "default" keeps them independent of
# that, so CI runs stay randomized.
_BASE = settings.get_profile("default")
settings.register_profile("dev", _BASE, max_examples=100, stateful_step_count=50, deadline=None)
settings.register_profile(
    "ci", _BASE, max_examples=1000, stateful_step_count=60, deadline=None, print_blob=True
)


def _profile_name() -> str:
    if explicit := os.environ.get("HYPOTHESIS_PROFILE"):
        return explicit
    on_ci = os.environ.get("CI", "").lower() not in {"", "0", "false"}
    return "ci" if on_ci else "dev"


settings.load_profile(_profile_name())


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


@pytest.fixture(params=["ws", "wss"])
def hub_tls(request: pytest.FixtureRequest, tmp_path: Path) -> Pki | None:
    """None for a hub in plain text (HTTP and WS); for one serving HTTPS and WSS, the
    certificates: a fresh CA, and the hub's certificate for 127.0.0.1 it signed."""
    return make_pki(tmp_path / "pki") if request.param == "wss" else None
