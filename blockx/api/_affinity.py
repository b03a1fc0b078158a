"""One CPU for the worker's two event-loop threads.

With `grpcLoop` "thread" the worker runs two event loops, Trio's and the gRPC
server's, in two threads that hand work to each other and take turns holding
the GIL, so they never run Python at the same time. Left to the scheduler they
sit on different CPUs, and each hand-over wakes a thread on a CPU that is
running another process (the client on the same machine, an executor), whose
turn comes first: one task at a time on 2 cores, the Trio thread waited about
0.9 ms per task to process an executor's result that had already arrived
(docs/runtime.md). Kept on one CPU (`pinLoopThreads`, on by default), a
hand-over is a switch on that CPU.

Only those two threads are pinned, and only while the server runs. Threads
started meanwhile through `threading` (Trio's thread cache: `trio.to_thread`,
and the executor processes, which are spawned from it) get back every CPU the
worker was given when they start. Linux only; elsewhere, or with a single
CPU, nothing is pinned.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
from collections.abc import Callable
from types import FrameType

logger = logging.getLogger("blockx.worker")


def choose_cpu() -> tuple[int, frozenset[int]] | None:
    """The CPU to pin the loop threads to (the one the calling thread runs on, if it may)
    and the CPUs the worker may use; None when there is no choice to make."""
    if not hasattr(os, "sched_setaffinity"):
        return None
    allowed = frozenset(os.sched_getaffinity(0))
    if len(allowed) < 2:
        return None
    current = _current_cpu()
    return (current if current in allowed else min(allowed)), allowed


def pin_loop_threads(cpu: int, allowed: frozenset[int]) -> Callable[[], None]:
    """Pin the calling thread to `cpu`, and have every thread started through `threading`
    from now on widen itself back to `allowed`; returns what undoes both (to be called
    from the same thread). The other loop thread pins itself with `pin_this_thread`."""

    def widen(frame: FrameType, event: str, arg: object) -> None:
        sys.setprofile(None)  # once, as the thread starts
        os.sched_setaffinity(0, allowed)

    def unpin() -> None:
        if threading.getprofile() is widen:
            threading.setprofile(None)
        os.sched_setaffinity(0, allowed)

    threading.setprofile(widen)
    pin_this_thread(cpu)
    logger.info("event-loop threads on CPU %d (of %s; pinLoopThreads)", cpu, _cpu_list(allowed))
    return unpin


def pin_this_thread(cpu: int) -> None:
    os.sched_setaffinity(0, {cpu})


def _current_cpu() -> int | None:
    """The CPU the calling thread runs on (field 39 of /proc/thread-self/stat)."""
    try:
        with open("/proc/thread-self/stat", "rb") as stat:
            fields = stat.read().rpartition(b")")[2].split()
        return int(fields[36])
    except (OSError, IndexError, ValueError):
        return None


def _cpu_list(cpus: frozenset[int]) -> str:
    return ",".join(str(cpu) for cpu in sorted(cpus))
