"""The walk-throughs of the docs against a real worker: `submit --file
examples/tasks/batch.jsonl` and `examples/run_tasks.py`, each in its own process, and the
data walk-through (a CSV scan into SQLite; bundle to bundle)."""

from __future__ import annotations

import json
import shutil
import sqlite3
import subprocess
import sys

import pyarrow.parquet as pq
import trio

from blockx.phases.bundles import verify_bundle
from tests.e2e.serve_process import REPO, serve_process

RUN_TIMEOUT_S = 60


async def run(*argv: str) -> subprocess.CompletedProcess[str]:
    done: subprocess.CompletedProcess[bytes] = await trio.run_process(
        [sys.executable, *argv], cwd=REPO, capture_stdout=True, capture_stderr=True, check=False
    )
    return subprocess.CompletedProcess(
        done.args, done.returncode, done.stdout.decode(), done.stderr.decode()
    )


async def test_submit_a_batch_file_and_the_python_example() -> None:
    with trio.fail_after(RUN_TIMEOUT_S):
        async with serve_process("--executors", "2") as worker:
            address = f"127.0.0.1:{worker.port}"
            batch = await run(
                "-m",
                "blockx",
                "submit",
                "--worker",
                address,
                "--file",
                "examples/tasks/batch.jsonl",
            )
            example = await run("examples/run_tasks.py", address)

    printed = {line["task_id"]: line for line in map(json.loads, batch.stdout.splitlines())}
    assert printed == {
        "batch-sum": {
            "task_id": "batch-sum",
            "state": "SUCCEEDED",
            "failure_code": "",
            "outputs": [42],
        },
        "batch-shout": {
            "task_id": "batch-shout",
            "state": "SUCCEEDED",
            "failure_code": "",
            "outputs": ["HELLO!"],
        },
        "batch-static": {
            "task_id": "batch-static",
            "state": "SUCCEEDED",
            "failure_code": "",
            "outputs": [3, 3, 3],
        },
        "batch-nap": {"task_id": "batch-nap", "state": "SUCCEEDED", "failure_code": ""},
        "batch-fail": {"task_id": "batch-fail", "state": "FAILED", "failure_code": "CALL_RAISED"},
    }
    assert batch.stderr.splitlines()[-1] == "blockx: 5 tasks: 1 failed, 4 succeeded"
    assert batch.returncode == 1
    assert example.returncode == 0, example.stderr
    assert sorted(example.stdout.splitlines()) == [f"py-sum-{i}: [{i + 40}]" for i in range(5)]


async def test_the_data_walk_through_scan_to_sqlite_and_bundle_to_bundle() -> None:
    """The README's data walk-through, as written: the task files write under out/."""
    out = REPO / "out"
    targets = (out / "orders.db", out / "orders", out / "orders-europe")

    def clean() -> None:
        for target in targets:
            if target.is_dir():
                shutil.rmtree(target)
            target.unlink(missing_ok=True)

    clean()
    try:
        with trio.fail_after(RUN_TIMEOUT_S):
            async with serve_process("--executors", "2") as worker:
                address = f"127.0.0.1:{worker.port}"
                for name in ("orders_to_sqlite", "orders_to_bundle", "bundle_to_bundle"):
                    done = await run(
                        "-m", "blockx", "submit", "--worker", address, "--watch",
                        "--file", f"examples/tasks/{name}.json",
                    )  # fmt: skip
                    assert '"state": "TASK_STATE_SUCCEEDED"' in done.stdout, done.stdout
        with sqlite3.connect(out / "orders.db") as connection:
            rows = connection.execute("select * from orders order by id").fetchall()
        assert len(rows) == 8
        assert rows[0] == (1, "Ada Lovelace", 1250, "GB")
        assert [row[0] for row in rows] == [1, 3, 4, 6, 7, 8, 9, 10]
        assert verify_bundle(out / "orders")["rows"] == 10
        europe = verify_bundle(out / "orders-europe")
        assert europe["rows"] == 5
        table = pq.read_table(out / "orders-europe" / europe["files"][0]["path"])
        assert table.column("with_vat_cents").to_pylist() == [1500, 4944, 2399, 1800, 1170]
    finally:
        clean()
