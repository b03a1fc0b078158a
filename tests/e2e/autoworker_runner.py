"""An automatic worker in a process of its own, for the test that SIGKILLs it.

Usage: python -m tests.e2e.autoworker_runner HUB_URL CAPACITY  (the token in HUB_TOKEN;
for a wss:// URL, the CA to trust in HUB_CA_FILE)

It takes tasks of `CAPABILITY` on `QUEUE` (tests/adapters/hub_harness.py). Its
handler prints `started <task_id> <attempt_id>` on stdout, then waits for ever:
the test kills the process mid-task.
"""

from __future__ import annotations

import os
import sys
from typing import Any, Final

import trio

from blockx.autoworker import HubClient, Worker, WorkerExecution, WorkerHandler, WorkerOptions
from tests.adapters.hub_harness import CAPABILITY, QUEUE

STARTED: Final = "started"


async def handle(execution: WorkerExecution) -> Any:
    print(STARTED, execution.task_id, execution.attempt_id, flush=True)
    await trio.sleep_forever()


def main(url: str, capacity: int) -> None:
    client = HubClient(
        url=url, credential=os.environ["HUB_TOKEN"], ca_file=os.environ.get("HUB_CA_FILE", "")
    )
    handler = WorkerHandler(capability=CAPABILITY, handle=handle)
    options = WorkerOptions(queue_id=QUEUE, handlers=[handler], capacity=capacity)
    trio.run(Worker(client, options).run)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
