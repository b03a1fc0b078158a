"""Scans through a real worker: a 1,000,000-row dbscan whose calls start while it reads in
bounded memory, and the bundle profile streaming a bundle into its table database."""

from __future__ import annotations

import datetime
import json
import sqlite3
from pathlib import Path

import trio

from blockx._proto.blockx.worker import v1 as pb
from blockx.phases.bundles import write_bundle
from tests.e2e.serve_process import serve_process

ROWS = 1_000_000
RSS_BOUND_MB = 300
"""The worker's peak RSS for the whole scan; measured: 130 MB (idle: about 105 MB)."""
FUNCTIONS = '''
import os
import time


def count(marker, rows):
    """How many rows this call got; the first call of all leaves its time in `marker`."""
    try:
        descriptor = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        pass
    else:
        os.write(descriptor, repr(time.time()).encode())
        os.close(descriptor)
    return len(rows)
'''


def peak_rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    raise AssertionError(f"no VmHWM for {pid}")


async def test_a_million_row_scan_streams_through_calls_in_bounded_memory(
    tmp_path: Path,
) -> None:
    functions = tmp_path / "functions"
    functions.mkdir()
    (functions / "scan.py").write_text(FUNCTIONS)
    marker = tmp_path / "first-call"
    config = {
        "query": f"SELECT range AS id, 'row-' || range AS name FROM range({ROWS})",
        "function": "scan.count",
        "args": [str(marker)],
        "rows_per_call": 1000,
        "rows": "tuples",
    }
    task = pb.TaskSpec(
        task_id="scan",
        function_call=pb.FunctionCallConfig(type="dbscan", config_json=json.dumps(config)),
        result_handler=pb.ResultHandler(type="result"),
    )
    env = {"STREAM_BUILD_ENABLED": "true"}
    async with serve_process("--functions", str(functions), env=env) as worker:
        await worker.call(worker.stub.submit_task, pb.SubmitTaskRequest(task=task))
        [update] = [u for u in await worker.watch("scan") if u.is_terminal]
        peak = peak_rss_mb(worker.process.pid)
        with trio.fail_after(10):
            await worker.wait_for_line("streamed")
        [ended] = [json.loads(line) for line in worker.log if "streamed" in line]
    result = update.result
    assert result is not None
    assert result.state == pb.TaskState.SUCCEEDED, result.message
    counts = json.loads(result.outputs_json)
    assert (len(counts), sum(counts)) == (1000, ROWS)
    assert peak < RSS_BOUND_MB, f"the worker's peak RSS was {peak:.0f} MB"
    # The first call ran before the builder read its last rows.
    first_call = float(marker.read_text())
    assert ended["msg"] == "task scan: builder 'dbscan' streamed 1000 calls"
    stream_end = datetime.datetime.fromisoformat(ended["ts"].replace("Z", "+00:00"))
    assert first_call < stream_end.timestamp(), (first_call, ended)


async def test_the_bundle_profile_streams_a_bundle_into_its_table_database(
    tmp_path: Path,
) -> None:
    root, database = tmp_path / "bundles", tmp_path / "tables.db"
    rows = [{"id": n, "word": f"w{n}"} for n in range(2500)]
    write_bundle(root / "in", "t0", rows, rows_per_file=1000)
    config = {"path": "in", "function": "demo.echo", "rows_per_call": 100}
    writer = {"table": "words", "key": "id", "create": True}  # into io.tableDatabase
    task = pb.TaskSpec(
        task_id="load",
        function_call=pb.FunctionCallConfig(type="bundleScan", config_json=json.dumps(config)),
        result_handler=pb.ResultHandler(type="tableUpserts", config_json=json.dumps(writer)),
    )
    env = {"BUNDLE_ROOT": str(root), "TABLE_UPSERTS_DATABASE": str(database)}
    async with serve_process("--profile", "bundle", env=env) as worker:
        await worker.call(worker.stub.submit_task, pb.SubmitTaskRequest(task=task))
        [update] = [u for u in await worker.watch("load") if u.is_terminal]
        with trio.fail_after(10):
            await worker.wait_for_line("streamed 25 calls")  # streaming is the profile's default
    assert update.result is not None
    assert update.result.state == pb.TaskState.SUCCEEDED, update.result.message
    with sqlite3.connect(database) as connection:
        stored = connection.execute("select id, word from words order by id").fetchall()
    assert stored == [(row["id"], row["word"]) for row in rows]
