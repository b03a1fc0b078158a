"""Task IO scopes: the connections one task holds, over worker-wide backends with admission.

`IOSystem` is the worker's one IO subsystem: the backends it can reach
(`BACKENDS`: SQLite and DuckDB files, PostgreSQL by URL), how many connections
each may have open at once (its admission), and the scopes of live tasks. The
slot-table actor opens a task's scope when it activates the task (a refusal
fails the task `IO_SCOPE_FAILED`) and closes it when the task converges, on
every path. Builders and writer plugins get the scope in their requests and
connect through it (`TaskIOScope.connect`): a connection waits for its
backend's admission, is opened on a worker thread (the drivers block), is
shared by the task's later uses of the same target, and is closed with the
scope. The connection's own calls are the caller's to move off the Trio
thread (`trio.to_thread.run_sync`), under the phase IO timeout.
"""

from __future__ import annotations

import logging
import os
import threading
import urllib.parse
from collections.abc import Callable, Mapping
from typing import Any, Final, Protocol

import attrs
import trio

logger = logging.getLogger("blockx.io")


class Connection(Protocol):
    """What a backend's driver returns: a DB-API style connection."""

    def close(self) -> None: ...


Connector = Callable[[str], Connection]
"""Opens a connection to a target (a file path or a URL); blocking, run on a thread."""


def _sqlite(target: str) -> Connection:
    import sqlite3  # noqa: PLC0415 - only a worker whose tasks use SQLite loads it

    # One transaction per `with connection:`; used from worker threads, one at a time.
    return sqlite3.connect(target, check_same_thread=False)


def _duckdb(target: str) -> Connection:
    import duckdb  # noqa: PLC0415 - heavy: loaded by the first task that scans or writes

    connection: Connection = duckdb.connect(target)
    return connection


def _postgres(target: str) -> Connection:
    import psycopg  # noqa: PLC0415 - only a worker whose tasks use PostgreSQL loads it

    connection: Connection = psycopg.connect(target)
    return connection


BACKENDS: Final[Mapping[str, Connector]] = {
    "sqlite": _sqlite,
    "duckdb": _duckdb,
    "postgres": _postgres,
}
"""Every backend a scope can connect to, by name: the target is a file path for sqlite and
duckdb (":memory:" for a private in-memory database), a URL for postgres."""


def shown_target(target: str) -> str:
    """`target` as a message may show it: a URL's password replaced by ***."""
    if "://" not in target:
        return target
    parts = urllib.parse.urlsplit(target)
    if parts.password is None:
        return target
    netloc = parts.netloc.rpartition("@")[2]
    return urllib.parse.urlunsplit(parts._replace(netloc=f"{parts.username}:***@{netloc}"))


class IOScopeError(Exception):
    """A scope cannot be opened, or cannot connect; the message names why."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


@attrs.define(eq=False)
class _Open:
    connection: Connection
    token: object
    """What holds the backend's admission for this connection."""


class TaskIOScope:
    """The connections of one task. Made by `IOSystem.open_scope`."""

    def __init__(self, system: IOSystem, task_id: str) -> None:
        self.task_id = task_id
        self._system = system
        self._open: dict[tuple[str, str], _Open] = {}
        self._connecting: dict[tuple[str, str], trio.Event] = {}
        self.closed = False
        self.all_closed = trio.Event()
        """Set once the scope is closed and every connection it opened is closed."""

    @property
    def connections(self) -> int:
        return len(self._open)

    @property
    def table_database(self) -> str:
        """The worker's default database for table_upserts (`io.tableDatabase`; "" if none)."""
        return self._system.table_database

    def bundle_path(self, path: str) -> str:
        """Where the bundle `path` of a task is: under `io.bundleRoot` when it is set (an
        absolute path must be inside it; `IOScopeError` for a path that leaves it), else
        `path` itself."""
        root = self._system.bundle_root
        if not root:
            return path
        base = os.path.realpath(root)
        resolved = os.path.realpath(os.path.join(base, path))
        if os.path.commonpath((base, resolved)) != base or resolved == base:
            raise IOScopeError(f"bundle path {path!r} is not inside io.bundleRoot {root!r}")
        return resolved

    async def connect(self, backend: str, target: str) -> Any:
        """The task's connection to `target` on `backend`, opened on first use (waiting for
        the backend's admission) and shared by the task's later uses."""
        key = (backend, target)
        while True:
            if self._refuses():
                raise IOScopeError(f"task {self.task_id}: its IO scope is closed")
            found = self._open.get(key)
            if found is not None:
                return found.connection
            pending = self._connecting.get(key)
            if pending is None:
                break
            await pending.wait()  # another phase of the task is opening it: share it
        connect = self._system.connector(backend)
        limiter = self._system.admission(backend)
        token = object()
        done = trio.Event()
        self._connecting[key] = done
        try:
            await limiter.acquire_on_behalf_of(token)
            try:
                connection = await _open_on_thread(connect, target)
            except Exception as error:  # each driver has its own error classes
                limiter.release_on_behalf_of(token)
                shown = shown_target(target)
                raise IOScopeError(f"cannot connect to {backend} {shown!r}: {error}") from error
            except BaseException:
                limiter.release_on_behalf_of(token)
                raise
            if self._refuses():  # the task ended while it connected
                with trio.CancelScope(shield=True):
                    await _close_on_thread([connection])
                limiter.release_on_behalf_of(token)
                raise IOScopeError(f"task {self.task_id}: its IO scope is closed")
            self._open[key] = _Open(connection=connection, token=token)
            return connection
        finally:
            del self._connecting[key]
            done.set()

    def _refuses(self) -> bool:
        return self.closed

    def close(self) -> bool:
        """Refuse new connections. True if the scope held none (it is closed now); else
        `aclose` must run to close them."""
        self.closed = True
        if self._open or self._connecting:
            return False
        self._system.forget(self)
        self.all_closed.set()
        return True

    async def aclose(self) -> None:
        """Close the scope and every connection it opened (on a worker thread)."""
        self.closed = True
        while self._connecting:  # a connect in flight closes what it opens itself
            await next(iter(self._connecting.values())).wait()
        opened, self._open = list(self._open.items()), {}
        try:
            with trio.CancelScope(shield=True):
                await _close_on_thread([entry.connection for _, entry in opened])
        finally:
            for (backend, _), entry in opened:
                self._system.admission(backend).release_on_behalf_of(entry.token)
            self._system.forget(self)
            self.all_closed.set()


class IOSystem:
    """The worker's backends, their admission (`limits`: open connections per backend) and
    the scopes of live tasks."""

    def __init__(
        self,
        limits: Mapping[str, int],
        connectors: Mapping[str, Connector] = BACKENDS,
        *,
        table_database: str = "",
        bundle_root: str = "",
    ) -> None:
        unknown = sorted(set(limits) - set(connectors))
        if unknown:
            raise ValueError(f"no backend named {', '.join(unknown)}")
        self.table_database = table_database
        """`io.tableDatabase`: where table_upserts writes when a task names no database."""
        self.bundle_root = bundle_root
        """`io.bundleRoot`: the directory every bundle path is under ("" for none)."""
        self._connectors = connectors
        self._admission = {name: trio.CapacityLimiter(limits[name]) for name in connectors}
        self._scopes: dict[str, TaskIOScope] = {}
        self._closed = False

    @property
    def open_scopes(self) -> int:
        return len(self._scopes)

    def admission(self, backend: str) -> trio.CapacityLimiter:
        return self._admission[backend]

    def connector(self, backend: str) -> Connector:
        found = self._connectors.get(backend)
        if found is None:
            known = ", ".join(self._connectors)
            raise IOScopeError(f"unknown IO backend {backend!r}; known backends: {known}")
        return found

    def open_scope(self, task_id: str) -> TaskIOScope:
        """A new scope for `task_id`; `IOScopeError` once the subsystem is closed."""
        if self._closed:
            raise IOScopeError("the worker's IO subsystem is closed (the worker is stopping)")
        if task_id in self._scopes:
            raise IOScopeError(f"task {task_id} already has an open IO scope")
        scope = TaskIOScope(self, task_id)
        self._scopes[task_id] = scope
        return scope

    def forget(self, scope: TaskIOScope) -> None:
        if self._scopes.get(scope.task_id) is scope:
            del self._scopes[scope.task_id]

    async def aclose(self) -> None:
        """Refuse new scopes and close every scope still open."""
        self._closed = True
        for scope in list(self._scopes.values()):
            await scope.aclose()


async def _open_on_thread(connect: Connector, target: str) -> Connection:
    """`connect(target)` on a worker thread. Cancelled, the caller goes at once, and a
    connection the thread opens anyway is closed, never left open."""
    lock = threading.Lock()
    opened: list[Connection] = []
    abandoned = False

    def open_it() -> Connection:
        connection = connect(target)
        with lock:
            if abandoned:
                _close_quietly(connection)
            else:
                opened.append(connection)
        return connection

    try:
        return await trio.to_thread.run_sync(open_it, abandon_on_cancel=True)
    except trio.Cancelled:
        with lock:
            abandoned = True
            late = list(opened)  # opened, but its result came too late to be taken
        for connection in late:
            threading.Thread(target=_close_quietly, args=(connection,), daemon=True).start()
        raise


def _close_quietly(connection: Connection) -> None:
    try:
        connection.close()
    except Exception:  # closing what nobody uses: nothing more to do about it
        logger.warning("an abandoned IO connection failed to close", exc_info=True)


async def _close_on_thread(connections: list[Connection]) -> None:
    def close_all() -> None:
        for connection in connections:
            try:
                connection.close()
            except Exception:  # one that fails to close must not keep the others open
                logger.warning("an IO connection failed to close", exc_info=True)

    if connections:
        await trio.to_thread.run_sync(close_all)
