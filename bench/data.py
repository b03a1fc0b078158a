"""A DuckDB scan streamed through calls into SQLite, beside DuckDB doing it in pure SQL.

    uv run python bench/data.py [--rows 1000000] [--rows-per-call 1000] [--executors 2]

One run writes a Parquet file of `--rows` rows (id, name, amount) and measures,
in this order, on the same SQLite table (`results`, id primary key):

* sql_floor_rows_per_s: DuckDB alone, in this process: the SQLite file
  attached through the sqlite scanner, `INSERT INTO results SELECT id,
  upper(name), amount * 2 FROM read_parquet(...)`, start -> commit. The table
  is emptied afterwards.
* scan_rows_per_s: a worker process (`python -m blockx serve`,
  streamBuild.enabled) runs one task: the `dbscan` builder reads the same
  Parquet file, one call of `benchdata.transform` per `--rows-per-call` rows
  (rows as value arrays; it uppercases the name and doubles the amount, as
  the SQL does, and returns value arrays), and the `table_upserts` writer
  (`columns` set) upserts every row into the table; submit -> terminal
  update. The rows in the table are then checked against the SQL's.
* scan_peak_rss_mb: the worker process's peak RSS (VmHWM) after the task, MiB;
  scan_executor_peak_rss_mb: the largest executor's, for comparison.

Targets (issue 13): scan_rows_per_s >= 0.25 x sql_floor_rows_per_s;
scan_peak_rss_mb <= 400. Prints each figure as `RESULT name=<figure>
value=<number>`; never asserts.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import duckdb
from grpclib.client import Channel
from serve import HOST, START_TIMEOUT_S, WORKER_ENV, WorkerProcess, free_port, result

from blockx._proto.blockx.worker import v1 as pb
from blockx.phases.builders._dbscan import _load_scanner

REPO = Path(__file__).resolve().parents[1]
MIB = 2**20
TASK_TIMEOUT_S = 600
FUNCTION = """
def transform(rows):
    return [[id, name.upper(), amount * 2] for id, name, amount in rows]
"""
TABLE = "CREATE TABLE results (id INTEGER PRIMARY KEY, name TEXT, amount REAL)"


def write_source(path: Path, rows: int) -> None:
    duckdb.sql(
        f"COPY (SELECT range AS id, 'name-' || (range % 9973) AS name, "
        f"(range % 1000) / 10.0 AS amount FROM range({rows})) TO '{path}' (FORMAT parquet)"
    )


def sql_floor(source: Path, database: Path) -> float:
    """DuckDB's own rate, rows/s, for the same transformation into the same table."""
    connection = duckdb.connect()
    _load_scanner(connection, "sqlite")
    connection.execute(f"ATTACH '{database}' AS s (TYPE sqlite)")
    started = time.perf_counter()
    connection.execute("BEGIN")
    inserted = connection.execute(
        f"INSERT INTO s.results SELECT id, upper(name), amount * 2 FROM read_parquet('{source}')"
    ).fetchone()
    connection.execute("COMMIT")
    elapsed = time.perf_counter() - started
    connection.close()
    assert inserted is not None
    return int(inserted[0]) / elapsed


def peak_rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024 / MIB
    return 0.0


def children(pid: int) -> list[int]:
    """The child processes of `pid`, whichever of its threads started them."""
    found = []
    for thread in Path(f"/proc/{pid}/task").iterdir():
        found.extend(int(child) for child in (thread / "children").read_text().split())
    return found


async def start(port: int, functions: Path, executors: int) -> WorkerProcess:
    command = [
        *(sys.executable, "-m", "blockx", "serve", "--listen", f"{HOST}:{port}"),
        *("--executors", str(executors), "--functions", str(functions)),
    ]
    stderr_fd, worker_stderr = os.pipe()
    try:
        process = await asyncio.create_subprocess_exec(
            *command,
            stderr=worker_stderr,
            stdout=subprocess.DEVNULL,
            cwd=REPO,
            env={**WORKER_ENV, "STREAM_BUILD_ENABLED": "true"},
        )
    finally:
        os.close(worker_stderr)
    worker = WorkerProcess(process, port, stderr_fd)
    try:
        async with asyncio.timeout(START_TIMEOUT_S):
            await worker.ready.wait()
    except TimeoutError:
        await worker.stop()
        raise SystemExit(f"the worker did not get ready:\n{worker.tail()}") from None
    return worker


async def scan(source: Path, database: Path, args: argparse.Namespace) -> tuple[float, int]:
    """Run the scan task in a worker; its rows/s, and the worker's pid."""
    functions = Path(tempfile.mkdtemp(prefix="blockx-bench-functions-"))
    (functions / "benchdata.py").write_text(FUNCTION)
    worker = await start(free_port(), functions, args.executors)
    channel = Channel(HOST, worker.port)
    try:
        stub = pb.WorkerServiceStub(channel)
        config = {
            "query": f"SELECT id, name, amount FROM read_parquet('{source}')",
            "function": "benchdata.transform",
            "rows_per_call": args.rows_per_call,
            "rows": "tuples",
        }
        writer = {
            "database": str(database),
            "table": "results",
            "key": "id",
            "columns": ["id", "name", "amount"],
        }
        task = pb.TaskSpec(
            task_id="scan",
            function_call=pb.FunctionCallConfig(type="dbscan", config_json=json.dumps(config)),
            result_handler=pb.ResultHandler(type="table_upserts", config_json=json.dumps(writer)),
            task_timeout_ms=TASK_TIMEOUT_S * 1000,
        )
        started = time.perf_counter()
        await stub.submit_task(pb.SubmitTaskRequest(task=task))
        terminal = None
        async for update in stub.watch_tasks(pb.WatchTasksRequest(task_ids=["scan"])):
            if update.is_terminal:
                terminal = update
        elapsed = time.perf_counter() - started
        if terminal is None or terminal.state != pb.TaskState.SUCCEEDED:
            raise SystemExit(f"the scan task did not succeed: {terminal}\n{worker.tail()}")
        rate = args.rows / elapsed
        result("scan_peak_rss_mb", peak_rss_mib(worker.process.pid), 1)
        executors = [peak_rss_mib(pid) for pid in children(worker.process.pid)]
        result("scan_executor_peak_rss_mb", max(executors, default=0.0), 1)
        if terminal.result is not None and terminal.result.timings is not None:
            timings = terminal.result.timings
            print(
                f"# worker phases: builder {timings.builder_ms} ms, calls {timings.calls_ms} ms, "
                f"plugin {timings.plugin_ms} ms",
                file=sys.stderr,
            )
        return rate, worker.process.pid
    finally:
        channel.close()
        await worker.stop()


def rows_of(database: Path) -> list[tuple[object, ...]]:
    with sqlite3.connect(database) as connection:
        return connection.execute("SELECT * FROM results ORDER BY id").fetchall()


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--rows-per-call", type=int, default=1000)
    parser.add_argument("--executors", type=int, default=2)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="blockx-bench-data-") as scratch:
        source, database = Path(scratch) / "source.parquet", Path(scratch) / "out.db"
        write_source(source, args.rows)
        with sqlite3.connect(database) as connection:
            connection.execute(TABLE)
        floor = sql_floor(source, database)
        expected = rows_of(database)
        with sqlite3.connect(database) as connection:
            connection.execute("DELETE FROM results")
        result("sql_floor_rows_per_s", floor, 0)
        rate, _ = await scan(source, database, args)
        result("scan_rows_per_s", rate, 0)
        result("scan_to_floor_ratio", rate / floor, 3)
        if rows_of(database) != expected:
            raise SystemExit("the worker's rows differ from the SQL's")


if __name__ == "__main__":
    asyncio.run(main())
