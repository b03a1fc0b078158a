"""The writers' promises when the worker is SIGKILLed in the middle of a write.

The worker runs a task whose writer takes a while (many rows); the test
watches the file system for the write in progress (SQLite's rollback journal,
the bundle's staging directory), kills the worker there, and checks what a
reader finds afterwards.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
from collections.abc import Callable
from pathlib import Path

import trio

from blockx._proto.blockx.worker import v1 as pb
from blockx.phases.bundles import verify_bundle, write_bundle
from tests.e2e.serve_process import serve_process

ROWS = 100_000  # the static builder's most
POLL_S = 0.002


def many_rows_task(
    task_id: str, row: dict[str, object], plugin: str, config: object
) -> pb.TaskSpec:
    """`ROWS` calls of demo.echo(row): as many outputs, all alike."""
    static = {"function": "demo.echo", "args": [row], "count": ROWS}
    return pb.TaskSpec(
        task_id=task_id,
        function_call=pb.FunctionCallConfig(type="static", config_json=json.dumps(static)),
        result_handler=pb.ResultHandler(type=plugin, config_json=json.dumps(config)),
    )


async def kill_when(worker_pid: int, writing: Callable[[], bool]) -> None:
    """SIGKILL the worker once `writing()` holds (the write is under way)."""
    with trio.fail_after(60):
        while not writing():
            await trio.sleep(POLL_S)
    os.kill(worker_pid, signal.SIGKILL)


async def test_a_worker_killed_mid_upsert_leaves_the_table_as_it_was(tmp_path: Path) -> None:
    db = tmp_path / "out.db"
    with sqlite3.connect(db) as connection:
        connection.execute("create table results (id integer primary key, word text)")
        connection.execute("insert into results values (0, 'before')")
    journal = Path(f"{db}-journal")
    config = {"database": str(db), "table": "results", "key": "id"}
    task = many_rows_task("big", {"id": 1, "word": "during"}, "table_upserts", config)
    async with serve_process("--executors", "2") as worker:
        await worker.call(worker.stub.submit_task, pb.SubmitTaskRequest(task=task))
        await kill_when(worker.process.pid, journal.exists)
        await worker.process.wait()
    with sqlite3.connect(db) as connection:  # the hot journal is rolled back on opening
        rows = connection.execute("select id, word from results order by id").fetchall()
    assert rows == [(0, "before")]


async def test_a_worker_killed_mid_bundle_write_leaves_no_partial_bundle(tmp_path: Path) -> None:
    target = tmp_path / "bundles" / "out"
    write_bundle(target, "earlier", [{"id": 0, "word": "before"}])
    row = {"id": 1, "word": "x" * 100}
    task = many_rows_task("big", row, "bundle_write", {"path": str(target)})

    def staging() -> bool:
        return any(p.name.startswith(".out.tmp-") for p in target.parent.iterdir())

    async with serve_process("--executors", "2") as worker:
        await worker.call(worker.stub.submit_task, pb.SubmitTaskRequest(task=task))
        await kill_when(worker.process.pid, staging)
        await worker.process.wait()
    manifest = verify_bundle(target)  # the earlier bundle, whole: checksums and rows agree
    assert (manifest["task_id"], manifest["rows"]) == ("earlier", 1)
    # The staging directory the kill interrupted is still there, beside the bundle: the
    # kill came mid-write. Readers never look there (its name is hidden and not the path).
    assert [p.name[:9] for p in target.parent.iterdir() if p != target] == [".out.tmp-"]
