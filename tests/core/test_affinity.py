"""Pinning the loop threads: the pinned thread gets one CPU and never preempts on wake-up;
threads it starts get every CPU and the usual scheduling back."""

from __future__ import annotations

import os
import subprocess
import threading

import pytest

from blockx.api._affinity import choose_cpu, pin_loop_threads

pytestmark = pytest.mark.skipif(
    not hasattr(os, "sched_getaffinity") or len(os.sched_getaffinity(0)) < 2,
    reason="needs Linux and at least 2 CPUs",
)


def test_a_choice_is_one_of_the_cpus_the_process_may_use() -> None:
    choice = choose_cpu()
    assert choice is not None
    cpu, allowed = choice
    assert allowed == frozenset(os.sched_getaffinity(0))
    assert cpu in allowed


def cpus_of_a_new_process() -> str:
    """The `Cpus_allowed_list` of a process started from the calling thread."""
    status = subprocess.run(
        ["cat", "/proc/self/status"], capture_output=True, text=True, check=True
    )
    [line] = [ln for ln in status.stdout.splitlines() if ln.startswith("Cpus_allowed_list")]
    return line.split(":", 1)[1].strip()


def policy_of_a_new_process() -> int:
    """The scheduling policy of a process started from the calling thread."""
    sched = subprocess.run(["cat", "/proc/self/sched"], capture_output=True, text=True, check=True)
    [line] = [ln for ln in sched.stdout.splitlines() if ln.startswith("policy")]
    return int(line.split(":", 1)[1])


def test_threads_and_processes_started_after_the_pin_get_every_cpu_back() -> None:
    allowed = frozenset(os.sched_getaffinity(0))
    cpu = max(allowed)
    seen: dict[str, object] = {}

    def started_later() -> None:
        seen["thread"] = frozenset(os.sched_getaffinity(0))
        seen["process"] = cpus_of_a_new_process()
        seen["thread policy"] = os.sched_getscheduler(0)
        seen["process policy"] = policy_of_a_new_process()

    def loop_thread() -> None:
        unpin = pin_loop_threads(cpu, allowed)
        try:
            seen["pinned"] = frozenset(os.sched_getaffinity(0))
            seen["pinned policy"] = os.sched_getscheduler(0)
            later = threading.Thread(target=started_later)
            later.start()
            later.join()
        finally:
            unpin()
        seen["unpinned"] = frozenset(os.sched_getaffinity(0))
        seen["unpinned policy"] = os.sched_getscheduler(0)

    thread = threading.Thread(target=loop_thread)
    thread.start()
    thread.join()
    assert threading.getprofile() is None
    assert seen["pinned"] == {cpu}
    assert seen["unpinned"] == allowed
    assert seen["thread"] == allowed
    assert seen["process"] == cpus_of_a_new_process()
    assert seen["pinned policy"] == os.SCHED_BATCH  # woken, the pinned thread never preempts
    assert seen["unpinned policy"] == seen["thread policy"] == os.SCHED_OTHER
    assert seen["process policy"] == os.SCHED_OTHER
    assert frozenset(os.sched_getaffinity(0)) == allowed  # this thread was never pinned


def test_a_policy_an_operator_chose_is_left_as_it_is() -> None:
    allowed = frozenset(os.sched_getaffinity(0))
    seen: dict[str, int] = {}

    def loop_thread() -> None:
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))  # as `chrt --idle` would
        unpin = pin_loop_threads(max(allowed), allowed)
        try:
            seen["pinned"] = os.sched_getscheduler(0)
        finally:
            unpin()
        seen["unpinned"] = os.sched_getscheduler(0)

    thread = threading.Thread(target=loop_thread)
    thread.start()
    thread.join()
    assert seen == {"pinned": os.SCHED_IDLE, "unpinned": os.SCHED_IDLE}
