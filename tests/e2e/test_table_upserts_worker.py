"""table_upserts in a real worker: call values become rows of a SQLite table, by key."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

from blockx._proto.blockx.worker import v1 as pb
from tests.e2e.serve_process import serve_process


def rows_task(task_id: str, db: Path, rows: list[dict[str, object]]) -> pb.TaskSpec:
    calls = [{"function": "demo.echo", "args": [row]} for row in rows]
    config = {"database": str(db), "table": "results", "key": "id", "create": True}
    return pb.TaskSpec(
        task_id=task_id,
        function_call=pb.FunctionCallConfig(type="call_list"),
        payload=json.dumps({"calls": calls}).encode(),
        result_handler=pb.ResultHandler(type="table_upserts", config_json=json.dumps(config)),
    )


async def test_a_task_upserts_its_call_values_and_a_retry_writes_each_key_once(
    tmp_path: Path,
) -> None:
    db = tmp_path / "out.db"
    rows: list[dict[str, object]] = [{"id": 1, "word": "one"}, {"id": 2, "word": "two"}]
    async with serve_process("--executors", "1") as worker:
        for task_id in ("first", "retry"):  # a coordinator's retry is a new task, same rows
            await worker.call(
                worker.stub.submit_task, pb.SubmitTaskRequest(task=rows_task(task_id, db, rows))
            )
            [update] = [u for u in await worker.watch(task_id) if u.is_terminal]
            assert update.result is not None
            assert update.result.state == pb.TaskState.SUCCEEDED, update.result.message
            assert update.result.execute_result is not None
            [written] = update.result.execute_result.plugin_results
            assert (written.plugin_type, written.records_written) == ("table_upserts", 2)
    with sqlite3.connect(db) as connection:
        found = connection.execute("select id, word from results order by id").fetchall()
    assert found == [(1, "one"), (2, "two")]
