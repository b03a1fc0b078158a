"""Queue three texts, normalise them with an automatic worker of capacity 2, then drain it.

Set up once: a hub, a queue, and a credential with both rights (the operator
commands work on the hub's database directly, so run them where the hub runs):

    uv run blockx hub &                                 # :8090, state in ./hub.sqlite3
    uv run blockx hub queue create text
    uv run blockx hub credential create --queue text --rights producer,worker \\
        > worker.credential                             # the token, printed once

Then:

    BLOCKX_HUB_URL=http://127.0.0.1:8090 BLOCKX_HUB_CREDENTIALS_FILE=worker.credential \\
        uv run python examples/autoworker_normalize.py

Environment: BLOCKX_HUB_URL (default http://127.0.0.1:8090); the token in
BLOCKX_HUB_CREDENTIAL, or in the file BLOCKX_HUB_CREDENTIALS_FILE names;
BLOCKX_HUB_QUEUE (default `text`). The program creates nothing on the hub but
its three tasks, under a capability name of its own (`text.normalize.<random>`),
so no task an earlier run left behind is taken. It prints one line per task,
in the order submitted, then the worker's counts once it drained:

    task=<id> state=SUCCEEDED result={"text":"HELLO HUB"}
    task=<id> state=SUCCEEDED result={"text":"AUTOMATIC WORKER"}
    task=<id> state=SUCCEEDED result={"text":"DURABLE RESULT"}
    worker_drained=true started=3 confirmed=3 running=0
"""

from __future__ import annotations

import json
import os
import secrets
import sys
from pathlib import Path
from typing import Any

import trio

from blockx.autoworker import (
    Capability,
    HubClient,
    Worker,
    WorkerExecution,
    WorkerHandler,
    WorkerOptions,
    WorkerRunError,
)

TEXTS = ("  hello   hub ", "automatic\tworker", " durable  result\n")
ENDED = ("SUCCEEDED", "FAILED", "NEEDS_REVIEW")
WAIT_S = 60.0


def hub_client() -> HubClient:
    url = os.environ.get("BLOCKX_HUB_URL", "http://127.0.0.1:8090")
    token = os.environ.get("BLOCKX_HUB_CREDENTIAL", "")
    if not token and (path := os.environ.get("BLOCKX_HUB_CREDENTIALS_FILE")):
        token = Path(path).read_text().strip()
    if not token:
        raise SystemExit("set BLOCKX_HUB_CREDENTIAL or BLOCKX_HUB_CREDENTIALS_FILE")
    return HubClient(url=url, credential=token)


async def normalize(execution: WorkerExecution) -> Any:
    """Strip, collapse runs of whitespace to one space, upper-case."""
    return {"text": " ".join(execution.payload["text"].split()).upper()}


async def ended(client: HubClient, task_id: str) -> dict[str, Any]:
    """The task once it has ended: the hub answers as soon as it ends (or after `wait_ms`)."""
    while (task := await client.task(task_id, wait_ms=10_000))["state"] not in ENDED:
        pass
    return task


async def main() -> int:
    client = hub_client()
    queue_id = os.environ.get("BLOCKX_HUB_QUEUE", "text")
    capability = Capability(
        handler=f"text.normalize.{secrets.token_hex(4)}", handler_version="v1", payload_version="v1"
    )
    submitted = [await client.submit(queue_id, capability, {"text": text}) for text in TEXTS]
    worker = Worker(
        client,
        WorkerOptions(
            queue_id=queue_id,
            capacity=2,
            handlers=[WorkerHandler(capability=capability, handle=normalize)],
        ),
    )
    drained = True

    async def run_worker() -> None:
        nonlocal drained
        try:
            await worker.run()
        except WorkerRunError as error:
            drained = False
            print(f"worker: {error}", file=sys.stderr)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(run_worker)
        with trio.fail_after(WAIT_S):
            tasks = [await ended(client, task["task_id"]) for task in submitted]
        for task in tasks:
            result = json.dumps(task["result"], separators=(",", ":"))
            print(f"task={task['task_id']} state={task['state']} result={result}")
        nursery.cancel_scope.cancel()  # the worker drains before `run` returns
    stats = worker.stats()
    print(
        f"worker_drained={str(drained).lower()} started={stats.started} "
        f"confirmed={stats.reports_confirmed} running={stats.running}"
    )
    ok = drained and all(task["state"] == "SUCCEEDED" for task in tasks)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(trio.run(main))
