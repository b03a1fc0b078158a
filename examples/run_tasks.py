"""Run a batch of tasks on one worker over a RunTasks stream and print how each ended.

uv run python examples/run_tasks.py [HOST:PORT]    # default 127.0.0.1:8081
"""

from __future__ import annotations

import sys

import trio
import trio_asyncio

from blockx.client import WorkerClient, task_outputs, task_spec


async def main(address: str) -> int:
    tasks = [
        task_spec(
            f"py-sum-{i}",
            builder="static",
            config={"function": "demo.add", "args": [i, 40], "count": 1},
            plugin="result",
        )
        for i in range(5)
    ]
    failed = 0
    async with (
        trio_asyncio.open_loop(),
        WorkerClient.connect(address) as client,
        client.run_tasks(tasks) as outcomes,
    ):
        async for outcome in outcomes:  # in the order the tasks end
            if outcome.result is None:
                print(f"{outcome.task_id}: did not run: {outcome.error}")
                failed += 1
            elif not outcome.succeeded:
                print(f"{outcome.task_id}: {outcome.result.failure_code}")
                failed += 1
            else:
                print(f"{outcome.task_id}: {task_outputs(outcome.result)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(trio.run(main, sys.argv[1] if len(sys.argv) > 1 else "127.0.0.1:8081"))
