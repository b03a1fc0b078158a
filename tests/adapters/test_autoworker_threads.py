"""Plain handlers in worker threads, cancellation seen by handlers, and the bounded exit.

A plain `def` handler runs in a thread, so heartbeats, renewals and other handlers go on
while it blocks: those tests run on the real clock against the in-process hub (the
thread's time is real), waiting on conditions under generous `fail_after` bounds. The
others run on Trio's virtual clock: the clock jumps while a thread is blocked, which is
what a stuck thread looks like to the worker.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import attrs
import pytest
import trio
import trio.testing

from blockx.autoworker import (
    Worker,
    WorkerExecution,
    WorkerHandler,
    WorkerOptions,
    WorkerShutdownTimeout,
)
from blockx.autoworker._runtime import EXIT_GRACE_S
from tests.adapters.autoworker_rig import SQLITE, options, state_of, worker
from tests.adapters.hub_harness import (
    CAPABILITY,
    OTHER_CAPABILITY,
    QUEUE,
    TEST_CONFIG,
    HubRig,
    running_hub,
)

ONE_SECOND_LEASE = attrs.evolve(TEST_CONFIG, lease_ms=1_000)


async def _served(
    rig: HubRig, token: str, auto: Worker, task_ids: list[str]
) -> list[dict[str, Any]]:
    """The tasks once each ended, `auto` working meanwhile (on the real clock)."""
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(auto.run)
            done = [
                await state_of(rig, token, task_id, "SUCCEEDED", "FAILED", "NEEDS_REVIEW")
                for task_id in task_ids
            ]
            nursery.cancel_scope.cancel()
    return done


# ------------------------------------------------------------------------ plain handlers


@SQLITE
async def test_a_blocking_plain_handler_keeps_its_lease_and_others_are_served(
    hub_url: str,
) -> None:
    """A `def` handler sleeps 3 s in its thread under a 1 s lease, renewed meanwhile; an
    async handler of the same worker is served while it blocks."""
    calls: list[str] = []
    async_served = threading.Event()

    def blocking(execution: WorkerExecution) -> Any:
        calls.append(execution.attempt_id)
        time.sleep(3)
        # Only once the async task is done: it was served while this one blocked.
        return {"slept": True, "others_served": async_served.wait(timeout=30)}

    async def quick(execution: WorkerExecution) -> Any:
        async_served.set()
        return {"quick": True}

    opts = WorkerOptions(
        queue_id=QUEUE,
        capacity=2,
        handlers=[
            WorkerHandler(capability=CAPABILITY, handle=blocking),
            WorkerHandler(capability=OTHER_CAPABILITY, handle=quick),
        ],
    )
    async with running_hub(hub_url, ONE_SECOND_LEASE) as rig:
        token = rig.credential()
        slow = await rig.submit(token)
        fast = await rig.submit(token, handler_version=OTHER_CAPABILITY.handler_version)
        auto = worker(rig, token, opts)
        done = await _served(rig, token, auto, [slow["task_id"], fast["task_id"]])
    slow_done, fast_done = done
    assert slow_done["state"] == "SUCCEEDED"
    assert slow_done["result"] == {"slept": True, "others_served": True}
    assert (slow_done["started_attempts"], len(slow_done["attempts"]), len(calls)) == (1, 1, 1)
    assert fast_done["state"] == "SUCCEEDED"
    assert auto.stats().renewals_confirmed >= 2  # the 1 s lease was renewed while it slept


@SQLITE
async def test_a_cpu_bound_plain_handler_does_not_let_its_lease_lapse(hub_url: str) -> None:
    def busy(execution: WorkerExecution) -> Any:
        end = time.monotonic() + 2.5
        spins = 0
        while time.monotonic() < end:
            spins += 1
        return {"spun": spins > 0}

    async with running_hub(hub_url, ONE_SECOND_LEASE) as rig:
        token = rig.credential()
        task = await rig.submit(token)
        auto = worker(rig, token, options(busy))
        [done] = await _served(rig, token, auto, [task["task_id"]])
    assert done["state"] == "SUCCEEDED"
    assert done["result"] == {"spun": True}
    assert (done["started_attempts"], len(done["attempts"])) == (1, 1)


@SQLITE
async def test_a_plain_handler_that_polls_its_cancellation_stops_when_the_lease_is_lost(
    hub_url: str, autojump_clock: trio.testing.MockClock
) -> None:
    """The attempt may last 1 s, so its lease cannot be renewed past that: the handler is
    told, stops, and the hub hears LEASE_LOST."""
    seen: list[bool] = []

    def patient(execution: WorkerExecution) -> Any:
        seen.append(execution.cancelled)
        execution.raise_if_cancelled()  # not yet: it goes on
        seen.append(execution.wait_cancelled(timeout_s=60))
        seen.append(execution.cancelled)
        execution.raise_if_cancelled()
        return {"never": "reached"}

    async with running_hub(hub_url) as rig:
        token = rig.credential()
        task = await rig.submit(token, attempt_timeout_ms=1_000, idempotency="NON_IDEMPOTENT")
        auto = worker(rig, token, options(patient))
        async with trio.open_nursery() as nursery:
            nursery.start_soon(auto.run)
            await state_of(rig, token, task["task_id"], "NEEDS_REVIEW")
            ended = await rig.task(token, task["task_id"])
            while not ended["evidence"]:  # the report comes after the hub ended the lease
                await trio.sleep(0.05)
                ended = await rig.task(token, task["task_id"])
            nursery.cancel_scope.cancel()
    assert seen == [False, True, True]
    assert ended["attempts"][0]["state"] == "LEASE_EXPIRED"
    [evidence] = ended["evidence"]
    assert evidence["detail"] == {"reported": "UNKNOWN", "code": "LEASE_LOST"}


# ----------------------------------------------------------------------- the bounded exit


async def shielded(execution: WorkerExecution) -> Any:
    with trio.CancelScope(shield=True):
        await trio.sleep(100)  # cancellation is ignored
    return {"late": True}


@SQLITE
@pytest.mark.parametrize("kind", ["async", "plain"])
async def test_run_returns_soon_after_the_shutdown_timeout_leaving_stuck_handlers(
    hub_url: str, autojump_clock: trio.testing.MockClock, kind: str
) -> None:
    """A handler that ignores its cancellation (a shielded sleep, a thread stuck in a
    wait) does not hold `run`: it raises half a second after the 500 ms shutdown timeout,
    naming the attempt it left running."""
    release = threading.Event()
    began = threading.Event()

    def stuck(execution: WorkerExecution) -> Any:
        began.set()
        release.wait(timeout=100)  # cancellation is ignored
        return {"late": True}

    handle = shielded if kind == "async" else stuck
    raised: list[WorkerShutdownTimeout] = []
    try:
        async with running_hub(hub_url) as rig:
            token = rig.credential()
            await rig.submit(token)
            auto = worker(rig, token, options(handle, shutdown_timeout_ms=500))

            async def run() -> None:
                try:
                    await auto.run()
                except WorkerShutdownTimeout as error:
                    raised.append(error)

            async with trio.open_nursery() as nursery:
                nursery.start_soon(run)
                while auto.stats().running == 0:
                    await trio.sleep(0.01)
                if kind == "plain":
                    await trio.to_thread.run_sync(began.wait)
                cancelled_at = trio.current_time()
                nursery.cancel_scope.cancel()
            returned_after = trio.current_time() - cancelled_at
    finally:
        release.set()
    [timed_out] = raised
    assert returned_after == pytest.approx(0.5 + EXIT_GRACE_S, abs=0.01)
    assert (timed_out.running, timed_out.unconfirmed) == (1, 0)
    [attempt_id] = timed_out.attempts
    assert attempt_id in str(timed_out)


@SQLITE
@pytest.mark.parametrize("kind", ["async", "plain"])
async def test_a_keyboard_interrupt_from_a_handler_ends_run_with_it(
    hub_url: str, autojump_clock: trio.testing.MockClock, kind: str
) -> None:
    """What a handler's task catches goes to `run` (a system task must not raise)."""

    def interrupt(execution: WorkerExecution) -> Any:
        raise KeyboardInterrupt

    async def interrupt_async(execution: WorkerExecution) -> Any:
        raise KeyboardInterrupt

    handle = interrupt_async if kind == "async" else interrupt
    async with running_hub(hub_url) as rig:
        token = rig.credential()
        await rig.submit(token)
        auto = worker(rig, token, options(handle))
        with pytest.raises(KeyboardInterrupt):
            await auto.run()  # not a TrioInternalError
    assert auto.stats().started == 1
