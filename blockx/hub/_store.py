"""The hub's durable state: a SQLite file by default, PostgreSQL by URL.

Owns the schema (and its migrations), the mapping between records and rows,
and transactions. Every call blocks (file or network IO). The hub's committer
hands a whole batch of operations to run in one transaction, committed with
one fsync. A SQLite batch runs on the hub's own thread (`run_batch_now`); a
PostgreSQL batch, or a SQLite one that must wait for another connection's
write lock, runs in a worker thread (`run_batch`). A transaction is a unit of
work (`Tx`): the rows a batch names are read in one query per table and its
changes kept and written together. On PostgreSQL the reads of a batch go in
one round trip and its writes with its commit in another (`_PgText`). Nothing
here decides anything: the rules do (`_rules`).

SQLite runs in WAL mode with `synchronous=FULL`, so a committed transaction
survives a crash of the process or the machine. With PostgreSQL several hub
processes share one database: the rows an operation reads are locked until
its batch commits (`FOR UPDATE`; claims skip rows another hub has locked).
"""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
import threading
from collections.abc import Callable, Collection, Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, Final, TypeVar

import attrs

from blockx.errors import BlockxError
from blockx.hub._model import (
    Attempt,
    AttemptState,
    Credential,
    HistoryEntry,
    Idempotency,
    Right,
    Task,
    TaskFilter,
    TaskState,
)
from blockx.hubwire import CONVERTER, Capability, Outcome

if TYPE_CHECKING:
    import psycopg

T = TypeVar("T")

BUSY_TIMEOUT_S: Final = 30.0
QUEUED_CHANNEL: Final = "blockx_hub_queued"
"""The PostgreSQL channel a commit that queued tasks notifies, with the time (epoch ms) the
first of them may be offered (`QueuedListener`)."""

_MIGRATIONS: Final[tuple[str, ...]] = (
    """
    CREATE TABLE queues (
        queue_id TEXT PRIMARY KEY,
        created_at_ms BIGINT NOT NULL
    );
    CREATE TABLE credentials (
        credential_id TEXT PRIMARY KEY,
        secret_hash TEXT NOT NULL,
        queue_id TEXT NOT NULL,
        rights TEXT NOT NULL,
        revoked SMALLINT NOT NULL,
        created_at_ms BIGINT NOT NULL
    );
    CREATE TABLE tasks (
        task_id TEXT PRIMARY KEY,
        queue_id TEXT NOT NULL,
        capability TEXT NOT NULL,
        handler TEXT NOT NULL,
        handler_version TEXT NOT NULL,
        payload_version TEXT NOT NULL,
        payload TEXT NOT NULL,
        idempotency TEXT NOT NULL,
        max_attempts INTEGER NOT NULL,
        attempt_timeout_ms BIGINT NOT NULL,
        created_at_ms BIGINT NOT NULL,
        deadline_at_ms BIGINT NOT NULL,
        state TEXT NOT NULL,
        available_at_ms BIGINT NOT NULL,
        epoch INTEGER NOT NULL,
        attempt_id TEXT NOT NULL,
        started_attempts INTEGER NOT NULL,
        uncertain SMALLINT NOT NULL,
        result TEXT,
        failure_code TEXT NOT NULL,
        failure_details TEXT NOT NULL,
        finished_at_ms BIGINT NOT NULL
    ){without_rowid};
    CREATE INDEX tasks_queued ON tasks (queue_id, capability, available_at_ms, created_at_ms)
        WHERE state = 'QUEUED';
    CREATE INDEX tasks_waiting ON tasks (deadline_at_ms) WHERE state = 'QUEUED';
    CREATE INDEX tasks_by_queue ON tasks (queue_id, created_at_ms);
    CREATE TABLE attempts (
        attempt_id TEXT PRIMARY KEY,
        task_id TEXT NOT NULL,
        epoch INTEGER NOT NULL,
        instance_id TEXT NOT NULL,
        state TEXT NOT NULL,
        offered_at_ms BIGINT NOT NULL,
        offer_deadline_ms BIGINT NOT NULL,
        started_at_ms BIGINT NOT NULL,
        lease_deadline_ms BIGINT NOT NULL,
        finished_at_ms BIGINT NOT NULL,
        due_at_ms BIGINT NOT NULL,
        outcome TEXT
    ){without_rowid};
    CREATE INDEX attempts_due ON attempts (due_at_ms) WHERE state IN ('OFFERED', 'RUNNING');
    CREATE INDEX attempts_of_task ON attempts (task_id, epoch);
    CREATE TABLE history (
        entry_id {serial},
        task_id TEXT NOT NULL,
        at_ms BIGINT NOT NULL,
        kind TEXT NOT NULL,
        attempt_id TEXT NOT NULL,
        detail TEXT NOT NULL
    );
    CREATE INDEX history_of_task ON history (task_id, entry_id);
    CREATE TABLE receipts (
        instance_id TEXT NOT NULL,
        message_id TEXT NOT NULL,
        digest TEXT NOT NULL,
        answer {blob} NOT NULL,
        at_ms BIGINT NOT NULL,
        PRIMARY KEY (instance_id, message_id)
    ){without_rowid};
    CREATE INDEX receipts_by_age ON receipts (at_ms);
    """,
    # A listing by state reads only the tasks in that state, not the whole queue.
    """
    CREATE INDEX IF NOT EXISTS tasks_by_state ON tasks (queue_id, state, created_at_ms);
    """,
    # An operator's answer kept under the request id its client chose: a repeat gets it.
    """
    CREATE TABLE IF NOT EXISTS operator_requests (
        request_id TEXT NOT NULL,
        action TEXT NOT NULL,
        target TEXT NOT NULL,
        status INTEGER NOT NULL,
        answer TEXT NOT NULL,
        at_ms BIGINT NOT NULL,
        PRIMARY KEY (request_id, action, target)
    ){without_rowid};
    CREATE INDEX IF NOT EXISTS operator_requests_by_age ON operator_requests (at_ms);
    """,
    # Priorities, submission order and concurrency keys. The queued tasks of one queue and
    # capability are read in offer order from one index; the live tasks of a key are
    # counted from another; a key's limit (the queue's for every key under '') is a row.
    """
    ALTER TABLE tasks ADD COLUMN priority INTEGER NOT NULL DEFAULT 5;
    ALTER TABLE tasks ADD COLUMN seq BIGINT NOT NULL DEFAULT 0;
    ALTER TABLE tasks ADD COLUMN concurrency_key TEXT NOT NULL DEFAULT '';
    UPDATE tasks SET seq = created_at_ms * 65536 WHERE state IN ('QUEUED', 'OFFERED', 'RUNNING');
    DROP INDEX tasks_queued;
    CREATE INDEX tasks_offer_order
        ON tasks (queue_id, capability, priority DESC, available_at_ms, seq)
        WHERE state = 'QUEUED';
    CREATE INDEX tasks_live_by_key ON tasks (queue_id, concurrency_key)
        WHERE state IN ('OFFERED', 'RUNNING') AND concurrency_key <> '';
    CREATE TABLE concurrency_limits (
        queue_id TEXT NOT NULL,
        concurrency_key TEXT NOT NULL,
        max_running INTEGER NOT NULL,
        PRIMARY KEY (queue_id, concurrency_key)
    );
    """,
    # An operator pauses a queue (it takes submissions and offers nothing); retention finds
    # the tasks that ended longest ago without reading the others.
    """
    ALTER TABLE queues ADD COLUMN paused SMALLINT NOT NULL DEFAULT 0;
    CREATE INDEX IF NOT EXISTS tasks_by_end ON tasks (finished_at_ms)
        WHERE finished_at_ms > 0 AND state <> 'NEEDS_REVIEW';
    """,
    # An attempt's renewals, counted, with the time of the last: a task's time line shows them.
    """
    ALTER TABLE attempts ADD COLUMN renewals INTEGER NOT NULL DEFAULT 0;
    ALTER TABLE attempts ADD COLUMN renewed_at_ms BIGINT NOT NULL DEFAULT 0;
    """,
)
"""Each entry takes the schema one version further; the applied count is kept in the database."""

_TASK_COLUMNS: Final = (
    "task_id, queue_id, capability, handler, handler_version, payload_version, payload, "
    "idempotency, max_attempts, attempt_timeout_ms, created_at_ms, deadline_at_ms, state, "
    "available_at_ms, epoch, attempt_id, started_attempts, uncertain, result, failure_code, "
    "failure_details, finished_at_ms, priority, seq, concurrency_key"
)
_ATTEMPT_COLUMNS: Final = (
    "attempt_id, task_id, epoch, instance_id, state, offered_at_ms, offer_deadline_ms, "
    "started_at_ms, lease_deadline_ms, finished_at_ms, due_at_ms, outcome, renewals, "
    "renewed_at_ms"
)
_SELECT_TASKS: Final = f"SELECT {_TASK_COLUMNS} FROM tasks"
_NO_SORTS: Final = "SET LOCAL enable_sort = off"
"""PostgreSQL, around a claim's read: statistics taken while few tasks were queued (a backlog
queued since the last ANALYZE) make the planner read a claim from a smaller index and sort
every queued task to claim eight (7.8 ms in a backlog of 20,000, against 0.03 ms in the
offer order's index). A claim is planned without sorts."""
_SORTS: Final = "SET LOCAL enable_sort = on"
_SELECT_ATTEMPTS: Final = f"SELECT {_ATTEMPT_COLUMNS} FROM attempts"
NEVER: Final = 2**62
"""`due_at_ms` of an attempt that has ended."""
_TASK_MARKS: Final = ", ".join("?" * len(_TASK_COLUMNS.split(", ")))
_INSERT_TASK: Final = f"INSERT INTO tasks ({_TASK_COLUMNS}) VALUES ({_TASK_MARKS})"
_INSERT_ATTEMPT: Final = (
    f"INSERT INTO attempts ({_ATTEMPT_COLUMNS}) "
    f"VALUES ({', '.join('?' * len(_ATTEMPT_COLUMNS.split(', ')))})"
)


def _update(table: str, columns: str, key: str, changes: tuple[str, ...]) -> tuple[str, list[int]]:
    """The UPDATE of `changes` by `key`, and where its parameters stand in a full row."""
    names = columns.split(", ")
    sets = ", ".join(f"{name} = ?" for name in changes)
    return f"UPDATE {table} SET {sets} WHERE {key} = ?", [names.index(n) for n in (*changes, key)]


_UPDATE_TASK, _TASK_UPDATE = _update(
    "tasks",
    _TASK_COLUMNS,
    "task_id",
    (
        "state",
        "available_at_ms",
        "epoch",
        "attempt_id",
        "started_attempts",
        "uncertain",
        "result",
        "failure_code",
        "failure_details",
        "finished_at_ms",
        "max_attempts",
        "deadline_at_ms",
    ),
)
_UPDATE_ATTEMPT, _ATTEMPT_UPDATE = _update(
    "attempts",
    _ATTEMPT_COLUMNS,
    "attempt_id",
    (
        "state",
        "started_at_ms",
        "lease_deadline_ms",
        "finished_at_ms",
        "due_at_ms",
        "outcome",
        "renewals",
        "renewed_at_ms",
    ),
)
"""What a task's or an attempt's life changes (an operator's retry, a task's budget and
deadline too); the rest of their rows never changes."""
_INSERT_NOTE: Final = (
    "INSERT INTO history (task_id, at_ms, kind, attempt_id, detail) VALUES (?, ?, ?, ?, ?)"
)
_INSERT_RECEIPT: Final = (
    "INSERT INTO receipts (instance_id, message_id, digest, answer, at_ms) VALUES (?, ?, ?, ?, ?)"
)
_TABLE_OF: Final = {
    _INSERT_TASK: "tasks",
    _UPDATE_TASK: "tasks",
    _INSERT_ATTEMPT: "attempts",
    _UPDATE_ATTEMPT: "attempts",
    _INSERT_RECEIPT: "receipts",
}
"""The table each kept write goes to (history notes are kept apart)."""
CHUNK: Final = 500
"""Keys per IN (...) query (SQLite allows 32,766 parameters; this keeps statements short)."""


def _chunks(keys: Sequence[T]) -> Iterator[Sequence[T]]:
    for start in range(0, len(keys), CHUNK):
        yield keys[start : start + CHUNK]


class StoreError(BlockxError):
    """The database could not be opened or used; `url` says which."""

    def __init__(self, *, url: str, reason: str) -> None:
        self.url = url
        self.reason = reason
        super().__init__(f"hub database {url}: {reason}")


@attrs.frozen(kw_only=True)
class Keys:
    """The rows an operation will look up by key: read for a whole batch in one round trip."""

    attempts: tuple[str, ...] = ()
    receipts: tuple[tuple[str, str], ...] = ()
    """(instance id, message id)."""
    credentials: tuple[str, ...] = ()
    queues: tuple[str, ...] = ()
    claims: tuple[tuple[str, str, int, int], ...] = ()
    """(queue id, capability key, room, now ms) of each claim the operation may make: the
    tasks the batch's claims of a queue and capability may take are read with the rest,
    and each claim takes from those (`Tx.offerable`)."""


@attrs.define
class _Pool:
    """QUEUED tasks of one queue and capability a claim read, locked for the transaction,
    that its later claims take from without reading again."""

    task_ids: list[str]
    complete: bool
    """The read found fewer than it asked for: the queue held no more then."""


class Tx:
    """The operations' view of one open transaction: a unit of work.

    Rows looked up by key (tasks, attempts, receipts, credentials, queues) are
    read once per transaction, `prefetch` reading a whole batch's at once, and
    kept; changes are kept too and written together (`execute_many` per
    statement) when the transaction ends, or before a query of their table so
    that every query sees them. On PostgreSQL every row read to be changed is
    locked until the commit.
    """

    def __init__(
        self,
        execute: Callable[[str, Sequence[object]], Any],
        execute_many: Callable[[str, list[tuple[object, ...]]], Any],
        *,
        locks: bool,
    ) -> None:
        self._execute = execute
        self._execute_many = execute_many
        self._locks = locks
        self._tasks: dict[str, Task | None] = {}
        self._attempts: dict[str, Attempt | None] = {}
        self._receipts: dict[tuple[str, str], tuple[str, bytes] | None] = {}
        self._queues: dict[str, bool | None] = {}
        """Whether each queue looked up is paused; None: there is no such queue."""
        self._credentials: dict[str, tuple[Credential, str] | None] = {}
        self._claims: dict[tuple[str, str], int] = {}
        """The room of the batch's claims, by queue and capability (`Keys.claims`)."""
        self._pools: dict[tuple[str, str], _Pool] = {}
        self._writes: dict[str, dict[object, tuple[object, ...]]] = {}
        """Rows to write, by statement, by key (a later change of a row replaces its earlier)."""
        self._notes: list[tuple[object, ...]] = []
        self._ended: set[str] = set()
        self.moved_tasks: list[tuple[Task | None, Task]] = []
        """Each task written, in order, beside what it was before (None: inserted now)."""
        self.moved_attempts: list[tuple[Attempt | None, Attempt]] = []
        """Each attempt written, in order, beside what it was before (None: inserted now,
        or not read first)."""
        self.queued_at_ms: int | None = None
        """When the first of the tasks queued (or queued again, or of a queue resumed: 0)
        here may be offered: with PostgreSQL, the commit tells every hub of the database
        (`QUEUED_CHANNEL`)."""

    def rows(
        self, sql: str, *params: object, reads: Collection[str] | None = None
    ) -> list[tuple[Any, ...]]:
        """The rows `sql` selects, once the changes kept for the tables it `reads` (all of
        them when not said) are written."""
        self.flush(reads)
        rows: list[tuple[Any, ...]] = self._execute(sql, params).fetchall()
        return rows

    def rows_of(
        self,
        queries: Sequence[tuple[str, Sequence[object]]],
        *,
        reads: Collection[str],
        unsorted: Sequence[tuple[str, Sequence[object]]] = (),
    ) -> list[list[tuple[Any, ...]]]:
        """The rows of each query, then of each `unsorted` one (claims: on PostgreSQL
        planned without sorts, `_NO_SORTS`), once the changes kept for the tables they
        `reads` are written: on PostgreSQL all are sent before any is waited for (one
        round trip)."""
        self.flush(reads)
        sent = [self._execute(sql, params) for sql, params in queries]
        if unsorted and self._locks:
            self._execute(_NO_SORTS, ())
        sent += [self._execute(sql, params) for sql, params in unsorted]
        if unsorted and self._locks:
            self._execute(_SORTS, ())
        return [cursor.fetchall() for cursor in sent]

    def run(self, sql: str, *params: object) -> int:
        """Run `sql` once every change kept is written; how many rows it changed."""
        self.flush()
        return int(self._execute(sql, params).rowcount)

    def send(self, sql: str, *params: object) -> None:
        """Run `sql` once every change kept is written, for its effect: on PostgreSQL it
        travels with the commit, nothing waits for it."""
        self.flush()
        self._execute(sql, params)

    def flush(self, tables: Collection[str] | None = None) -> None:
        """Write the changes kept so far (to `tables`, or to all)."""
        for sql in [sql for sql in self._writes if tables is None or _TABLE_OF[sql] in tables]:
            self._execute_many(sql, list(self._writes.pop(sql).values()))
        if self._notes and (tables is None or "history" in tables):
            notes, self._notes = self._notes, []
            self._execute_many(_INSERT_NOTE, notes)

    def _queued(self, task: Task) -> None:
        if task.state is TaskState.QUEUED:
            at_ms = task.available_at_ms
            self.queued_at_ms = min(at_ms, self.queued_at_ms or at_ms)
            pool = self._pools.get((task.queue_id, task.capability.key))
            if pool is not None and task.task_id not in pool.task_ids:
                pool.complete = False  # a claim short of tasks reads again

    def _write(self, sql: str, key: object, row: tuple[object, ...]) -> None:
        self._writes.setdefault(sql, {})[key] = row

    def _lock(self, sql: str, *, skip_locked: bool = False) -> str:
        if not self._locks:
            return sql
        return sql + (" FOR UPDATE SKIP LOCKED" if skip_locked else " FOR UPDATE")

    def prefetch(self, keys: Iterable[Keys]) -> None:
        """Read every row `keys` name (and the tasks of those attempts), and the queued tasks
        the batch's claims may take: all in one round trip."""
        keys = list(keys)
        claims: dict[tuple[str, str], tuple[int, int]] = {}
        for queue_id, capability, room, now_ms in (c for k in keys for c in k.claims):
            rooms, latest = claims.get((queue_id, capability), (0, now_ms))
            claims[(queue_id, capability)] = (rooms + room, max(latest, now_ms))
        self._claims.update((key, rooms) for key, (rooms, _) in claims.items())
        attempt_ids = sorted({a for k in keys for a in k.attempts if a not in self._attempts})
        receipt_keys = sorted({r for k in keys for r in k.receipts if r not in self._receipts})
        credential_ids = sorted({c for k in keys for c in k.credentials} - self._credentials.keys())
        queue_ids = sorted({q for k in keys for q in k.queues} - self._queues.keys())
        self._attempts.update(dict.fromkeys(attempt_ids))
        self._receipts.update(dict.fromkeys(receipt_keys))
        self._credentials.update(dict.fromkeys(credential_ids))
        self._queues.update(dict.fromkeys(queue_ids))
        reads: list[tuple[str, Sequence[object], Callable[[list[tuple[Any, ...]]], None]]] = []
        for chunk in _chunks(attempt_ids):
            marks = ", ".join("?" * len(chunk))
            named = f"SELECT task_id FROM attempts WHERE attempt_id IN ({marks})"
            # Locked in key order, as every hub locks them: two hubs never wait on each other.
            attempts = f"{_SELECT_ATTEMPTS} WHERE attempt_id IN ({marks}) ORDER BY attempt_id"
            tasks = f"{_SELECT_TASKS} WHERE task_id IN ({named}) ORDER BY task_id"
            reads.append((self._lock(attempts), chunk, self._found_attempts))
            reads.append((self._lock(tasks), chunk, self._found_tasks))
        for receipts in _chunks(receipt_keys):
            # One query for the keys of every instance, each key looked up whole.
            either = " OR ".join(["(instance_id = ? AND message_id = ?)"] * len(receipts))
            sql = f"SELECT instance_id, message_id, digest, answer FROM receipts WHERE {either}"
            reads.append((sql, [part for key in receipts for part in key], self._found_receipts))
        for chunk in _chunks(credential_ids):
            marks = ", ".join("?" * len(chunk))
            sql = f"SELECT {_CREDENTIAL_COLUMNS} FROM credentials WHERE credential_id IN ({marks})"
            reads.append((sql, chunk, self._found_credentials))
        for chunk in _chunks(queue_ids):
            marks = ", ".join("?" * len(chunk))
            sql = f"SELECT queue_id, paused FROM queues WHERE queue_id IN ({marks})"
            reads.append((sql, chunk, self._found_queues))
        claim_reads = [
            self._claim_read(queue_id, capability, now_ms, rooms, ())
            for (queue_id, capability), (rooms, now_ms) in claims.items()
            if (queue_id, capability) not in self._pools
        ]
        if not reads and not claim_reads:
            return
        found = self.rows_of(
            [(sql, params) for sql, params, _ in reads],
            reads=("attempts", "tasks", "receipts"),
            unsorted=[(sql, params) for sql, params, _ in claim_reads],
        )
        for (_, _, take), rows in zip([*reads, *claim_reads], found, strict=True):
            take(rows)

    def _found_attempts(self, rows: list[tuple[Any, ...]]) -> None:
        self._attempts.update((row[0], _attempt(row)) for row in rows)

    def _found_tasks(self, rows: list[tuple[Any, ...]]) -> None:
        for row in rows:
            self._tasks.setdefault(row[0], _task(row))

    def _found_receipts(self, rows: list[tuple[Any, ...]]) -> None:
        for instance_id, message_id, kept_digest, answer in rows:
            self._receipts[(instance_id, message_id)] = (kept_digest, bytes(answer))

    def _found_credentials(self, rows: list[tuple[Any, ...]]) -> None:
        self._credentials.update((row[0], _credential(row)) for row in rows)

    def _found_queues(self, rows: list[tuple[Any, ...]]) -> None:
        self._queues.update((queue_id, bool(paused)) for queue_id, paused in rows)

    # --- tasks -------------------------------------------------------------------------

    def task(self, task_id: str) -> Task | None:
        if task_id not in self._tasks:
            sql = self._lock(f"SELECT {_TASK_COLUMNS} FROM tasks WHERE task_id = ?")
            rows = self.rows(sql, task_id, reads=("tasks",))
            self._tasks[task_id] = _task(rows[0]) if rows else None
        return self._tasks[task_id]

    def insert_task(self, task: Task) -> None:
        self._queued(task)
        self.moved_tasks.append((None, task))
        self._tasks[task.task_id] = task
        self._write(_INSERT_TASK, task.task_id, _task_row(task))

    def update_task(self, task: Task) -> None:
        before = self._tasks.get(task.task_id)
        if before is not None:  # every operation reads a task before it changes it
            self.moved_tasks.append((before, task))
        self._tasks[task.task_id] = task
        self._queued(task)
        if task.state.is_terminal:
            self._ended.add(task.task_id)
        row = _task_row(task)
        inserted = self._writes.get(_INSERT_TASK, {})
        if task.task_id in inserted:
            inserted[task.task_id] = row
            return
        self._write(_UPDATE_TASK, task.task_id, tuple(row[i] for i in _TASK_UPDATE))

    def ended_tasks(self) -> frozenset[str]:
        """The tasks this transaction ended (made SUCCEEDED, FAILED, NEEDS_REVIEW or CANCELLED)."""
        return frozenset(self._ended)

    def offerable(
        self,
        queue_id: str,
        capabilities: Sequence[str],
        now_ms: int,
        limit: int,
        *,
        passed_keys: Collection[str] = (),
    ) -> list[Task]:
        """Up to `limit` QUEUED tasks of `queue_id` matching a capability key, in offer
        order (`_rules.offer_order`), none of a concurrency key in `passed_keys`; none
        while an operator has paused the queue.

        One indexed range per capability, each read no further than `limit`
        rows past the tasks it passes over (delayed ones, and those of
        `passed_keys`): with none of those, the cost is the same for a queue of
        ten tasks or of millions. The tasks all of a batch's claims may take are read
        with the rest of its rows (`prefetch`, `Keys.claims`); a claim reads again only
        when those run short.
        """
        found = [
            task
            for capability in dict.fromkeys(capabilities)
            for task in self._offerable_of(queue_id, capability, now_ms, limit, passed_keys)
        ]
        if len(capabilities) > 1:
            found.sort(key=_offer_order)
        return found[:limit]

    def _offerable_of(
        self, queue_id: str, capability: str, now_ms: int, limit: int, passed: Collection[str]
    ) -> list[Task]:
        """`offerable` for one capability: from what an earlier claim of the transaction
        read if that holds enough, else read (as many as the batch's claims may take)."""
        pool = self._pools.get((queue_id, capability))
        if pool is not None and not passed:
            ready = sorted(
                (
                    task
                    for task_id in pool.task_ids
                    if (task := self._tasks[task_id]) is not None
                    and task.state is TaskState.QUEUED
                    and task.available_at_ms <= now_ms < task.deadline_at_ms
                    and task.started_attempts < task.max_attempts
                ),
                key=_offer_order,
            )
            if len(ready) >= limit or pool.complete:
                return ready[:limit]
        wanted = max(limit, self._claims.get((queue_id, capability), 0))
        sql, params, pooled = self._claim_read(queue_id, capability, now_ms, wanted, passed)
        [rows] = self.rows_of([], reads=("tasks",), unsorted=[(sql, params)])
        pooled(rows)
        return [task for row in rows[:limit] if (task := self._tasks[row[0]]) is not None]

    def _claim_read(
        self, queue_id: str, capability: str, now_ms: int, wanted: int, passed: Collection[str]
    ) -> tuple[str, tuple[object, ...], Callable[[list[tuple[Any, ...]]], None]]:
        """The read of up to `wanted` tasks a claim may take (in offer order, locked, passing
        over those of `passed` keys), and what keeps what it found for the transaction's
        later claims (when it passes over none)."""
        wanted = min(wanted, CHUNK)
        keys = sorted(passed)
        sql = self._lock(
            f"{_SELECT_TASKS} WHERE state = 'QUEUED' AND queue_id = ? "
            "AND capability = ? AND available_at_ms <= ? AND deadline_at_ms > ? "
            "AND started_attempts < max_attempts"
            + (f" AND concurrency_key NOT IN ({', '.join('?' * len(keys))})" if keys else "")
            + " AND NOT EXISTS (SELECT 1 FROM queues WHERE queue_id = ? AND paused <> 0)"
            " ORDER BY priority DESC, available_at_ms, seq LIMIT ?",
            skip_locked=True,
        )

        def pooled(rows: list[tuple[Any, ...]]) -> None:
            found = [self._keep_task(row) for row in rows]
            if not keys:
                ids = [task.task_id for task in found]
                self._pools[(queue_id, capability)] = _Pool(ids, complete=len(found) < wanted)

        return sql, (queue_id, capability, now_ms, now_ms, *keys, queue_id, wanted), pooled

    def key_limits(self, queue_id: str, keys: Collection[str]) -> dict[str, int]:
        """The limit of each of `keys` that has one: its own, else the queue's for every key."""
        if not keys:
            return {}
        marks = ", ".join("?" * (len(keys) + 1))
        sql = (
            "SELECT concurrency_key, max_running FROM concurrency_limits "
            f"WHERE queue_id = ? AND concurrency_key IN ({marks})"
        )
        found: dict[str, int] = dict(self.rows(sql, queue_id, "", *sorted(keys), reads=()))
        default = found.get("", 0)
        limits = {key: found.get(key, default) for key in keys}
        return {key: limit for key, limit in limits.items() if limit > 0}

    def hold_keys(self, queue_id: str, keys: Collection[str]) -> set[str]:
        """Of `keys`, those this transaction may offer tasks of until it ends.

        On PostgreSQL a claim's count of a key's live tasks holds only while no
        other hub offers one of them: each key is locked for the transaction
        (an advisory lock on a hash of queue and key: a collision only passes over
        a key more often), and a key another hub's
        transaction holds is passed over, not waited for (claims never wait on
        each other, so never deadlock). SQLite has one writer at a time."""
        if not self._locks:
            return set(keys)
        sql = "SELECT pg_try_advisory_xact_lock(hashtextextended(?, 0))"
        return {key for key in keys if self.rows(sql, f"{queue_id}/{key}", reads=())[0][0]}

    def live_by_key(self, queue_id: str, keys: Collection[str]) -> dict[str, int]:
        """How many tasks of each of `keys` have a live attempt (offered or running)."""
        if not keys:
            return {}
        marks = ", ".join("?" * len(keys))
        sql = (
            "SELECT concurrency_key, COUNT(*) FROM tasks WHERE queue_id = ? "
            f"AND concurrency_key IN ({marks}) AND state IN ('OFFERED', 'RUNNING') "
            "AND concurrency_key <> '' GROUP BY concurrency_key"
        )
        return dict(self.rows(sql, queue_id, *sorted(keys), reads=("tasks",)))

    def set_key_limit(self, queue_id: str, key: str, max_running: int) -> None:
        """Set a key's limit (`key` "": the queue's for every key); 0 removes it."""
        self.run(
            "DELETE FROM concurrency_limits WHERE queue_id = ? AND concurrency_key = ?",
            queue_id,
            key,
        )
        if max_running > 0:
            self.run(
                "INSERT INTO concurrency_limits (queue_id, concurrency_key, max_running) "
                "VALUES (?, ?, ?)",
                queue_id,
                key,
                max_running,
            )

    def overdue_tasks(self, now_ms: int, limit: int) -> list[Task]:
        """QUEUED tasks whose total deadline has passed."""
        sql = (
            f"SELECT {_TASK_COLUMNS} FROM tasks WHERE state = 'QUEUED' AND deadline_at_ms <= ? "
            "ORDER BY deadline_at_ms LIMIT ?"
        )
        rows = self.rows(self._lock(sql, skip_locked=True), now_ms, limit, reads=("tasks",))
        return [self._keep_task(row) for row in rows]

    def _keep_task(self, row: Sequence[Any]) -> Task:
        task = _task(row)
        self._tasks[task.task_id] = task
        return task

    def tasks_of_queue(self, queue_id: str, state: str | None, limit: int) -> list[Task]:
        where = "queue_id = ?" + (" AND state = ?" if state else "")
        params: tuple[object, ...] = (queue_id, state) if state else (queue_id,)
        sql = f"SELECT {_TASK_COLUMNS} FROM tasks WHERE {where} ORDER BY created_at_ms LIMIT ?"
        return [_task(row) for row in self.rows(sql, *params, limit, reads=("tasks",))]

    def task_page(
        self, queue_id: str, chosen: TaskFilter, after: tuple[int, str] | None, limit: int
    ) -> list[Task]:
        """Up to `limit` tasks of `queue_id` that `chosen` selects, in the order they were
        created (ties by id), from just past `after` (created_at_ms, task_id) on. Locked
        on PostgreSQL: an operator acts on what it reads."""
        where, params = _filtered(queue_id, chosen)
        if after is not None:
            where += " AND (created_at_ms > ? OR (created_at_ms = ? AND task_id > ?))"
            params += (after[0], after[0], after[1])
        sql = (
            f"SELECT {_TASK_COLUMNS} FROM tasks WHERE {where} "
            "ORDER BY created_at_ms, task_id LIMIT ?"
        )
        return [self._keep_task(row) for row in self.rows(self._lock(sql), *params, limit)]

    def count_tasks(self, queue_id: str, chosen: TaskFilter) -> int:
        where, params = _filtered(queue_id, chosen)
        count: int = self.rows(f"SELECT COUNT(*) FROM tasks WHERE {where}", *params)[0][0]
        return count

    # --- attempts ----------------------------------------------------------------------

    def attempt(self, attempt_id: str) -> Attempt | None:
        if attempt_id not in self._attempts:
            found = self._select_attempts([attempt_id])
            self._attempts[attempt_id] = found[0] if found else None
        return self._attempts[attempt_id]

    def _select_attempts(self, attempt_ids: Sequence[str]) -> list[Attempt]:
        marks = ", ".join("?" * len(attempt_ids))
        sql = f"{_SELECT_ATTEMPTS} WHERE attempt_id IN ({marks}) ORDER BY attempt_id"
        rows = self.rows(self._lock(sql), *attempt_ids, reads=("attempts",))
        return [_attempt(row) for row in rows]

    def tasks_of_attempts(self, attempt_ids: Collection[str]) -> dict[str, str]:
        """The task of each of `attempt_ids` that exists, by attempt (read, not locked)."""
        sql = "SELECT attempt_id, task_id FROM attempts WHERE attempt_id IN ({})"
        queries = [
            (sql.format(", ".join("?" * len(chunk))), chunk)
            for chunk in _chunks(sorted(attempt_ids))
        ]
        found = self.rows_of(queries, reads=("attempts",))
        return {attempt_id: task_id for rows in found for attempt_id, task_id in rows}

    def records(
        self, task_ids: Collection[str]
    ) -> dict[str, tuple[list[Attempt], list[HistoryEntry]]]:
        """The attempts (by epoch) and history of each of `task_ids`, read in one go."""
        ids = sorted(task_ids)
        attempts = f"{_SELECT_ATTEMPTS} WHERE task_id = ? ORDER BY epoch"
        history = (
            "SELECT task_id, at_ms, kind, attempt_id, detail FROM history "
            "WHERE task_id = ? ORDER BY entry_id"
        )
        queries = [(sql, (task_id,)) for task_id in ids for sql in (attempts, history)]
        found = iter(self.rows_of(queries, reads=("attempts", "history")))
        return {
            task_id: (
                [_attempt(row) for row in next(found)],
                [
                    HistoryEntry(task_id=r[0], at_ms=r[1], kind=r[2], attempt_id=r[3], detail=r[4])
                    for r in next(found)
                ],
            )
            for task_id in ids
        }

    def due_attempts(self, now_ms: int, limit: int) -> list[Attempt]:
        """Live attempts whose offer or lease has run out, earliest first."""
        sql = (
            f"SELECT {_ATTEMPT_COLUMNS} FROM attempts WHERE state IN ('OFFERED', 'RUNNING') "
            "AND due_at_ms <= ? ORDER BY due_at_ms LIMIT ?"
        )
        rows = self.rows(self._lock(sql, skip_locked=True), now_ms, limit, reads=("attempts",))
        found = [_attempt(row) for row in rows]
        self._attempts.update((attempt.attempt_id, attempt) for attempt in found)
        return found

    def next_due_ms(self) -> int | None:
        """When the next live attempt's offer or lease runs out, or a queued task's deadline."""
        attempts = self.rows(
            "SELECT MIN(due_at_ms) FROM attempts WHERE state IN ('OFFERED', 'RUNNING')"
        )
        tasks = self.rows("SELECT MIN(deadline_at_ms) FROM tasks WHERE state = 'QUEUED'")
        dues = [row[0] for row in (*attempts, *tasks) if row[0] is not None]
        return min(dues, default=None)

    def put_attempt(self, attempt: Attempt, *, new: bool) -> None:
        self.moved_attempts.append(
            (None if new else self._attempts.get(attempt.attempt_id), attempt)
        )
        self._attempts[attempt.attempt_id] = attempt
        row = _attempt_row(attempt)
        inserted = self._writes.get(_INSERT_ATTEMPT, {})
        if new or attempt.attempt_id in inserted:
            self._write(_INSERT_ATTEMPT, attempt.attempt_id, row)
            return
        self._write(_UPDATE_ATTEMPT, attempt.attempt_id, tuple(row[i] for i in _ATTEMPT_UPDATE))

    # --- history and receipts ----------------------------------------------------------

    def note(self, entries: Iterable[HistoryEntry]) -> None:
        self._notes.extend(
            (entry.task_id, entry.at_ms, entry.kind, entry.attempt_id, entry.detail)
            for entry in entries
        )

    def receipt(self, instance_id: str, message_id: str) -> tuple[str, bytes] | None:
        """(digest, answer) kept for a message id."""
        key = (instance_id, message_id)
        if key not in self._receipts:
            self.prefetch([Keys(receipts=(key,))])
        return self._receipts[key]

    def keep_receipt(
        self, instance_id: str, message_id: str, digest: str, answer: bytes, now_ms: int
    ) -> None:
        key = (instance_id, message_id)
        self._receipts[key] = (digest, answer)
        self._write(_INSERT_RECEIPT, key, (instance_id, message_id, digest, answer, now_ms))

    def forget_receipts(self, before_ms: int, limit: int) -> int:
        """Delete up to `limit` of the answers kept before `before_ms`, oldest first; how many."""
        forgotten = self.run(
            "DELETE FROM receipts WHERE (instance_id, message_id) IN (SELECT instance_id, "
            "message_id FROM receipts WHERE at_ms < ? ORDER BY at_ms LIMIT ?)",
            before_ms,
            limit,
        )
        self._receipts.clear()
        return forgotten

    def forget_tasks(self, before_ms: int, limit: int) -> int:
        """Delete up to `limit` tasks that ended for good (`TaskState.is_retained`) before
        `before_ms`, with their attempts and history (evidence included); how many."""
        states = [state.value for state in TaskState if state.is_retained]
        sql = self._lock(
            "SELECT task_id FROM tasks WHERE finished_at_ms > 0 AND state <> 'NEEDS_REVIEW' "
            f"AND finished_at_ms < ? AND state IN ({', '.join('?' * len(states))}) "
            "ORDER BY finished_at_ms LIMIT ?",
            skip_locked=True,
        )
        task_ids = [row[0] for row in self.rows(sql, before_ms, *states, limit)]
        for chunk in _chunks(task_ids):
            marks = ", ".join("?" * len(chunk))
            for table in ("attempts", "history", "tasks"):
                self.run(f"DELETE FROM {table} WHERE task_id IN ({marks})", *chunk)
        gone = set(task_ids)
        for task_id in gone:
            self._tasks.pop(task_id, None)
        for attempt_id, attempt in list(self._attempts.items()):
            if attempt is not None and attempt.task_id in gone:
                del self._attempts[attempt_id]
        return len(task_ids)

    def operator_answer(self, request_id: str, action: str, target: str) -> tuple[int, str] | None:
        """(status, answer's JSON text) kept for an operator's request, or None."""
        rows = self.rows(
            "SELECT status, answer FROM operator_requests "
            "WHERE request_id = ? AND action = ? AND target = ?",
            request_id,
            action,
            target,
            reads=(),
        )
        return (rows[0][0], rows[0][1]) if rows else None

    def keep_operator_answer(
        self, request_id: str, action: str, target: str, answer: tuple[int, str], now_ms: int
    ) -> None:
        self.run(
            "INSERT INTO operator_requests (request_id, action, target, status, answer, at_ms) "
            "VALUES (?, ?, ?, ?, ?, ?)",
            request_id,
            action,
            target,
            *answer,
            now_ms,
        )

    def forget_operator_answers(self, before_ms: int) -> None:
        self.run("DELETE FROM operator_requests WHERE at_ms < ?", before_ms)

    # --- queues and credentials --------------------------------------------------------

    def _paused(self, queue_id: str) -> bool | None:
        if queue_id not in self._queues:
            sql = "SELECT paused FROM queues WHERE queue_id = ?"
            rows = self.rows(sql, queue_id, reads=())
            self._queues[queue_id] = bool(rows[0][0]) if rows else None
        return self._queues[queue_id]

    def queue_exists(self, queue_id: str) -> bool:
        return self._paused(queue_id) is not None

    def create_queue(self, queue_id: str, now_ms: int) -> None:
        self.run("INSERT INTO queues (queue_id, created_at_ms) VALUES (?, ?)", queue_id, now_ms)
        self._queues[queue_id] = False

    def pause_queue(self, queue_id: str, paused: bool) -> bool:
        """Pause or resume `queue_id`; False if there is no such queue."""
        sql = "UPDATE queues SET paused = ? WHERE queue_id = ?"
        found = self.run(sql, int(paused), queue_id) > 0
        self._queues[queue_id] = paused if found else None
        if found and not paused:  # its queued tasks may be offered from now on
            self.queued_at_ms = 0
        for pooled in [key for key in self._pools if key[0] == queue_id]:
            del self._pools[pooled]
        return found

    def queues(self) -> list[str]:
        return [row[0] for row in self.rows("SELECT queue_id FROM queues ORDER BY queue_id")]

    def queue_rows(self) -> list[tuple[str, int, bool]]:
        """(queue id, created at, paused) of every queue."""
        sql = "SELECT queue_id, created_at_ms, paused FROM queues ORDER BY queue_id"
        return [(row[0], row[1], bool(row[2])) for row in self.rows(sql, reads=())]

    def task_counts(self) -> list[tuple[str, TaskState, int, int]]:
        """(queue id, state, how many tasks, the oldest's `created_at_ms`) per queue and state."""
        sql = (
            "SELECT queue_id, state, COUNT(*), MIN(created_at_ms) FROM tasks "
            "GROUP BY queue_id, state ORDER BY queue_id, state"
        )
        return [(r[0], TaskState(r[1]), r[2], r[3]) for r in self.rows(sql, reads=("tasks",))]

    def create_credential(self, credential: Credential, secret_hash: str) -> None:
        self.run(
            "INSERT INTO credentials (credential_id, secret_hash, queue_id, rights, revoked, "
            "created_at_ms) VALUES (?, ?, ?, ?, ?, ?)",
            credential.credential_id,
            secret_hash,
            credential.queue_id,
            ",".join(sorted(right.value for right in credential.rights)),
            int(credential.revoked),
            credential.created_at_ms,
        )
        self._credentials.pop(credential.credential_id, None)

    def credential(self, credential_id: str) -> tuple[Credential, str] | None:
        """The credential and its secret's hash (looked up once per transaction)."""
        if credential_id not in self._credentials:
            sql = f"SELECT {_CREDENTIAL_COLUMNS} FROM credentials WHERE credential_id = ?"
            rows = self.rows(sql, credential_id, reads=())
            self._credentials[credential_id] = _credential(rows[0]) if rows else None
        return self._credentials[credential_id]

    def credentials(self) -> list[Credential]:
        """Every credential, oldest first (their secrets' hashes stay here)."""
        sql = f"SELECT {_CREDENTIAL_COLUMNS} FROM credentials ORDER BY created_at_ms, credential_id"
        return [_credential(row)[0] for row in self.rows(sql, reads=())]

    def revoke_credential(self, credential_id: str) -> bool:
        """Revoke a credential for good; False if there is no such credential."""
        sql = "UPDATE credentials SET revoked = 1 WHERE credential_id = ?"
        self._credentials.pop(credential_id, None)
        return self.run(sql, credential_id) > 0

    def revoked_among(self, credential_ids: Collection[str]) -> set[str]:
        """Which of `credential_ids` are revoked (or no longer exist)."""
        found: set[str] = set()
        ids = sorted(credential_ids)
        for chunk in _chunks(ids):
            marks = ", ".join("?" * len(chunk))
            sql = (
                "SELECT credential_id FROM credentials "
                f"WHERE revoked = 0 AND credential_id IN ({marks})"
            )
            found.update(row[0] for row in self.rows(sql, *chunk, reads=()))
        return set(ids) - found


# ------------------------------------------------------------------------------ rows


def _offer_order(task: Task) -> tuple[int, int, int]:
    """The order tasks are offered in (`_rules.offer_order`), as the claim's index holds it."""
    return (-task.priority, task.available_at_ms, task.seq)


def _filtered(queue_id: str, chosen: TaskFilter) -> tuple[str, tuple[object, ...]]:
    """The WHERE clause (and its parameters) of a queue's tasks that `chosen` selects."""
    where = "queue_id = ?"
    params: tuple[object, ...] = (queue_id,)
    if chosen.states:
        where += f" AND state IN ({', '.join('?' * len(chosen.states))})"
        params += tuple(state.value for state in chosen.states)
    for clause, value in (
        (" AND handler = ?", chosen.handler),
        (" AND created_at_ms >= ?", chosen.since_ms),
        (" AND created_at_ms < ?", chosen.until_ms),
    ):
        if value is not None:
            where += clause
            params += (value,)
    return where, params


_CREDENTIAL_COLUMNS: Final = "credential_id, queue_id, rights, revoked, created_at_ms, secret_hash"


def _credential(row: Sequence[Any]) -> tuple[Credential, str]:
    rights = frozenset(Right(name) for name in row[2].split(",") if name)
    credential = Credential(
        credential_id=row[0],
        queue_id=row[1],
        rights=rights,
        revoked=bool(row[3]),
        created_at_ms=row[4],
    )
    return credential, row[5]


def _task_row(task: Task) -> tuple[object, ...]:
    capability = task.capability
    return (
        task.task_id,
        task.queue_id,
        capability.key,
        capability.handler,
        capability.handler_version,
        capability.payload_version,
        task.payload,
        task.idempotency.value,
        task.max_attempts,
        task.attempt_timeout_ms,
        task.created_at_ms,
        task.deadline_at_ms,
        task.state.value,
        task.available_at_ms,
        task.epoch,
        task.attempt_id,
        task.started_attempts,
        int(task.uncertain),
        task.result,
        task.failure_code,
        task.failure_details,
        task.finished_at_ms,
        task.priority,
        task.seq,
        task.concurrency_key,
    )


def _task(row: Sequence[Any]) -> Task:
    return Task(
        task_id=row[0],
        queue_id=row[1],
        capability=Capability(handler=row[3], handler_version=row[4], payload_version=row[5]),
        payload=row[6],
        idempotency=Idempotency(row[7]),
        max_attempts=row[8],
        attempt_timeout_ms=row[9],
        created_at_ms=row[10],
        deadline_at_ms=row[11],
        state=TaskState(row[12]),
        available_at_ms=row[13],
        epoch=row[14],
        attempt_id=row[15],
        started_attempts=row[16],
        uncertain=bool(row[17]),
        result=row[18],
        failure_code=row[19],
        failure_details=row[20],
        finished_at_ms=row[21],
        priority=row[22],
        seq=row[23],
        concurrency_key=row[24],
    )


def _attempt_row(attempt: Attempt) -> tuple[object, ...]:
    if attempt.state is AttemptState.OFFERED:
        due = attempt.offer_deadline_ms
    elif attempt.state is AttemptState.RUNNING:
        due = attempt.lease_deadline_ms
    else:
        due = NEVER
    outcome = None if attempt.outcome is None else json.dumps(_outcome_fields(attempt.outcome))
    return (
        attempt.attempt_id,
        attempt.task_id,
        attempt.epoch,
        attempt.instance_id,
        attempt.state.value,
        attempt.offered_at_ms,
        attempt.offer_deadline_ms,
        attempt.started_at_ms,
        attempt.lease_deadline_ms,
        attempt.finished_at_ms,
        due,
        outcome,
        attempt.renewals,
        attempt.renewed_at_ms,
    )


def _outcome_fields(outcome: Outcome) -> dict[str, Any]:
    fields: dict[str, Any] = CONVERTER.unstructure(outcome, Outcome)
    return fields


def _attempt(row: Sequence[Any]) -> Attempt:
    outcome = (
        None if row[11] is None else CONVERTER.structure(json.loads(row[11]), Outcome)  # type: ignore[arg-type]
    )
    return Attempt(
        attempt_id=row[0],
        task_id=row[1],
        epoch=row[2],
        instance_id=row[3],
        state=AttemptState(row[4]),
        offered_at_ms=row[5],
        offer_deadline_ms=row[6],
        started_at_ms=row[7],
        lease_deadline_ms=row[8],
        finished_at_ms=row[9],
        outcome=outcome,
        renewals=row[12],
        renewed_at_ms=row[13],
    )


# ----------------------------------------------------------------------------- stores


class Store:
    """One connection to the hub's database; `run_batch` is its one way to change it.

    Calls may come from different threads, never at the same time (the
    committer runs one batch after another).
    """

    def __init__(self, url: str) -> None:
        self.url = url
        self._lock = threading.Lock()
        self.postgres = url.startswith(("postgresql://", "postgres://"))
        self.name = _redact(url) if self.postgres else url
        """The URL as messages show it (without a password)."""
        try:
            if self.postgres:
                self._pg = _connect_postgres(url)
            else:
                self._sqlite = _connect_sqlite(url)
            self._migrate()
        except (sqlite3.Error, OSError) as error:
            raise StoreError(url=self.name, reason=str(error)) from error
        except Exception as error:
            if self.postgres and _is_psycopg_error(error):
                raise StoreError(url=self.name, reason=str(error)) from error
            raise

    def close(self) -> None:
        with self._lock:
            (self._pg if self.postgres else self._sqlite).close()

    def run_batch(self, operations: Sequence[Callable[[Tx], T]]) -> list[T]:
        """Every operation, in order, in one transaction; all or none take effect.

        `StoreError` when the database fails (the transaction is rolled back). A
        PostgreSQL connection that was lost is opened again for the next batch.
        """
        with self._lock:
            try:
                if self.postgres and self._pg.closed:
                    self._pg = _connect_postgres(self.url)
                return self._transaction(lambda tx: _run_all(tx, operations))
            except sqlite3.Error as error:
                raise StoreError(url=self.name, reason=str(error)) from error
            except Exception as error:
                if self.postgres and _is_psycopg_error(error):
                    raise StoreError(url=self.name, reason=str(error)) from error
                raise

    def run_batch_now(self, operations: Sequence[Callable[[Tx], T]]) -> list[T] | None:
        """SQLite: `run_batch`, unless it would wait for the database's write lock (held by
        another connection): then None, and nothing is done.

        For the caller's own thread when that thread is busy anyway: a batch's
        operations are Python, and its commit one fsync. None on PostgreSQL, whose
        queries wait on the network.
        """
        if self.postgres:
            return None
        with self._lock:
            try:
                return self._sqlite_transaction(lambda tx: _run_all(tx, operations), wait=False)
            except _Busy:
                return None
            except sqlite3.Error as error:
                raise StoreError(url=self.name, reason=str(error)) from error

    def read(self, operation: Callable[[Tx], T]) -> T:
        """One operation in its own transaction (for commands and tests)."""
        return self.run_batch([operation])[0]

    def _transaction(self, work: Callable[[Tx], T]) -> T:
        if self.postgres:
            return self._pg_transaction(work, locks=True)
        return self._sqlite_transaction(work, wait=True)

    def _pg_transaction(self, work: Callable[[Tx], T], *, locks: bool) -> T:
        text = _PgText(self._pg)
        try:
            tx = Tx(text.execute, text.execute_many, locks=locks)
            result = work(tx)
            tx.flush()
            if tx.queued_at_ms is not None:  # delivered at the commit to every hub listening
                tx.send("SELECT pg_notify(?, ?)", QUEUED_CHANNEL, str(tx.queued_at_ms))
            text.commit()
        except BaseException:
            text.roll_back()
            raise
        return result

    def _sqlite_transaction(self, work: Callable[[Tx], T], *, wait: bool) -> T:
        """`work` in one transaction; `_Busy` if another connection holds the write lock and
        not `wait` (else waits for it, up to `BUSY_TIMEOUT_S`)."""
        connection = self._sqlite
        if wait:
            connection.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_S * 1000:.0f}")
        try:
            connection.execute("BEGIN IMMEDIATE")
        except sqlite3.OperationalError as error:
            if not wait and error.sqlite_errorcode == sqlite3.SQLITE_BUSY:
                raise _Busy from error
            raise
        finally:
            if wait:
                connection.execute("PRAGMA busy_timeout = 0")
        try:
            tx = Tx(connection.execute, connection.executemany, locks=False)
            result = work(tx)
            tx.flush()
            connection.execute("COMMIT")
        except BaseException:
            if connection.in_transaction:
                connection.execute("ROLLBACK")
            raise
        return result

    def _migrate(self) -> None:
        serial, blob, without_rowid = (
            ("BIGSERIAL PRIMARY KEY", "BYTEA", "")
            if self.postgres
            else ("INTEGER PRIMARY KEY", "BLOB", " WITHOUT ROWID")  # clustered by the key
        )

        def migrate(tx: Tx) -> None:
            tx.run("CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL)")
            rows = tx.rows("SELECT version FROM schema_version")
            applied = rows[0][0] if rows else 0
            if not rows:
                tx.run("INSERT INTO schema_version (version) VALUES (0)")
            if applied > len(_MIGRATIONS):
                reason = (
                    f"its schema is version {applied}, newer than this hub's "
                    f"({len(_MIGRATIONS)}): run a hub at least as new"
                )
                raise StoreError(url=self.name, reason=reason)
            for script in _MIGRATIONS[applied:]:
                for statement in script.format(
                    serial=serial, blob=blob, without_rowid=without_rowid
                ).split(";"):
                    if statement.strip():
                        tx.run(statement)
            tx.run("UPDATE schema_version SET version = ?", len(_MIGRATIONS))

        if self.postgres:

            def one_at_a_time(tx: Tx) -> None:
                tx.run("SELECT pg_advisory_xact_lock(7304015)")  # one migrator at a time
                migrate(tx)

            self._pg_transaction(one_at_a_time, locks=False)
            return
        self._transaction(migrate)


class _Busy(Exception):
    """Another connection holds the database's write lock."""


def _run_all(tx: Tx, operations: Sequence[Callable[[Tx], T]]) -> list[T]:
    tx.prefetch(keys for op in operations if (keys := getattr(op, "keys", None)) is not None)
    return [op(tx) for op in operations]


def _connect_sqlite(url: str) -> sqlite3.Connection:
    path = url.removeprefix("sqlite:///").removeprefix("sqlite:")
    parent = os.path.dirname(os.path.abspath(path))
    os.makedirs(parent, exist_ok=True)
    connection = sqlite3.connect(
        path, timeout=BUSY_TIMEOUT_S, isolation_level=None, check_same_thread=False
    )
    connection.execute("PRAGMA journal_mode = WAL")
    connection.execute("PRAGMA synchronous = FULL")
    connection.execute("PRAGMA foreign_keys = ON")
    connection.execute("PRAGMA busy_timeout = 0")  # from now on a transaction says if it waits
    return connection


class QueuedListener:
    """A connection of its own that hears the commits that queued tasks, on any hub of the
    database or by a command: wait until `fileno()` is readable, then read `heard()`."""

    def __init__(self, url: str) -> None:
        import psycopg  # noqa: PLC0415

        self._url = url
        try:
            self._pg = _connect_postgres(url)
            self._pg.execute(f"LISTEN {QUEUED_CHANNEL}")
        except psycopg.Error as error:
            raise StoreError(url=_redact(url), reason=str(error)) from error

    def fileno(self) -> int:
        return self._pg.pgconn.socket

    def heard(self) -> list[int]:
        """When the tasks queued by each commit heard of since the last call may first be
        offered (epoch ms, in the clock of the hub that queued them). Reads what the socket
        holds; never blocks. `StoreError` if the connection is lost."""
        import psycopg  # noqa: PLC0415

        pgconn = self._pg.pgconn
        try:
            pgconn.consume_input()
        except psycopg.Error as error:
            raise StoreError(url=_redact(self._url), reason=str(error)) from error
        heard = []
        while (notify := pgconn.notifies()) is not None:
            heard.append(int(notify.extra) if notify.extra.isdigit() else 0)
        return heard

    def close(self) -> None:
        self._pg.close()


def _connect_postgres(url: str) -> psycopg.Connection[Any]:
    import psycopg  # noqa: PLC0415 - a hub on SQLite never loads it

    return psycopg.connect(url, autocommit=True)


def _pg_sql(sql: str) -> str:
    return sql.replace("?", "%s")


class _PgText:
    """One PostgreSQL transaction sent as text: each statement is bound on the client
    (psycopg's `ClientCursor`) and held until something must be read; then what is held
    and the reads go as one query of several statements, one round trip. The writes kept,
    the notification and the commit go together last.

    A statement planned where it runs, for its values and the tables as they are: the
    hub's tables grow from nothing to millions of rows and back, faster than the server's
    statistics follow, and a plan kept with a prepared statement is the plan for the
    tables as they were then (receipts looked up by a sequential scan, planned when the
    table was empty, took 2 ms a lookup once it held 10,000 rows). And cheap on the
    client: psycopg's pipeline mode cost 0.2 ms of its CPU per transaction more.
    """

    def __init__(self, connection: psycopg.Connection[Any]) -> None:
        import psycopg  # noqa: PLC0415

        self._connection = connection
        self._cursor = psycopg.ClientCursor(connection)
        self._held: list[tuple[str, _Sent | None]] = [("BEGIN", None)]
        self._begun = False

    def execute(self, sql: str, params: Sequence[object]) -> _Sent:
        sent = _Sent(self)
        self._held.append((self._bind(_pg_sql(sql), params), sent))
        return sent

    def execute_many(self, sql: str, rows: list[tuple[object, ...]]) -> None:
        if sql.startswith("INSERT"):  # one statement of many rows
            for chunk in _chunks(rows):
                flat = [value for row in chunk for value in row]
                self._held.append((self._bind(_many_rows(sql, len(chunk)), flat), None))
            return
        self._held.extend((self._bind(_pg_sql(sql), row), None) for row in rows)

    def _bind(self, sql: str, params: Sequence[object]) -> str:
        return self._cursor.mogrify(sql, params) if params else sql

    def settle(self) -> None:
        """Send what is held; each statement's rows and count reach its `_Sent`."""
        if not self._held:
            return
        held, self._held = self._held, []
        self._begun = True
        cursor = self._cursor
        cursor.execute(";\n".join(text for text, _ in held))
        for index, (_, sent) in enumerate(held):
            if index:
                cursor.nextset()
            if sent is not None:
                sent.rows = cursor.fetchall() if cursor.description is not None else []
                sent.count = cursor.rowcount

    def commit(self) -> None:
        self._held.append(("COMMIT", None))
        self.settle()

    def roll_back(self) -> None:
        """After a failure: end the transaction if the server has begun it."""
        if self._begun and not self._connection.closed:
            with contextlib.suppress(Exception):
                self._connection.execute("ROLLBACK")


class _Sent:
    """A statement `_PgText` holds: its rows and count, read once it is sent."""

    def __init__(self, text: _PgText) -> None:
        self._text = text
        self.rows: list[tuple[Any, ...]] = []
        self.count = -1

    def fetchall(self) -> list[tuple[Any, ...]]:
        self._text.settle()
        return self.rows

    @property
    def rowcount(self) -> int:
        self._text.settle()
        return self.count


def _many_rows(sql: str, count: int) -> str:
    """An INSERT of one row made an INSERT of `count` rows (psycopg's placeholders)."""
    head, _, row = _pg_sql(sql).partition(" VALUES ")
    return f"{head} VALUES {', '.join([row] * count)}"


def _is_psycopg_error(error: BaseException) -> bool:
    import psycopg  # noqa: PLC0415

    return isinstance(error, psycopg.Error)


def _redact(url: str) -> str:
    """`url` without its password."""
    scheme, sep, rest = url.partition("://")
    credentials, at, host = rest.rpartition("@")
    if not at or ":" not in credentials:
        return url
    user = credentials.split(":", 1)[0]
    return f"{scheme}{sep}{user}:***@{host}"
