"""`blockx hub task list|retry|resolve|cancel` against a real hub process: an operator
retries one task that needs review and resolves another, and `hub task show` tells
both with the credential that acted."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import trio

from blockx.hub import Right, Store, create_credential, create_queue
from blockx.hubwire import Succeeded, Unknown
from tests.adapters.hub_harness import QUEUE
from tests.e2e.hub_process import hub_process
from tests.e2e.serve_process import REPO


async def blockx(*argv: str) -> Any:
    """Run `blockx hub task ...`; its printed JSON."""
    environment = {k: v for k, v in os.environ.items() if not k.startswith("HUB_")}
    done = await trio.run_process(
        [sys.executable, "-m", "blockx", "hub", "task", *argv],
        capture_stdout=True,
        capture_stderr=True,
        check=False,
        env=environment,
        cwd=REPO,
    )
    assert done.returncode == 0, done.stderr.decode()
    return json.loads(done.stdout)


async def test_an_operator_retries_and_resolves_tasks_that_need_review(tmp_path: Path) -> None:
    db = tmp_path / "hub.sqlite3"
    store = Store(str(db))
    try:
        create_queue(store, QUEUE, 0)
        token = create_credential(store, QUEUE, frozenset({Right.WORKER, Right.PRODUCER}), 0)
        admin = create_credential(store, QUEUE, frozenset({Right.ADMIN}), 0)
    finally:
        store.close()
    (tmp_path / "admin").write_text(admin + "\n")
    async with hub_process(str(db)) as hub:
        reach = [
            "--hub",
            f"http://127.0.0.1:{hub.port}",
            "--credential-file",
            str(tmp_path / "admin"),
        ]
        with trio.fail_after(60):
            retried, resolved = [(await hub.submit(token))["task_id"] for _ in range(2)]
            async with hub.worker(token) as worker:
                for _ in range(2):
                    offer = await worker.claim()
                    await worker.finish(offer, Unknown(code="CONNECTION_RESET"))
            listed = await blockx("list", *reach, "--queue", QUEUE, "--state", "NEEDS_REVIEW")
            counted = await blockx("retry", *reach, "--queue", QUEUE, "--dry-run")
            queued = await blockx("retry", retried, *reach, "--request-id", "r1")
            async with hub.worker(token, instance_id="w2") as worker:
                offer = await worker.claim()
                await worker.finish(offer, Succeeded(result='"again"'))
            ended = await blockx("resolve", resolved, *reach, "--succeeded", '{"paid": 1.10}')
    shown = {
        task_id: await blockx("show", task_id, "--db", str(db)) for task_id in (retried, resolved)
    }
    assert [task["task_id"] for task in listed["tasks"]] == [retried, resolved]
    assert counted == {"dry_run": True, "count": 2}
    assert (queued["state"], queued["max_attempts"]) == ("QUEUED", 4)
    assert (offer.task_id, offer.epoch) == (retried, 2)
    assert (ended["state"], ended["result"]) == ("SUCCEEDED", {"paid": 1.1})
    admin_id = admin.removeprefix("bxc_").partition(".")[0]
    for task_id, kind in ((retried, "RETRIED"), (resolved, "RESOLVED")):
        [entry] = [e for e in shown[task_id]["history"] if e["kind"] == kind]
        assert entry["detail"]["by"] == admin_id
    assert shown[retried]["state"] == "SUCCEEDED"
    assert [a["state"] for a in shown[retried]["attempts"]] == ["UNKNOWN", "SUCCEEDED"]
