"""Calls per second of the executor engine, against a raw socket floor, in one run.

    uv run python bench/calls.py [--calls 20000] [--executors 2]

* engine: one task of N trivial calls through the call engine (dispatcher
  actor, dispatch core, pool manager, real executor processes) on E executors.
* floor: two processes and a Unix socket, msgpack frames, pipelined
  request/response with no dispatcher, no retries and no function lookup:
  about the fastest any Python worker can hand calls to another process.

Each is run `--repeats` times in the same process and the medians are
reported. Prints `RESULT name=calls_per_s`, `RESULT name=floor_calls_per_s` and
`RESULT name=engine_to_floor_ratio`.
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time

import attrs
import msgpack  # type: ignore[import-untyped]  # ships no type information
import trio

from blockx.actors import CallEngine
from blockx.calls import CallSpec, encode_args
from blockx.config import DispatcherSection, default_config
from blockx.functions import FunctionSnapshot
from blockx.process.lifecycle import tune_gc

WORK = "def echo(i):\n    return i\n"
FLOOR_BATCH = 256

FLOOR_SERVER = r"""
import socket, struct, sys
import msgpack
path = sys.argv[1]
s = socket.socket(socket.AF_UNIX)
s.connect(path)
unpacker = msgpack.Unpacker(raw=False)
pack = msgpack.Packer().pack
while True:
    data = s.recv(1 << 20)
    if not data:
        break
    unpacker.feed(data)
    out = []
    for request in unpacker:
        out.append(pack({"id": request["id"], "ok": True, "value": pack(request["args"][0])}))
    if out:
        s.sendall(b"".join(out))
"""


async def engine_calls_per_s(count: int, executors: int, repeats: int) -> list[float]:
    code = FunctionSnapshot.of({"work": WORK})
    config = attrs.evolve(default_config().pool_config(), executor_count=executors)
    calls = [
        CallSpec(call_id=str(i), function="work.echo", args=encode_args((i,))) for i in range(count)
    ]
    settings = DispatcherSection(call_window=count, executor_capacity=512)
    rates = []
    async with CallEngine.open(config, settings=settings) as engine:
        await engine.wait_ready()
        while sum(v.state.value == "READY" for v in engine.transport.snapshot()) < executors:
            await trio.sleep(0.01)
        await engine.run_calls("warm", code, calls[:200])  # code loaded everywhere
        for run in range(repeats):
            started = time.perf_counter()
            outcome = await engine.run_calls(f"bench-{run}", code, calls)
            elapsed = time.perf_counter() - started
            if not outcome.ok or len(outcome.outputs) != count:
                raise SystemExit(f"the benchmark task failed: {outcome.message}")
            rates.append(count / elapsed)
    return rates


def floor_calls_per_s(count: int) -> float:
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "floor.sock")
        listener = socket.socket(socket.AF_UNIX)
        listener.bind(path)
        listener.listen(1)
        child = subprocess.Popen([sys.executable, "-c", FLOOR_SERVER, path])
        conn, _ = listener.accept()
        pack = msgpack.Packer().pack
        unpacker = msgpack.Unpacker(raw=False)
        started = time.perf_counter()
        sent = received = 0
        while received < count:
            if sent < count and sent - received < 4 * FLOOR_BATCH:
                batch = range(sent, min(sent + FLOOR_BATCH, count))
                conn.sendall(
                    b"".join(pack({"id": str(i), "fn": "work.echo", "args": [i]}) for i in batch)
                )
                sent += len(batch)
                continue
            unpacker.feed(conn.recv(1 << 20))
            for _ in unpacker:
                received += 1
        elapsed = time.perf_counter() - started
        conn.close()
        child.wait(timeout=10)
        listener.close()
    return count / elapsed


def main() -> None:
    tune_gc()  # as the worker process does (and the executors)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=20_000)
    parser.add_argument("--executors", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=5, help="runs of each; medians reported")
    args = parser.parse_args()
    floor = statistics.median(floor_calls_per_s(args.calls) for _ in range(args.repeats))
    engine = statistics.median(
        trio.run(engine_calls_per_s, args.calls, args.executors, args.repeats)
    )
    print(f"RESULT name=calls_per_s value={engine:.0f}")
    print(f"RESULT name=floor_calls_per_s value={floor:.0f}")
    print(f"RESULT name=engine_to_floor_ratio value={engine / floor:.3f}")


if __name__ == "__main__":
    main()
