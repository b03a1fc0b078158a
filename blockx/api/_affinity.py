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

On that CPU both run as `SCHED_BATCH`: woken by the other's hand-over, a thread
waits for the running one to sleep instead of preempting it. Preempted in the
middle of its step, a thread woke up to wait for the GIL the other held, and took
it at the other's first system call: one task at a time, the submit's answer then
went out before the task's dispatch, the task ended after the client's watch had
arrived, and the watch waited for it (with watches answered from the published
snapshots, bench/serve.py latency_p50_ms 2.05-2.08 -> 1.88-2.01 ms, unary tasks
1335-1365 -> 1459-1514/s; docs/runtime.md).

Only those two threads are pinned, and only while the server runs. Threads
started meanwhile through `threading` (Trio's thread cache: `trio.to_thread`,
and the executor processes, which are spawned from it) get back every CPU the
worker was given, and the scheduling policy it had, when they start. Linux only;
elsewhere, or with a single CPU, nothing is pinned. A policy other than the
default one (set by an operator, `chrt`) is left as it is.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
from collections.abc import Callable
from types import FrameType
from typing import Final

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

    policy = _policy()

    def widen(frame: FrameType, event: str, arg: object) -> None:
        sys.setprofile(None)  # once, as the thread starts
        os.sched_setaffinity(0, allowed)
        _set_policy(policy)  # a new thread inherits the policy of the thread that made it

    def unpin() -> None:
        if threading.getprofile() is widen:
            threading.setprofile(None)
        os.sched_setaffinity(0, allowed)
        _set_policy(policy)

    threading.setprofile(widen)
    pin_this_thread(cpu)
    logger.info("event-loop threads on CPU %d (of %s; pinLoopThreads)", cpu, _cpu_list(allowed))
    return unpin


def pin_this_thread(cpu: int) -> None:
    """Keep the calling thread on `cpu`, where, woken, it never preempts the other loop
    thread (`SCHED_BATCH`, unless its policy is not the default one)."""
    os.sched_setaffinity(0, {cpu})
    if _policy() == _DEFAULT_POLICY:
        _set_policy(_BATCH_POLICY)


_DEFAULT_POLICY: Final = getattr(os, "SCHED_OTHER", None)
_BATCH_POLICY: Final = getattr(os, "SCHED_BATCH", None)


def _policy() -> int | None:
    """The calling thread's scheduling policy; None where it cannot be read."""
    try:
        return os.sched_getscheduler(0)
    except (AttributeError, OSError):
        return None


def _set_policy(policy: int | None) -> None:
    """Give the calling thread `policy` (priority 0), if the platform has it and allows it."""
    if policy is None or not hasattr(os, "sched_setscheduler"):
        return
    try:
        os.sched_setscheduler(0, policy, os.sched_param(0))
    except OSError as error:
        logger.debug("scheduling policy %d not set: %s", policy, error)


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
