"""A real PostgreSQL (Debian's `postgresql` package) for e2e tests.

`postgres_server(tmp_path)` initialises a fresh cluster (trust authentication,
superuser named after the OS user the server runs as), starts `postgres` on
127.0.0.1 on a free port, waits until it accepts connections, creates the
database `DATABASE` and stops the server on exit. `PostgresServer.stop()` and
`start()` stop and restart the same cluster on the same port (what a restart
test needs). fsync stays on: tests check durability.

PostgreSQL refuses to run as root, and CI runs the tests as root: then initdb
and postgres run as Debian's `postgres` system user (runuser, else setpriv,
else su). pytest's tmp_path is private to root (0700), so the cluster then
lives in a directory of its own under the system temp dir, owned by that user
and removed on exit. The server log is always `tmp_path / "postgres.log"`,
opened by the test process itself, so the test can read it whoever the server
runs as.
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import queue
import re
import shlex
import shutil
import signal
import subprocess
import tempfile
import threading
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import IO

import attrs
import psycopg
import trio
from psycopg import sql

from tests.e2e.serve_process import free_port

START_TIMEOUT_S = 30
STOP_GRACE_S = 10
READY_POLL_S = 0.05
"""The one place this helper sleeps for real: polling a starting server with pg_isready."""

DEBIAN_BINARIES = "/usr/lib/postgresql/*/bin"
SERVER_USER = "postgres"
"""Debian's package creates this system user; the server runs as it when the tests run as root."""
DATABASE = "blockx_test"
SOCKET_PATH_MAX = 107
"""A Unix socket path holds 108 bytes, the terminating NUL included."""
SBIN_PATH = ("/usr/sbin", "/sbin", "/usr/bin", "/bin")
"""runuser lives in sbin, which a test's PATH may lack."""


@attrs.frozen
class PostgresBinaries:
    initdb: Path
    postgres: Path
    pg_isready: Path


def _version_key(bin_dir: Path) -> tuple[int, ...]:
    """(15,) for /usr/lib/postgresql/15/bin, (9, 6) for .../9.6/bin; () if not a version."""
    name = bin_dir.parent.name
    if not re.fullmatch(r"\d+(\.\d+)*", name):
        return ()
    return tuple(int(part) for part in name.split("."))


def postgres_binaries() -> PostgresBinaries:
    """initdb, postgres and pg_isready of the highest Debian version installed, else from PATH.

    A missing PostgreSQL fails the tests that need it, never skips them: CI installs it.
    """
    debian = [Path(found).parent for found in glob.glob(f"{DEBIAN_BINARIES}/postgres")]
    bin_dir: Path | None = max(debian, key=_version_key, default=None)
    if bin_dir is None and (initdb := shutil.which("initdb")) is not None:
        bin_dir = Path(initdb).resolve().parent
    found: dict[str, Path] = {}
    for name in ("initdb", "postgres", "pg_isready"):
        if bin_dir is not None and (bin_dir / name).is_file():
            found[name] = bin_dir / name
        elif (on_path := shutil.which(name)) is not None:
            found[name] = Path(on_path)
    missing = sorted({"initdb", "postgres", "pg_isready"} - found.keys())
    if missing:
        raise AssertionError(
            f"PostgreSQL binaries not found: {', '.join(missing)} (looked in "
            f"{DEBIAN_BINARIES} and on PATH); install Debian's `postgresql` package, "
            "as .ci/run does"
        )
    return PostgresBinaries(**found)


def as_user(command: list[str], user: str | None) -> list[str]:
    """`command` run as the system `user`, or as it is when `user` is None."""
    if user is None:
        return command
    search = os.pathsep.join([os.environ.get("PATH", ""), *SBIN_PATH])
    if (runuser := shutil.which("runuser", path=search)) is not None:
        return [runuser, "-u", user, "--", *command]
    if (setpriv := shutil.which("setpriv", path=search)) is not None:
        account = pwd.getpwnam(user)
        return [
            setpriv,
            f"--reuid={account.pw_uid}",
            f"--regid={account.pw_gid}",
            "--init-groups",
            "--",
            *command,
        ]
    if (su := shutil.which("su", path=search)) is not None:
        return [su, "-s", "/bin/sh", "-c", f"exec {shlex.join(command)}", user]
    raise AssertionError(f"cannot run PostgreSQL as {user!r}: none of runuser, setpriv, su found")


def descendants(pid: int) -> list[int]:
    """Every process below `pid`, from /proc.

    Not a process group: PostgreSQL's children start sessions of their own.
    """
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            # The second field, the command, may itself hold spaces and parentheses.
            parent = int(stat.read_text().rpartition(")")[2].split()[1])
            children.setdefault(parent, []).append(int(stat.parent.name))
    found: list[int] = []
    todo = [pid]
    while todo:
        below = children.get(todo.pop(), [])
        found += below
        todo += below
    return found


def _kill(pids: list[int]) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


@attrs.define
class PostgresServer:
    binaries: PostgresBinaries
    data_dir: Path
    socket_dir: Path
    log_path: Path
    port: int
    user: str
    """The superuser, named after the OS user the server runs as."""
    run_as: str | None
    """The system user initdb and postgres run as; None: as this process."""
    dbname: str = DATABASE
    process: trio.Process | None = None
    """postgres, or the runuser/setpriv/su that runs it."""
    _log_file: IO[bytes] | None = None

    @property
    def url(self) -> str:
        """A libpq URL of the test database (trust authentication: no password)."""
        return f"postgresql://{self.user}@127.0.0.1:{self.port}/{self.dbname}"

    @property
    def admin_url(self) -> str:
        """The same server's `postgres` maintenance database."""
        return f"postgresql://{self.user}@127.0.0.1:{self.port}/postgres"

    def log_tail(self) -> str:
        return self.log_path.read_text(errors="replace")[-4000:]

    def command(self) -> list[str]:
        return as_user(
            [
                str(self.binaries.postgres),
                "-D",
                str(self.data_dir),
                "-p",
                str(self.port),
                "-c",
                "listen_addresses=127.0.0.1",
                "-c",
                f"unix_socket_directories={self.socket_dir}",
                "-c",
                "max_connections=50",
                "-c",
                "shared_buffers=32MB",
                "-c",
                "log_line_prefix=%m [%p] ",
                # fsync, synchronous_commit and full_page_writes keep their
                # (durable) defaults on purpose.
            ],
            self.run_as,
        )

    async def initdb(self) -> None:
        """Create the cluster in `data_dir`, which must not exist yet."""
        command = as_user(
            [
                str(self.binaries.initdb),
                "-D",
                str(self.data_dir),
                "--auth=trust",
                f"--username={self.user}",
                "--encoding=UTF8",
                "--locale=C",
                # Only skips flushing the fresh cluster's files to disk;
                # the server itself runs with fsync on.
                "--no-sync",
            ],
            self.run_as,
        )
        with self.log_path.open("ab") as log:
            result = await trio.run_process(
                command,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                cwd=self.data_dir.parent,
                check=False,
            )
        if result.returncode != 0:
            raise AssertionError(f"initdb failed ({result.returncode}):\n{self.log_tail()}")

    async def start(self) -> None:
        """Start the server and return once it accepts connections."""
        assert self.process is None, "postgres already runs"
        self._log_file = self.log_path.open("ab")
        self.process = await trio.lowlevel.open_process(
            self.command(),
            stdin=subprocess.DEVNULL,
            stdout=self._log_file,
            stderr=self._log_file,
            cwd=self.data_dir.parent,
        )
        with trio.move_on_after(START_TIMEOUT_S):
            while self.process.returncode is None:
                if await self._ready() and self.process.returncode is None:
                    return
                await trio.sleep(READY_POLL_S)
        await self.stop()
        raise AssertionError("postgres did not accept connections:\n" + self.log_tail())

    async def stop(self) -> None:
        """Fast shutdown (SIGINT), then SIGKILL to every process of it after a grace period.

        Waits for the exit. The signal goes to the postmaster itself, not to
        runuser, which would turn it into a SIGTERM (a smart shutdown that
        waits for clients to disconnect).
        """
        process, self.process = self.process, None
        if process is not None:
            with trio.CancelScope(shield=True):
                postmaster = self._postmaster_pid(process)
                if process.returncode is None and postmaster is not None:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(postmaster, signal.SIGINT)
                    with trio.move_on_after(STOP_GRACE_S):
                        await process.wait()
                if process.returncode is None:
                    # Below a runuser, the postmaster and its children only, so
                    # that runuser still reaps the postmaster: a zombie keeps its
                    # pid in use, and a restart takes the stale postmaster.pid
                    # for a running server.
                    below = descendants(process.pid)
                    _kill([*below, process.pid] if self.run_as is None else below)
                    with trio.move_on_after(STOP_GRACE_S):
                        await process.wait()
                if process.returncode is None:
                    _kill([process.pid])
                    await process.wait()
        if self._log_file is not None:
            self._log_file.close()
            self._log_file = None

    def postmaster_pid(self) -> int | None:
        """The running postmaster's pid; None when stopped or before it wrote postmaster.pid."""
        return None if self.process is None else self._postmaster_pid(self.process)

    def _postmaster_pid(self, process: trio.Process) -> int | None:
        """The pid in postmaster.pid if it is `process` or one below it.

        A pid left in the file by a killed server is not ours.
        """
        try:
            pid = int(self.data_dir.joinpath("postmaster.pid").read_text().split("\n", 1)[0])
        except (OSError, ValueError):
            return None
        return pid if pid == process.pid or pid in descendants(process.pid) else None

    async def _ready(self) -> bool:
        result = await trio.run_process(
            [
                str(self.binaries.pg_isready),
                "--quiet",
                "--host=127.0.0.1",
                f"--port={self.port}",
                f"--username={self.user}",
                "--dbname=postgres",
                "--timeout=2",
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            check=False,
        )
        return result.returncode == 0


def _socket_fits(socket_dir: Path) -> bool:
    return len(os.fsencode(socket_dir / ".s.PGSQL.65535")) <= SOCKET_PATH_MAX


@contextlib.contextmanager
def _cluster_dir(tmp_path: Path, run_as: str | None) -> Iterator[Path]:
    """A directory the server's user owns, for `data` (made by initdb) and `socket`.

    `tmp_path / "postgres"` when the server runs as this process; otherwise
    (or when a socket path there would be too long) a directory of its own
    under the system temp dir, removed on exit.
    """
    kept = tmp_path / "postgres"
    if run_as is None and _socket_fits(kept / "socket"):
        (kept / "socket").mkdir(parents=True)
        yield kept
        return
    base = Path(tempfile.mkdtemp(prefix="blockx-pg-"))
    try:
        (base / "socket").mkdir()
        if run_as is not None:
            try:
                account = pwd.getpwnam(run_as)
            except KeyError:
                raise AssertionError(
                    f"no system user {run_as!r} to run PostgreSQL as (root cannot); "
                    "Debian's `postgresql` package creates it"
                ) from None
            for path in (base, base / "socket"):
                os.chown(path, account.pw_uid, account.pw_gid)
        yield base
    finally:
        shutil.rmtree(base, ignore_errors=True)


def create_database(admin_url: str, name: str) -> None:
    with psycopg.connect(admin_url, autocommit=True, connect_timeout=10) as connection:
        connection.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))


@asynccontextmanager
async def postgres_server(tmp_path: Path) -> AsyncIterator[PostgresServer]:
    """A fresh PostgreSQL cluster with an empty database `DATABASE`; stopped on exit."""
    binaries = postgres_binaries()
    run_as = SERVER_USER if os.geteuid() == 0 else None
    user = run_as or pwd.getpwuid(os.geteuid()).pw_name
    tmp_path.mkdir(parents=True, exist_ok=True)
    with _cluster_dir(tmp_path, run_as) as base:
        server = PostgresServer(
            binaries=binaries,
            data_dir=base / "data",
            socket_dir=base / "socket",
            log_path=tmp_path / "postgres.log",
            port=free_port(),
            user=user,
            run_as=run_as,
        )
        await server.initdb()
        await server.start()
        try:
            await trio.to_thread.run_sync(create_database, server.admin_url, server.dbname)
            yield server
        finally:
            await server.stop()


@contextlib.contextmanager
def postgres_in_background(tmp_path: Path) -> Iterator[PostgresServer]:
    """`postgres_server` held open by a Trio run in a thread of its own.

    For a session-scoped (synchronous) fixture: one server for many tests,
    each of which makes a database of its own with `create_database`.
    """
    handed: queue.Queue[tuple[PostgresServer, trio.Event, trio.lowlevel.TrioToken] | BaseException]
    handed = queue.Queue()

    async def hold() -> None:
        stop = trio.Event()
        async with postgres_server(tmp_path) as server:
            handed.put((server, stop, trio.lowlevel.current_trio_token()))
            await stop.wait()

    def run() -> None:
        try:
            trio.run(hold)
        except BaseException as error:  # handed to the test thread, which raises it
            handed.put(error)

    thread = threading.Thread(target=run, name="postgres", daemon=True)
    thread.start()
    item = handed.get(timeout=START_TIMEOUT_S * 2)
    if isinstance(item, BaseException):
        raise AssertionError(f"postgres did not start: {item!r}") from item
    server, stop, token = item
    try:
        yield server
    finally:
        trio.from_thread.run_sync(stop.set, trio_token=token)
        thread.join(timeout=STOP_GRACE_S * 3)
        assert not thread.is_alive(), "postgres did not stop"
