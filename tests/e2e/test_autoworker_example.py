"""examples/autoworker_normalize.py, in its own process, against a real hub process.

The set-up is the one its docstring gives (a queue and a credential with both
rights, made on the hub's database); the output must be exactly the documented
walk-through's: one line per task in the order submitted, then the drain's line.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import trio

from tests.e2e.hub_process import hub_process, queue_with_credential
from tests.e2e.serve_process import REPO

RUN_TIMEOUT_S = 90
TASK_LINE = re.compile(r'task=([0-9a-f]{32}) state=SUCCEEDED result=(\{"text":"[A-Z ]+"\})')


async def run_example(url: str, env: dict[str, str]) -> subprocess.CompletedProcess[bytes]:
    environment = {k: v for k, v in os.environ.items() if not k.startswith("BLOCKX_HUB_")}
    environment.update(env, BLOCKX_HUB_URL=url)
    done: subprocess.CompletedProcess[bytes] = await trio.run_process(
        [sys.executable, "examples/autoworker_normalize.py"],
        cwd=REPO,
        env=environment,
        capture_stdout=True,
        capture_stderr=True,
        check=False,
    )
    return done


async def test_the_example_prints_the_documented_walk_through(tmp_path: Path) -> None:
    db = str(tmp_path / "hub.sqlite3")
    token = queue_with_credential(db, "text")
    credentials = tmp_path / "worker.credential"
    credentials.write_text(token + "\n")
    with trio.fail_after(RUN_TIMEOUT_S):
        async with hub_process(db, {"LOG_FORMAT": "text"}) as hub:
            url = f"http://127.0.0.1:{hub.port}"
            first = await run_example(url, {"BLOCKX_HUB_CREDENTIALS_FILE": str(credentials)})
            again = await run_example(url, {"BLOCKX_HUB_CREDENTIAL": token})

    for done in (first, again):
        assert done.returncode == 0, done.stderr.decode()
        *tasks, last = done.stdout.decode().splitlines()
        matched = [TASK_LINE.fullmatch(line) for line in tasks]
        assert all(matched), tasks
        assert [m[2] for m in matched if m] == [
            '{"text":"HELLO HUB"}',
            '{"text":"AUTOMATIC WORKER"}',
            '{"text":"DURABLE RESULT"}',
        ]
        assert len({m[1] for m in matched if m}) == 3
        assert last == "worker_drained=true started=3 confirmed=3 running=0"
