"""The README's RunTasks walk-through against a real worker: `submit --file
examples/tasks/batch.jsonl` and `examples/run_tasks.py`, each in its own process."""

from __future__ import annotations

import json
import subprocess
import sys

import trio

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
