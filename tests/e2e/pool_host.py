"""A stand-in worker for the test that SIGKILLs one: runs an executor pool in
this process and prints its executors' pids as one JSON line once all are up.

Usage: python tests/e2e/pool_host.py EXECUTOR_COUNT
"""

from __future__ import annotations

import json
import math
import sys

import attrs
import trio

from blockx.config import default_config
from blockx.executors import ExecutorPoolManager, ExecutorUp, PoolEvent
from blockx.process.clock import EpochClock


async def host(executor_count: int) -> None:
    config = attrs.evolve(
        default_config().pool_config(),
        executor_count=executor_count,
        heartbeat_interval_ms=50,
    )
    send, events = trio.open_memory_channel[PoolEvent](math.inf)
    pool = ExecutorPoolManager(config, send, EpochClock())
    async with trio.open_nursery() as nursery:
        await nursery.start(pool.run)
        pids: dict[str, int] = {}
        async for event in events:
            if isinstance(event, ExecutorUp):
                pids[event.executor_id] = event.pid
                if len(pids) == executor_count:
                    break
        report = {"pids": sorted(pids.values()), "runtime_dir": pool.runtime_dir}
        print(json.dumps(report), flush=True)
        async for _ in events:
            pass  # until killed


if __name__ == "__main__":
    trio.run(host, int(sys.argv[1]))
