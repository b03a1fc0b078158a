"""Where a real worker's threads and executors may run (`pinLoopThreads`)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.e2e.serve_process import serve_process

pytestmark = pytest.mark.skipif(
    not hasattr(os, "sched_getaffinity") or len(os.sched_getaffinity(0)) < 2,
    reason="needs Linux and at least 2 CPUs",
)


def cpus_of(status: Path) -> frozenset[int]:
    """The `Cpus_allowed_list` of a /proc status file, e.g. "0-1,4" -> {0, 1, 4}."""
    for line in status.read_text().splitlines():
        if line.startswith("Cpus_allowed_list:"):
            cpus: set[int] = set()
            for part in line.split(":", 1)[1].strip().split(","):
                low, _, high = part.partition("-")
                cpus.update(range(int(low), int(high or low) + 1))
            return frozenset(cpus)
    raise AssertionError(f"no Cpus_allowed_list in {status}")


def threads_of(pid: int) -> dict[str, frozenset[int]]:
    """Each thread of `pid` by "name/tid" (the main thread is "main"), with its CPUs."""
    found = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        name = (
            "main"
            if task.name == str(pid)
            else f"{(task / 'comm').read_text().strip()}/{task.name}"
        )
        found[name] = cpus_of(task / "status")
    return found


def children_of(pid: int) -> list[int]:
    return [
        int(stat.parent.name)
        for stat in Path("/proc").glob("[0-9]*/stat")
        if stat.exists() and int(stat.read_text().rpartition(")")[2].split()[1]) == pid
    ]


async def test_the_two_loop_threads_share_one_cpu_and_all_else_keeps_every_cpu() -> None:
    allowed = frozenset(os.sched_getaffinity(0))
    async with serve_process("--executors", "2") as worker:
        pid = worker.process.pid
        threads = threads_of(pid)
        executors = children_of(pid)
    pinned = threads.pop("main")
    assert len(pinned) == 1
    assert pinned <= allowed
    # The gRPC loop's thread shares it; Trio's thread cache ran a thread while the server
    # started, and it was given every CPU again.
    assert sorted(threads.values(), key=len) == [pinned] + [allowed] * (len(threads) - 1)
    assert len(threads) >= 2
    assert len(executors) == 2
    assert {cpus_of(Path(f"/proc/{child}/status")) for child in executors} == {allowed}
    assert any("event-loop threads on CPU" in line for line in worker.log)


async def test_pin_loop_threads_off_leaves_every_thread_on_every_cpu() -> None:
    allowed = frozenset(os.sched_getaffinity(0))
    env = {"WORKER_PIN_LOOP_THREADS": "false"}
    async with serve_process("--executors", "1", env=env) as worker:
        threads = threads_of(worker.process.pid)
    assert set(threads.values()) == {allowed}
