"""A real hub process: a task past its retention is gone (404), and a credential revoked
by the `blockx hub credential revoke` command loses its worker's session within a second.

Wall-clock time: the hub is another process. Each wait is for a condition,
under a `fail_after`.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import trio

from blockx.hubwire import ErrorCode, Succeeded
from tests.adapters.hub_harness import QUEUE
from tests.e2e.hub_process import hub_process, queue_with_credential
from tests.e2e.serve_process import REPO

ENV = {"HUB_POLL_MS": "20", "LOG_FORMAT": "text"}
FAIL_AFTER_S = 30


async def test_a_task_past_its_retention_answers_404(tmp_path: Path) -> None:
    db = str(tmp_path / "hub.sqlite3")
    token = queue_with_credential(db, QUEUE)
    env = {**ENV, "HUB_TASK_RETENTION_MS": "500"}
    with trio.fail_after(FAIL_AFTER_S):
        async with hub_process(db, env) as hub, hub.worker(token) as worker:
            submitted = await hub.submit(token)
            offer = await worker.claim()
            await worker.finish(offer, Succeeded(result="1"))
            ended = await hub.task(token, submitted["task_id"])
            status = 200
            while status == 200:
                await trio.sleep(0.05)
                status, _ = await hub.http("GET", f"/v1/tasks/{submitted['task_id']}", token=token)
            gone_after_ms = int(time.time() * 1000) - ended["finished_at_ms"]
    assert ended["state"] == "SUCCEEDED"
    assert status == 404
    assert gone_after_ms >= 500


async def test_a_credential_revoked_by_command_loses_its_session_within_a_second(
    tmp_path: Path,
) -> None:
    db = str(tmp_path / "hub.sqlite3")
    token = queue_with_credential(db, QUEUE)
    credential_id = token.removeprefix("bxc_").partition(".")[0]
    with trio.fail_after(FAIL_AFTER_S):
        async with hub_process(db, ENV) as hub, hub.worker(token) as worker:
            revoke = [sys.executable, "-m", "blockx", "hub", "credential", "revoke"]
            done = await trio.run_process(
                [*revoke, credential_id, "--db", db], capture_stdout=True, cwd=REPO
            )
            revoked_at = trio.current_time()
            error = await worker.closed()
            closed_after_s = trio.current_time() - revoked_at
            status, _ = await hub.http("GET", f"/v1/queues/{QUEUE}/tasks", token=token)
    assert done.stdout.decode() == f"credential {credential_id} revoked\n"
    assert error is not None
    assert error.code is ErrorCode.AUTH_FAILED
    assert closed_after_s < 1.0
    assert status == 401
