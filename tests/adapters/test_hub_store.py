"""The hub's store and committer: migrations, durability settings, group commits, isolation
of a failing operation, and several hubs claiming from one PostgreSQL database."""

from __future__ import annotations

import contextlib
import functools
import itertools
import re
import sqlite3
import threading
from collections.abc import Callable, Collection, Sequence
from pathlib import Path
from typing import TypeVar, cast

import pytest
import trio

from blockx.hub import (
    Idempotency,
    Right,
    StoreError,
    Submission,
    Submitted,
    TaskState,
    create_queue,
    submit,
)
from blockx.hub._committer import Committer
from blockx.hub._model import Credential
from blockx.hub._ops import TimeOrderedIds, offer
from blockx.hub._ops import submit as submit_op
from blockx.hub._rules import Timing
from blockx.hub._store import _MIGRATIONS, Store, Tx
from blockx.hubwire import Capability, Offer

T = TypeVar("T")

CAPABILITY = Capability(handler="h", handler_version="1", payload_version="1")
TIMING = Timing(lease_ms=1_000, offer_ttl_ms=60_000, retry_backoff_ms=10, max_retry_backoff_ms=10)


def submission(payload: str) -> Submission:
    return Submission(
        queue_id="q",
        capability=CAPABILITY,
        payload=payload,
        idempotency=Idempotency.IDEMPOTENT,
        max_attempts=1,
        total_deadline_ms=3_600_000,
        attempt_timeout_ms=60_000,
    )


def queue_tasks(store: Store, count: int, *, first: int = 0) -> None:
    if first == 0:
        create_queue(store, "q", 0)
    for n in range(first, first + count):
        submitted = submit(store, submission(str(n)), now_ms=n)
        assert isinstance(submitted, Submitted)


def schema_version(tx: Tx) -> int:
    return int(tx.rows("SELECT version FROM schema_version")[0][0])


def test_opening_a_database_again_migrates_nothing_twice(hub_url: str) -> None:
    first = Store(hub_url)
    queue_tasks(first, 1)
    first.close()
    again = Store(hub_url)
    try:
        assert again.read(schema_version) == len(_MIGRATIONS)
        assert again.read(lambda tx: tx.queues()) == ["q"]
    finally:
        again.close()


_FIRST_TASK_COLUMNS = (
    "task_id, queue_id, capability, handler, handler_version, payload_version, payload, "
    "idempotency, max_attempts, attempt_timeout_ms, created_at_ms, deadline_at_ms, state, "
    "available_at_ms, epoch, attempt_id, started_attempts, uncertain, result, failure_code, "
    "failure_details, finished_at_ms"
)


def first_schema_database(path: str) -> None:
    """A database as the first schema made it, with a queue and one queued task."""
    script = _MIGRATIONS[0].format(
        serial="INTEGER PRIMARY KEY", blob="BLOB", without_rowid=" WITHOUT ROWID"
    )
    connection = sqlite3.connect(path, isolation_level=None)
    connection.executescript(
        script + "CREATE TABLE schema_version (version INTEGER NOT NULL);"
        "INSERT INTO schema_version VALUES (1);"
        "INSERT INTO queues VALUES ('q', 0);"
        f"INSERT INTO tasks ({_FIRST_TASK_COLUMNS}) VALUES ('t1', 'q', '{CAPABILITY.key}', "
        "'h', '1', '1', '0', 'IDEMPOTENT', 1, 60000, 7, 3600000, 'QUEUED', 7, 0, '', 0, 0, "
        "NULL, '', '', 0);"
    )
    connection.close()


def test_a_database_of_an_older_schema_is_taken_to_the_newest(tmp_path: Path) -> None:
    path = str(tmp_path / "hub.sqlite3")
    first_schema_database(path)
    again = Store(path)
    try:
        assert again.read(schema_version) == len(_MIGRATIONS)
        task = again.read(lambda tx: tx.task("t1"))
        offers = again.read(
            offer("q", [CAPABILITY], "w", room=1, now_ms=50, timing=TIMING, new_id=lambda: "a1")
        )
        plan = again.read(
            lambda tx: tx.rows(
                "EXPLAIN QUERY PLAN SELECT task_id FROM tasks WHERE queue_id = ? AND state = ? "
                "ORDER BY created_at_ms LIMIT 1",
                "q",
                "QUEUED",
            )
        )
    finally:
        again.close()
    assert "tasks_by_state" in repr(plan)  # a listing by state skips the queue's other tasks
    assert task is not None
    assert (task.priority, task.seq, task.concurrency_key) == (5, 7 * 65_536, "")
    assert [o.task_id for o in offers] == ["t1"]


def test_a_claim_reads_queued_tasks_in_offer_order_from_one_index(tmp_path: Path) -> None:
    store = Store(str(tmp_path / "hub.sqlite3"))
    plans: list[str] = []

    def spy(tx: Tx) -> None:
        execute = tx._execute  # the plan of the very query a claim runs

        def explain(sql: str, params: Sequence[object]) -> object:
            if "ORDER BY priority DESC" in sql:
                plans.append(repr(execute("EXPLAIN QUERY PLAN " + sql, params).fetchall()))
            return execute(sql, params)

        tx._execute = explain
        offer("q", [CAPABILITY], "w", room=1, now_ms=50, timing=TIMING, new_id=lambda: "a1")(tx)

    store.read(spy)
    store.close()
    assert plans
    assert "tasks_offer_order" in plans[0]
    assert "TEMP B-TREE" not in plans[0]  # no sort: the index gives the order


def spy_on_claims(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The SQL of each read of queued tasks for claims, as transactions run it."""
    seen: list[str] = []
    rows_of = Tx.rows_of

    def noted(
        tx: Tx,
        queries: Sequence[tuple[str, Sequence[object]]],
        *,
        reads: Collection[str],
        unsorted: Sequence[tuple[str, Sequence[object]]] = (),
    ) -> list[list[tuple[object, ...]]]:
        every = [*queries, *unsorted]
        seen.extend(sql for sql, _ in every if "ORDER BY priority DESC" in sql)
        return rows_of(tx, queries, reads=reads, unsorted=unsorted)

    monkeypatch.setattr(Tx, "rows_of", noted)
    return seen


def test_the_claims_of_a_batch_read_the_queue_once_and_offer_each_task_once(
    hub_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = Store(hub_url)
    queue_tasks(store, 5)
    ids = (f"a{n}" for n in itertools.count())
    claims = [
        offer("q", [CAPABILITY], worker, room=2, now_ms=100, timing=TIMING, new_id=ids.__next__)
        for worker in ("w1", "w2", "w3")
    ]
    reads = spy_on_claims(monkeypatch)
    offered = store.run_batch(claims)
    store.close()
    assert [[offer.payload for offer in offers] for offers in offered] == [
        ["0", "1"],
        ["2", "3"],
        ["4"],
    ]
    assert len(reads) == 1  # read once for all three, with the batch's other rows


def test_a_claim_sees_the_tasks_queued_earlier_in_its_batch(hub_url: str) -> None:
    store = Store(hub_url)
    queue_tasks(store, 1)
    ids = (f"a{n}" for n in itertools.count())
    claim = functools.partial(
        offer, "q", [CAPABILITY], room=2, now_ms=100, timing=TIMING, new_id=ids.__next__
    )
    later = submit_op(submission("later"), 50, TimeOrderedIds(lambda: 50))
    operations: list[Callable[[Tx], object]] = [claim("w1"), later, claim("w2")]
    first, _, second = store.run_batch(operations)
    store.close()
    assert [offer.payload for offer in cast(list[Offer], first)] == ["0"]
    assert [offer.payload for offer in cast(list[Offer], second)] == ["later"]


def test_a_claim_on_postgresql_never_sorts_the_queue_whatever_the_statistics(
    postgres_url: str,
) -> None:
    """Statistics taken while no task was queued, then 5,000 queued: the claim still reads
    the offer order's index instead of sorting every queued task."""
    new_id = (f"a{n}" for n in itertools.count()).__next__
    store = Store(postgres_url)
    queue_tasks(store, 100)
    store.read(offer("q", [CAPABILITY], "w0", room=100, now_ms=100, timing=TIMING, new_id=new_id))
    store.read(lambda tx: tx.run("ANALYZE tasks"))
    ids = TimeOrderedIds(lambda: 9)
    store.read(lambda tx: [submit_op(submission(str(n)), n, ids)(tx) for n in range(5_000)])
    plans: list[str] = []

    def spy(tx: Tx) -> list[Offer]:
        execute = tx._execute

        def explain(sql: str, params: Sequence[object]) -> object:
            if "ORDER BY priority DESC" in sql:
                plans.append(str(execute("EXPLAIN " + sql, params).fetchall()))
            return execute(sql, params)

        tx._execute = explain
        claim = offer("q", [CAPABILITY], "w", room=8, now_ms=10_000, timing=TIMING, new_id=new_id)
        return claim(tx)

    offers = store.read(spy)
    store.close()
    assert [offer.payload for offer in offers] == [str(n) for n in range(8)]
    assert "tasks_offer_order" in plans[0]
    assert "Sort" not in plans[0]


def test_text_that_looks_like_sql_or_placeholders_is_kept_as_it_came(hub_url: str) -> None:
    """Statements are bound on the client on PostgreSQL: quotes, placeholders, percent
    signs, backslashes and characters beyond ASCII reach the row unchanged."""
    store = Store(hub_url)
    create_queue(store, "q", 0)
    payload = """{"s": "it's %s and %% and %(x)s; DROP TABLE tasks; -- \\ \u00e9 ☃ 𝄞 $1 ?"}"""
    submitted = submit(store, submission(payload), now_ms=1)
    assert isinstance(submitted, Submitted)
    task = store.read(lambda tx: tx.task(submitted.task.task_id))
    store.close()
    assert task is not None
    assert task.payload == payload


def test_a_database_of_a_newer_schema_is_refused_untouched(tmp_path: Path) -> None:
    path = str(tmp_path / "hub.sqlite3")
    first = Store(path)
    queue_tasks(first, 1)
    newer = len(_MIGRATIONS) + 1
    first.read(lambda tx: tx.run("UPDATE schema_version SET version = ?", newer))
    first.close()
    with pytest.raises(StoreError, match=f"schema is version {newer}, newer than this hub's"):
        Store(path)
    with contextlib.closing(sqlite3.connect(path)) as connection:
        assert connection.execute("SELECT version FROM schema_version").fetchall() == [(newer,)]


def test_sqlite_commits_durably(tmp_path: Path) -> None:
    store = Store(str(tmp_path / "hub.sqlite3"))
    try:
        assert store.read(lambda tx: tx.rows("PRAGMA journal_mode")) == [("wal",)]
        assert store.read(lambda tx: tx.rows("PRAGMA synchronous")) == [(2,)]  # FULL
    finally:
        store.close()


def test_a_database_that_cannot_be_opened_is_a_store_error(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    with pytest.raises(StoreError, match=re.escape("file/hub.sqlite3")):
        Store(str(tmp_path / "file" / "hub.sqlite3"))
    with pytest.raises(StoreError, match=r"postgresql://me:\*\*\*@127.0.0.1:1/x"):
        Store("postgresql://me:secret@127.0.0.1:1/x?connect_timeout=2")


async def test_operations_waiting_for_a_commit_share_the_next_one(tmp_path: Path) -> None:
    store = Store(str(tmp_path / "hub.sqlite3"))
    committer = Committer(store)
    answers: list[object] = []
    async with trio.open_nursery() as nursery:
        for n in range(199):
            create = functools.partial(Tx.create_queue, queue_id=f"q{n}", now_ms=n)
            committer.submit(create, answers.append)
        nursery.start_soon(committer.run)  # runs once this task waits, below
        answers.append(await committer.do(lambda tx: tx.create_queue("q199", 199)))
        nursery.cancel_scope.cancel()
    assert answers == [None] * 200
    assert committer.batches == 1
    assert len(store.read(lambda tx: tx.queues())) == 200
    store.close()


async def test_lanes_commit_at_once_but_the_operations_of_one_key_in_order(
    postgres_url: str,
) -> None:
    """Two connections: while a batch of key s1 is held in its transaction, an operation
    of no key commits on the other connection, and the next of s1 waits for the first."""
    store = Store(postgres_url)
    committer = Committer(store, lanes=[Store(postgres_url)])
    running, held = threading.Event(), threading.Event()
    order: list[str] = []

    def first(tx: Tx) -> None:
        tx.create_queue("first", 0)
        running.set()
        held.wait(30)  # in its transaction, in the committer's thread

    async with trio.open_nursery() as nursery:
        await nursery.start(committer.run)
        committer.submit(first, lambda _: order.append("first of s1"), key="s1")
        await trio.to_thread.run_sync(running.wait, 30)
        committer.submit(
            lambda tx: tx.create_queue("next", 1), lambda _: order.append("next of s1"), key="s1"
        )
        await committer.do(lambda tx: tx.create_queue("other", 2))
        order.append("no key")
        held.set()
        await committer.idle()
        nursery.cancel_scope.cancel()
    assert order == ["no key", "first of s1", "next of s1"]
    assert sorted(store.read(lambda tx: tx.queues())) == ["first", "next", "other"]
    store.close()


async def test_idle_waits_until_everything_submitted_is_answered(tmp_path: Path) -> None:
    store = Store(str(tmp_path / "hub.sqlite3"))
    committer = Committer(store, use_thread=False)
    answers: list[object] = []
    async with trio.open_nursery() as nursery:
        await committer.idle()  # nothing submitted: idle at once
        for n in range(3):
            create = functools.partial(Tx.create_queue, queue_id=f"q{n}", now_ms=n)
            committer.submit(create, answers.append)
        nursery.start_soon(committer.run)
        await committer.idle()
        assert answers == [None, None, None]
        nursery.cancel_scope.cancel()
    store.close()


async def test_a_failing_operation_fails_alone(tmp_path: Path) -> None:
    store = Store(str(tmp_path / "hub.sqlite3"))
    committer = Committer(store, use_thread=False)
    answers: list[object] = []

    def broken(tx: Tx) -> None:
        tx.create_queue("never", 0)
        raise KeyError("a bug")

    async with trio.open_nursery() as nursery:
        committer.submit(lambda tx: tx.create_queue("a", 0), answers.append)
        committer.submit(broken, answers.append)
        committer.submit(lambda tx: tx.create_queue("a", 0), answers.append)  # a duplicate key
        committer.submit(lambda tx: tx.create_queue("b", 0), answers.append)
        nursery.start_soon(committer.run)
        await committer.do(lambda tx: None)
        nursery.cancel_scope.cancel()
    assert answers[0] is None
    assert isinstance(answers[1], StoreError)
    assert "KeyError" in answers[1].reason
    assert isinstance(answers[2], StoreError)
    assert "UNIQUE" in answers[2].reason
    assert answers[3] is None
    assert store.read(lambda tx: tx.queues()) == ["a", "b"]
    store.close()


def test_a_query_sees_the_changes_kept_before_it_in_its_transaction(tmp_path: Path) -> None:
    store = Store(str(tmp_path / "hub.sqlite3"))
    queue_tasks(store, 2)
    credential = Credential(
        credential_id="c1", queue_id="q", rights=frozenset({Right.PRODUCER}), created_at_ms=60
    )

    Seen = tuple[tuple[object, bool], list[TaskState], list[str], list[str], tuple[object, bool]]

    def work(tx: Tx) -> Seen:
        looked_up_before = (tx.credential("c1"), tx.queue_exists("r"))
        offers = offer(
            "q", [CAPABILITY], "w", room=1, now_ms=50, timing=TIMING, new_id=lambda: "a1"
        )(tx)
        task_id = offers[0].task_id
        attempts_of, history = tx.records([task_id])[task_id]
        seen = (
            [task.state for task in tx.tasks_of_queue("q", None, 10)],
            [attempt.attempt_id for attempt in attempts_of],
            [entry.kind for entry in history],
        )
        tx.create_credential(credential, "hash")
        tx.create_queue("r", 60)
        return (looked_up_before, *seen, (tx.credential("c1"), tx.queue_exists("r")))

    before, states, attempts, kinds, after = store.read(work)
    store.close()
    assert before == (None, False)
    assert sorted(states) == [TaskState.OFFERED, TaskState.QUEUED]
    assert attempts == ["a1"]
    assert kinds == ["SUBMITTED", "OFFERED"]
    assert after == ((credential, "hash"), True)


async def test_a_batch_waits_in_a_thread_while_another_connection_holds_the_write_lock(
    tmp_path: Path,
) -> None:
    path = str(tmp_path / "hub.sqlite3")
    store = Store(path)
    committer = Committer(store)
    waiting = trio.Event()
    token = trio.lowlevel.current_trio_token()
    run_batch = store.run_batch

    def run_batch_in_thread(operations: Sequence[Callable[[Tx], T]]) -> list[T]:
        token.run_sync_soon(waiting.set)
        return run_batch(operations)

    store.run_batch = run_batch_in_thread  # type: ignore[method-assign]
    other = sqlite3.connect(path, isolation_level=None)
    other.execute("BEGIN IMMEDIATE")
    async with trio.open_nursery() as nursery:
        nursery.start_soon(committer.run)
        nursery.start_soon(committer.do, lambda tx: tx.create_queue("late", 0))
        await waiting.wait()  # this loop runs on while the batch waits for the lock
        assert other.execute("SELECT count(*) FROM queues").fetchall() == [(0,)]
        other.execute("ROLLBACK")
        await committer.do(lambda tx: None)
        nursery.cancel_scope.cancel()
    other.close()
    assert store.read(lambda tx: tx.queues()) == ["late"]
    store.close()


def test_hubs_sharing_a_postgresql_database_never_offer_a_task_twice(postgres_url: str) -> None:
    hub_url = postgres_url
    setup = Store(hub_url)
    queue_tasks(setup, 300)
    setup.close()
    claimed: dict[str, list[Offer]] = {}

    def hub(name: str) -> None:
        store = Store(hub_url)
        got = claimed.setdefault(name, [])
        while True:
            ids = (f"{name}-{n}" for n in itertools.count(len(got)))
            claim = offer(
                "q", [CAPABILITY], name, room=7, now_ms=10_000, timing=TIMING, new_id=ids.__next__
            )
            batch = store.read(claim)
            if not batch:
                break
            got.extend(batch)
        store.close()

    threads = [threading.Thread(target=hub, args=(f"hub{n}",)) for n in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    tasks = [o.task_id for offers in claimed.values() for o in offers]
    assert len(tasks) == len(set(tasks)) == 300
    assert all(claimed.values()), "every hub claimed some"
