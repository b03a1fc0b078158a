"""Waiting for a task that another worker starts on its own (a shadow copy)."""

from __future__ import annotations

import trio

from blockx._proto.blockx.worker import v1 as pb
from blockx.client import WorkerCallError, WorkerClient


async def result_once_there(client: WorkerClient, task_id: str, *, poll_s: float) -> pb.TaskResult:
    """The terminal result of `task_id` on `client`'s worker, polling until it arrives and ends.

    Polls because the task is not this test's to watch: until it arrives the
    worker answers NOT_FOUND, which a watch would also be refused with.
    """
    while True:
        try:
            response = await client.result(task_id)
        except WorkerCallError as error:
            if error.status.name != "NOT_FOUND":
                raise
        else:
            if response.result is not None:
                return response.result
        await trio.sleep(poll_s)
