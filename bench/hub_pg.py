"""The hub on PostgreSQL beside a minimal PostgreSQL queue and the hub on SQLite, same run.

    uv run python -m bench.hub_pg [--jobs 20000] [--sustained-s 20] [--profile DIR] [--keep]

One run starts one PostgreSQL server (tests/e2e/postgres_server.py: the
highest version installed, fsync and synchronous_commit on, as by default),
one database per phase, and measures:

* floor_burn_per_s: a queue written here, the least a durable PostgreSQL
  queue does. One table; JOBS rows inserted first, one per transaction (not
  timed; floor_insert_per_s is that rate); then two worker processes, each
  in a loop: claim one row (one statement, one transaction: an UPDATE of the
  row a `SELECT ... FOR UPDATE SKIP LOCKED LIMIT 1` picks) and mark it done
  with a small JSON result (one more, which also `NOTIFY`s its id). Timed
  from the moment the workers are let go (they started and connected
  before) until a count of the rows done, read every 20 ms, reaches JOBS.
* hub_pg_burn_per_s, hub_sqlite_burn_per_s: a `python -m blockx hub` process
  on the server (or on a SQLite file) and two automatic workers of capacity 8
  (`bench/autoworker.py --worker`, a handler that returns its payload). The
  queue is paused, the workers connected, and JOBS tasks submitted with
  `HubClient.submit_many` (not timed); timed from the request that resumes
  the queue until a count of its SUCCEEDED tasks in the database, read every
  20 ms, reaches JOBS.
* hub_pg_two_hubs_burn_per_s: the same with two hub processes on one
  database of the server, one worker on each; the queue is resumed through
  the first, and the second hears of it at once (the resume's commit
  notifies every hub of the database).
* floor_p50_ms, hub_pg_p50_ms, hub_sqlite_p50_ms (and the rates
  floor_sustained_per_s, ...): one producer, one job at a time for
  SUSTAINED_S seconds, each timed from just before its submission to the
  moment the producer knows it is done: for the floor, the insert's
  transaction `NOTIFY`s the workers (which otherwise wait on `LISTEN`) and
  the producer waits for the done's notification; for the hub, the answer
  of `GET /v1/tasks/{id}?wait_ms=...` that shows it SUCCEEDED.
* hub_pg_to_floor, hub_pg_to_sqlite: the burn-down rates' ratios.

Before printing, every job must have ended exactly once: each floor row
claimed once and done once; each of the hub's tasks SUCCEEDED after one
started attempt, with one attempt row (counted in the database).

`--profile DIR` enables `pg_stat_statements` (and WAL sync timing) on the
server and, during the PostgreSQL hub's burn-down, writes the hub's stacks
sampled by py-spy (`hub_pg.pyspy`, collapsed; py-spy pauses the hub for each
sample, so that phase runs slower) and `pg_profile.txt`: the
statements by total time (calls and milliseconds per task), commits, WAL
syncs and their time, and what the server's backends were doing, sampled
every 10 ms from `pg_stat_activity` (running, waiting for the client, for a
lock, for the WAL); `postgres.log` holds the plans of statements slower than 2 ms.

Prints each figure as `RESULT name=<figure> value=<number>`; asserts nothing timed.
Targets (2 cores): hub_pg_to_floor >= 1.0, hub_pg_to_sqlite >= 0.8,
hub_pg_p50_ms <= 2 x floor_p50_ms, hub_pg_two_hubs_burn_per_s >= hub_pg_burn_per_s.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import os
import shutil
import signal
import statistics
import sys
import threading
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any, Final

import psycopg
import trio

from bench.autoworker import (
    CAPABILITY,
    QUEUE,
    open_hub,
    open_logged,
    open_worker,
    prepare,
    profiled,
    result,
    run_in_a_directory,
    stop,
    task_latencies,
)
from blockx.autoworker import HubClient, task_submission
from blockx.hub import Right, Store, create_credential, pause_queue
from tests.e2e.postgres_server import PostgresServer, create_database, postgres_server

DONE_POLL_S: Final = 0.02
WAIT_MS: Final = 10_000
WORKERS: Final = 2
CAPACITY: Final = 8
PHASE_TIMEOUT_S: Final = 900.0
FLOOR_IDLE_WAIT_S: Final = 0.5
"""How long an idle floor worker waits for a notification before it looks again anyway."""
ACTIVITY_SAMPLE_S: Final = 0.01
SLOW_PLAN_MS: Final = 2
SUSTAINED_CHUNK: Final = 20
"""Jobs between two looks at the clock in a sustained phase."""

FLOOR_SCHEMA: Final = """
    CREATE TABLE floor_jobs (
        id BIGSERIAL PRIMARY KEY,
        state TEXT NOT NULL DEFAULT 'queued',
        payload TEXT NOT NULL,
        result TEXT,
        claims INTEGER NOT NULL DEFAULT 0,
        dones INTEGER NOT NULL DEFAULT 0
    );
    CREATE INDEX floor_jobs_queued ON floor_jobs (id) WHERE state = 'queued'
"""
FLOOR_INSERT: Final = """
    WITH job AS (INSERT INTO floor_jobs (payload) VALUES (%s) RETURNING id)
    SELECT id, pg_notify('floor_jobs', '') FROM job
"""
FLOOR_CLAIM: Final = """
    UPDATE floor_jobs SET state = 'running', claims = claims + 1
    WHERE id = (
        SELECT id FROM floor_jobs WHERE state = 'queued' ORDER BY id LIMIT 1
        FOR UPDATE SKIP LOCKED
    )
    RETURNING id, payload
"""
FLOOR_DONE: Final = """
    WITH job AS (
        UPDATE floor_jobs SET state = 'done', dones = dones + 1, result = %s
        WHERE id = %s RETURNING id
    )
    SELECT pg_notify('floor_done', id::text) FROM job
"""


# ------------------------------------------------------------------------ the floor


def floor_work(dsn: str, go: Path) -> None:
    """`--floor-worker` mode: claim and finish rows until killed, each step one transaction."""
    with psycopg.connect(dsn, autocommit=True) as connection:
        connection.execute("LISTEN floor_jobs")
        print("worker running", flush=True)
        while not go.exists():
            time.sleep(0.005)
        while True:
            claimed = connection.execute(FLOOR_CLAIM).fetchone()
            if claimed is None:
                for _ in connection.notifies(timeout=FLOOR_IDLE_WAIT_S, stop_after=1):
                    pass
                continue
            job_id, payload = claimed
            connection.execute(FLOOR_DONE, (json.dumps({"echo": payload}), job_id))


def floor_insert(dsn: str, count: int) -> float:
    """`count` rows, one per transaction; seconds taken."""
    with psycopg.connect(dsn, autocommit=True) as connection:
        started = time.perf_counter()
        for n in range(count):
            connection.execute(FLOOR_INSERT, (json.dumps({"n": n}),))
        return time.perf_counter() - started


def floor_latencies(dsn: str, seconds: float) -> list[float]:
    """One job at a time for `seconds`: insert -> its done's notification, in ms."""
    latencies: list[float] = []
    with psycopg.connect(dsn, autocommit=True) as connection:
        connection.execute("LISTEN floor_done")
        deadline = time.perf_counter() + seconds
        while time.perf_counter() < deadline:
            started = time.perf_counter()
            row = connection.execute(FLOOR_INSERT, ('{"n": 0}',)).fetchone()
            assert row is not None
            for note in connection.notifies(timeout=WAIT_MS / 1000):
                if note.payload == str(row[0]):
                    break
            else:
                raise SystemExit(f"floor job {row[0]} was not done in {WAIT_MS} ms")
            latencies.append((time.perf_counter() - started) * 1000)
    return latencies


def floor_counts(connection: psycopg.Connection[Any]) -> tuple[int, int, int]:
    """Rows; rows done once and claimed once; rows done."""
    row = connection.execute(
        "SELECT COUNT(*), COUNT(*) FILTER (WHERE state = 'done' AND claims = 1 AND dones = 1),"
        " COUNT(*) FILTER (WHERE state = 'done') FROM floor_jobs"
    ).fetchone()
    assert row is not None
    return int(row[0]), int(row[1]), int(row[2])


async def floor(
    args: argparse.Namespace, dsn: str, directory: Path
) -> tuple[float, float, list[float]]:
    """The floor's insert rate, burn-down rate and sustained latencies; checked."""
    with psycopg.connect(dsn, autocommit=True) as connection:
        for statement in FLOOR_SCHEMA.split(";"):
            connection.execute(statement)
    inserting_s = await trio.to_thread.run_sync(floor_insert, dsn, args.jobs)
    go = directory / "floor.go"
    command = [sys.executable, "-m", "bench.hub_pg", "--floor-worker", dsn, "--go", str(go)]
    workers = [
        await open_logged(command, dict(os.environ), b"worker running", directory / f"f{n}.log")
        for n in range(WORKERS)
    ]
    with psycopg.connect(dsn, autocommit=True) as connection:
        try:
            started = time.perf_counter()
            go.touch()
            while (await trio.to_thread.run_sync(floor_counts, connection))[2] < args.jobs:
                await trio.sleep(DONE_POLL_S)
            burn_s = time.perf_counter() - started
            latencies = await trio.to_thread.run_sync(floor_latencies, dsn, args.sustained_s)
        finally:
            for process in workers:
                await stop(process)
        rows, once, _ = floor_counts(connection)
    if rows != args.jobs + len(latencies) or once != rows:
        raise SystemExit(f"floor: {rows} rows, {once} claimed and done exactly once")
    return args.jobs / inserting_s, args.jobs / burn_s, latencies


# ------------------------------------------------------------------------ the hub


def hub_counts(db: str) -> tuple[int, int]:
    """Tasks of QUEUE; those SUCCEEDED after exactly one attempt (one started, one row)."""
    store = Store(db)
    try:
        rows = store.read(
            lambda tx: tx.rows(
                "SELECT COUNT(*), SUM(CASE WHEN t.state = 'SUCCEEDED' AND t.started_attempts = 1"
                " AND (SELECT COUNT(*) FROM attempts a WHERE a.task_id = t.task_id) = 1"
                " THEN 1 ELSE 0 END) FROM tasks t WHERE t.queue_id = ?",
                QUEUE,
            )
        )
        return int(rows[0][0]), int(rows[0][1] or 0)
    finally:
        store.close()


def succeeded(store: Store) -> int:
    rows = store.read(
        lambda tx: tx.rows(
            "SELECT COUNT(*) FROM tasks WHERE queue_id = ? AND state = 'SUCCEEDED'", QUEUE
        )
    )
    return int(rows[0][0])


def prepare_paused(db: str) -> tuple[str, str]:
    """QUEUE paused; a producer and worker credential, and an admin one."""
    token = prepare(db)
    store = Store(db)
    try:
        pause_queue(store, QUEUE, True)
        return token, create_credential(store, QUEUE, frozenset({Right.ADMIN}), 0)
    finally:
        store.close()


@contextlib.asynccontextmanager
async def hubs_and_workers(
    db: str, count: int, token: str, directory: Path, name: str
) -> AsyncIterator[tuple[list[str], list[trio.Process]]]:
    """`count` hub processes on `db` and WORKERS automatic workers spread over them."""
    processes: list[trio.Process] = []
    urls: list[str] = []
    try:
        for n in range(count):
            url, hub = await open_hub(db, directory, name=f"{name}-hub{n}")
            processes.append(hub)
            urls.append(url)
        hubs = list(processes)
        for n in range(WORKERS):
            log = directory / f"{name}-worker{n}.log"
            processes.insert(0, await open_worker(urls[n % count], token, CAPACITY, log))
        yield urls, hubs
    finally:
        for process in processes:
            await stop(process)


async def submit(url: str, token: str, jobs: int) -> None:
    """`jobs` tasks to the paused QUEUE, in batches."""
    client = HubClient(url=url, credential=token, keep_alive=True)
    try:
        documents = (task_submission(CAPABILITY, {"n": n}) for n in range(jobs))
        answers = await client.submit_many(QUEUE, documents)
    finally:
        await client.aclose()
    if refused := [answer for answer in answers if answer["status"] != 201]:
        raise SystemExit(f"{len(refused)} submissions refused, the first: {refused[0]}")


async def burn_down(url: str, admin_token: str, db: str, jobs: int) -> float:
    """Resume QUEUE; seconds until `jobs` of its tasks SUCCEEDED."""
    admin = HubClient(url=url, credential=admin_token)
    store = Store(db)
    try:
        started = time.perf_counter()
        await admin.request("POST", f"/v1/queues/{QUEUE}:resume")
        while await trio.to_thread.run_sync(succeeded, store) < jobs:
            await trio.sleep(DONE_POLL_S)
        return time.perf_counter() - started
    finally:
        store.close()
        await admin.aclose()


async def sustained(url: str, token: str, seconds: float) -> list[float]:
    """One task at a time for `seconds`: submit -> SUCCEEDED, in ms."""
    client = HubClient(url=url, credential=token, keep_alive=True)
    latencies: list[float] = []
    try:
        deadline = time.perf_counter() + seconds
        while time.perf_counter() < deadline:
            latencies += await task_latencies(client, SUSTAINED_CHUNK, WAIT_MS)
    finally:
        await client.aclose()
    return latencies


async def hub(
    args: argparse.Namespace, db: str, directory: Path, name: str, hubs: int = 1
) -> tuple[float, list[float]]:
    """The burn-down rate of `hubs` hubs on `db` and (with one hub) sustained latencies."""
    tokens = await trio.to_thread.run_sync(prepare_paused, db)
    latencies: list[float] = []
    async with hubs_and_workers(db, hubs, tokens[0], directory, name) as (urls, processes):
        profile = args.profile and name == "pg"
        await submit(urls[0], tokens[0], args.jobs)
        with (
            profiled(str(args.profile / "hub_pg.pyspy") if profile else None, processes[0].pid),
            server_activity(db if profile else None) as activity,
        ):
            seconds = await burn_down(urls[0], tokens[1], db, args.jobs)
        if profile:
            await trio.to_thread.run_sync(write_profile, args.profile, db, args.jobs, activity)
        if hubs == 1:
            latencies = await sustained(urls[0], tokens[0], args.sustained_s)
    tasks, once = await trio.to_thread.run_sync(hub_counts, db)
    if tasks != args.jobs + len(latencies) or once != tasks:
        raise SystemExit(f"hub {name}: {tasks} tasks, {once} SUCCEEDED after exactly one attempt")
    return args.jobs / seconds, latencies


# ------------------------------------------------------------------------ the profile


@contextlib.contextmanager
def server_activity(dsn: str | None) -> Iterator[collections.Counter[str]]:
    """What the server's client backends do, sampled from pg_stat_activity while the block
    runs (the server's statistics reset at its start); the counts by state and wait event."""
    samples: collections.Counter[str] = collections.Counter()
    if dsn is None:
        yield samples
        return
    done = threading.Event()

    def sample() -> None:
        with psycopg.connect(dsn, autocommit=True) as connection:
            while not done.wait(ACTIVITY_SAMPLE_S):
                for state, event in connection.execute(
                    "SELECT state, COALESCE(wait_event_type || ':' || wait_event, 'on CPU')"
                    " FROM pg_stat_activity WHERE backend_type = 'client backend'"
                    " AND pid <> pg_backend_pid() AND datname = current_database()"
                ):
                    samples[f"{state} / {event}"] += 1
                samples["(samples)"] += 1

    with psycopg.connect(dsn, autocommit=True) as connection:
        connection.execute("SELECT pg_stat_statements_reset()")
        connection.execute("SELECT pg_stat_reset_shared('wal')")
        connection.execute("SELECT pg_stat_reset()")
    thread = threading.Thread(target=sample, name="activity")
    thread.start()
    try:
        yield samples
    finally:
        done.set()
        thread.join()


def write_profile(directory: Path, dsn: str, jobs: int, activity: collections.Counter[str]) -> None:
    """`pg_profile.txt`: statements, commits, WAL syncs and backend activity, per task."""
    with psycopg.connect(dsn, autocommit=True) as connection:
        statements = connection.execute(
            "SELECT calls, total_exec_time, rows, query FROM pg_stat_statements"
            " WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())"
            " ORDER BY total_exec_time DESC"
        ).fetchall()
        database = connection.execute(
            "SELECT xact_commit, xact_rollback FROM pg_stat_database"
            " WHERE datname = current_database()"
        ).fetchone()
        wal = connection.execute(
            "SELECT wal_records, wal_bytes, wal_write, wal_sync, wal_sync_time, wal_write_time"
            " FROM pg_stat_wal"
        ).fetchone()
    assert database is not None
    assert wal is not None
    lines = [
        f"tasks {jobs}; statements {sum(row[0] for row in statements) / jobs:.2f} per task, "
        f"{sum(row[1] for row in statements) / jobs:.3f} ms per task in the server",
        f"commits {database[0] / jobs:.3f} per task, rollbacks {database[1]}",
        f"WAL: {wal[0] / jobs:.1f} records and {wal[1] / jobs:.0f} bytes per task; "
        f"{wal[3]} syncs ({wal[3] / jobs:.3f} per task), {wal[4]:.0f} ms syncing, "
        f"{wal[2]} writes, {wal[5]:.0f} ms writing",
        "",
        "backends (client, this database) sampled every 10 ms, state / wait event: "
        "mean backends in it",
    ]
    sampled = max(1, activity.pop("(samples)", 0))
    lines += [f"  {count / sampled:6.3f}  {key}" for key, count in activity.most_common()]
    lines += ["", "calls/task  ms/task  ms/call  rows/call  statement"]
    lines += [
        f"{calls / jobs:9.3f}  {total / jobs:7.4f}  {total / calls:7.4f}  {rows / calls:9.2f}  "
        + " ".join(query.split())[:220]
        for calls, total, rows, query in statements
        if calls
    ]
    (directory / "pg_profile.txt").write_text("\n".join(lines) + "\n")


async def enable_statements(server: PostgresServer) -> None:
    """Restart `server` with pg_stat_statements loaded, WAL timing on, and the plans of
    statements slower than SLOW_PLAN_MS logged (auto_explain)."""
    with psycopg.connect(server.admin_url, autocommit=True) as connection:
        connection.execute(
            "ALTER SYSTEM SET shared_preload_libraries = pg_stat_statements, auto_explain"
        )
        connection.execute("ALTER SYSTEM SET track_wal_io_timing = on")
        connection.execute("LOAD 'auto_explain'")  # so that ALTER SYSTEM knows its settings
        connection.execute(f"ALTER SYSTEM SET auto_explain.log_min_duration = {SLOW_PLAN_MS}")
    await server.stop()
    await server.start()


# ------------------------------------------------------------------------ the run


def p50(values: list[float]) -> float:
    return statistics.median(values)


async def run(args: argparse.Namespace, directory: Path) -> None:
    async with postgres_server(directory / "postgres") as server:
        if args.profile:
            args.profile.mkdir(parents=True, exist_ok=True)
            await enable_statements(server)
        for name in ("floor", "pg", "two_hubs"):
            await trio.to_thread.run_sync(create_database, server.admin_url, f"bench_{name}")
            if args.profile:
                with psycopg.connect(server.url.replace(server.dbname, f"bench_{name}")) as c:
                    c.execute("CREATE EXTENSION pg_stat_statements")

        def url(name: str) -> str:
            return server.url.replace(server.dbname, f"bench_{name}")

        with trio.fail_after(PHASE_TIMEOUT_S):
            insert_per_s, floor_per_s, floor_ms = await floor(args, url("floor"), directory)
            pg_per_s, pg_ms = await hub(args, url("pg"), directory, "pg")
            sqlite_per_s, sqlite_ms = await hub(
                args, str(directory / "hub.sqlite3"), directory, "sqlite"
            )
            two_per_s, _ = await hub(args, url("two_hubs"), directory, "two", hubs=2)
        if args.profile:
            shutil.copy(server.log_path, args.profile / "postgres.log")
    result("floor_insert_per_s", insert_per_s)
    result("floor_burn_per_s", floor_per_s)
    result("hub_pg_burn_per_s", pg_per_s)
    result("hub_sqlite_burn_per_s", sqlite_per_s)
    result("hub_pg_two_hubs_burn_per_s", two_per_s)
    result("floor_p50_ms", p50(floor_ms), 2)
    result("hub_pg_p50_ms", p50(pg_ms), 2)
    result("hub_sqlite_p50_ms", p50(sqlite_ms), 2)
    result("floor_sustained_per_s", len(floor_ms) / args.sustained_s)
    result("hub_pg_sustained_per_s", len(pg_ms) / args.sustained_s)
    result("hub_sqlite_sustained_per_s", len(sqlite_ms) / args.sustained_s)
    result("hub_pg_to_floor", pg_per_s / floor_per_s, 2)
    result("hub_pg_to_sqlite", pg_per_s / sqlite_per_s, 2)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--sustained-s", type=float, default=20.0)
    parser.add_argument(
        "--profile", type=Path, metavar="DIR", help="py-spy and pg_stat_statements of the PG hub"
    )
    parser.add_argument("--keep", action="store_true", help="keep the directory (logs, databases)")
    parser.add_argument("--floor-worker", metavar="DSN", help=argparse.SUPPRESS)
    parser.add_argument("--go", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.floor_worker:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        floor_work(args.floor_worker, args.go)
        return
    run_in_a_directory(run, args, "blockx-bench-hub-pg-")


if __name__ == "__main__":
    main()
