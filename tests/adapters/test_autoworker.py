"""The automatic worker against the in-process hub, on Trio's virtual clock."""

from __future__ import annotations

from typing import Any

import attrs
import pytest
import trio
import trio.testing

from blockx.autoworker import (
    HubRequestFailed,
    WorkerAlreadyRun,
    WorkerExecution,
    WorkerFailure,
    WorkerRunError,
    WorkerShutdownTimeout,
)
from blockx.autoworker._client import REUSE_IDLE_S
from tests.adapters.autoworker_rig import SQLITE, RigClient, options, state_of, worker
from tests.adapters.hub_harness import CAPABILITY, QUEUE, running_hub


@SQLITE
async def test_tasks_run_and_the_worker_drains_when_cancelled(
    hub_url: str, autojump_clock: trio.testing.MockClock
) -> None:
    async with running_hub(hub_url) as rig:
        token = rig.credential()
        submitted = [await rig.submit(token, payload={"text": text}) for text in ("a", "b", "c")]

        async def shout(execution: WorkerExecution) -> Any:
            await trio.sleep(0.1)
            return {"text": execution.payload["text"].upper()}

        auto = worker(rig, token, options(shout, capacity=2))
        async with trio.open_nursery() as nursery:
            nursery.start_soon(auto.run)
            done = [await state_of(rig, token, t["task_id"], "SUCCEEDED") for t in submitted]
            nursery.cancel_scope.cancel()
        stats = auto.stats()
    assert [task["result"] for task in done] == [{"text": "A"}, {"text": "B"}, {"text": "C"}]
    assert (stats.started, stats.reports_confirmed, stats.running) == (3, 3, 0)


@SQLITE
async def test_each_outcome_is_reported_as_documented(
    hub_url: str, autojump_clock: trio.testing.MockClock
) -> None:
    async def handle(execution: WorkerExecution) -> Any:
        match execution.payload["do"]:
            case "fail":
                raise WorkerFailure("OBJECT_REJECTED", {"why": "too big"})
            case "error":
                raise RuntimeError("secret text that must not leave the process")
            case "nan":
                return {"x": float("nan")}
            case "none":
                return None
        return {"ok": True}

    async with running_hub(hub_url) as rig:
        token = rig.credential()
        ids = {}
        for do in ("ok", "fail", "error", "nan", "none"):
            ids[do] = (await rig.submit(token, payload={"do": do}))["task_id"]
        auto = worker(rig, token, options(handle))
        async with trio.open_nursery() as nursery:
            nursery.start_soon(auto.run)
            ended = {
                do: await state_of(rig, token, task_id, "SUCCEEDED", "FAILED", "NEEDS_REVIEW")
                for do, task_id in ids.items()
            }
            nursery.cancel_scope.cancel()
    assert ended["ok"]["state"] == "SUCCEEDED"
    assert ended["fail"]["state"] == "FAILED"
    reported = {do: task["attempts"][-1]["outcome"] for do, task in ended.items()}
    assert reported["fail"]["code"] == "OBJECT_REJECTED"
    assert reported["fail"]["details"] == {"why": "too big"}
    assert reported["ok"]["result"] == {"ok": True}  # the JSON it is, not a string of it
    assert reported["error"] == {"code": "HANDLER_ERROR"}  # unknown: nothing else
    assert ended["error"]["state"] == "NEEDS_REVIEW"  # not idempotent: a person decides
    assert reported["nan"]["code"] == "INVALID_HANDLER_RESULT"
    assert reported["none"]["code"] == "INVALID_HANDLER_RESULT"
    assert "secret text" not in repr(ended)


@SQLITE
async def test_run_is_once_per_worker_and_a_bad_credential_ends_it(
    hub_url: str, autojump_clock: trio.testing.MockClock
) -> None:
    async with running_hub(hub_url) as rig:
        token = rig.credential()
        refused = worker(rig, "bxc_nobody.secret")
        with pytest.raises(WorkerRunError) as ended:
            await refused.run()
        with pytest.raises(WorkerAlreadyRun):
            await refused.run()
        stats = refused.stats()
        good = worker(rig, token)
        with trio.move_on_after(1):
            await good.run()
        with pytest.raises(WorkerAlreadyRun):
            await good.run()
    assert ended.value.code == "AUTH_FAILED"
    assert "bxc_nobody.secret" not in str(ended.value)
    assert stats.reconnects == 0  # not retried: a credential does not get better


@SQLITE
async def test_a_drain_waits_for_running_work_and_confirms_it(
    hub_url: str, autojump_clock: trio.testing.MockClock
) -> None:
    async with running_hub(hub_url) as rig:
        token = rig.credential()
        task = await rig.submit(token, payload={"n": 1})
        began = trio.Event()

        async def slow(execution: WorkerExecution) -> Any:
            began.set()
            await trio.sleep(12)  # past the first lease (10 s): renewed meanwhile
            return execution.payload

        auto = worker(rig, token, options(slow))
        with trio.move_on_after(3600) as scope:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(auto.run)
                await began.wait()
                cancelled_at = trio.current_time()
                nursery.cancel_scope.cancel()
        returned_after = trio.current_time() - cancelled_at
        ended = await rig.task(token, task["task_id"])
    assert not scope.cancelled_caught
    assert ended["state"] == "SUCCEEDED"  # finished during the drain, and confirmed
    assert 12 <= returned_after < 13
    stats = auto.stats()
    assert (stats.running, stats.reports_confirmed) == (0, 1)
    assert stats.renewals_confirmed >= 1


@SQLITE
async def test_a_drain_past_the_shutdown_timeout_cancels_and_says_what_was_left(
    hub_url: str, autojump_clock: trio.testing.MockClock
) -> None:
    async with running_hub(hub_url) as rig:
        token = rig.credential()
        await rig.submit(token, payload={"n": 1})
        began = trio.Event()
        cancelled = []

        async def stuck(execution: WorkerExecution) -> Any:
            began.set()
            try:
                await trio.sleep(3600)
            except trio.Cancelled:
                cancelled.append(execution.task_id)
                raise

        auto = worker(rig, token, options(stuck, shutdown_timeout_ms=2_000))
        raised: list[WorkerShutdownTimeout] = []

        async def run() -> None:
            try:
                await auto.run()
            except WorkerShutdownTimeout as error:
                raised.append(error)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(run)
            await began.wait()
            cancelled_at = trio.current_time()
            nursery.cancel_scope.cancel()
        returned_after = trio.current_time() - cancelled_at
    [timed_out] = raised
    assert (timed_out.running, timed_out.unconfirmed) == (1, 0)
    assert returned_after == pytest.approx(2.0, abs=0.01)
    assert len(cancelled) == 1


@SQLITE
async def test_events_are_kept_up_to_128_then_dropped_and_counted(
    hub_url: str, autojump_clock: trio.testing.MockClock
) -> None:
    async with running_hub(hub_url) as rig:
        token = rig.credential()
        tasks = [await rig.submit(token, payload={"secret": f"v{i}"}) for i in range(50)]
        auto = worker(rig, token, options(capacity=8))
        async with trio.open_nursery() as nursery:
            nursery.start_soon(auto.run)
            for task in tasks:
                await state_of(rig, token, task["task_id"], "SUCCEEDED")
            nursery.cancel_scope.cancel()
        events = [event async for event in auto.events()]  # ends: closed when run returned
    stats = auto.stats()
    assert len(events) == 128
    assert stats.dropped_events > 0
    kinds = {event.type for event in events}
    assert {"started", "returned", "confirmed"} <= kinds
    assert not any("v1" in repr(event) for event in events)  # never a payload or result


@SQLITE
async def test_a_keep_alive_client_reuses_a_connection_until_it_has_idled_too_long(
    hub_url: str, autojump_clock: trio.testing.MockClock
) -> None:
    opened: list[trio.abc.Stream] = []

    @attrs.frozen(kw_only=True)
    class Counting(RigClient):
        async def open_stream(self) -> trio.abc.Stream:
            opened.append(await super().open_stream())
            return opened[-1]

    async with running_hub(hub_url) as rig:
        token = rig.credential()
        kept = Counting(url="http://hub.test:80", credential=token, endpoint=rig, keep_alive=True)
        tasks = [await kept.submit(QUEUE, CAPABILITY, {"n": n}) for n in range(3)]
        read = await kept.task(tasks[0]["task_id"])
        assert len(opened) == 1
        await trio.sleep(REUSE_IDLE_S)
        with pytest.raises(HubRequestFailed) as refused:
            await kept.task("no-such-task")
        assert len(opened) == 2
        await kept.aclose()
        once = Counting(url="http://hub.test:80", credential=token, endpoint=rig)
        await once.submit(QUEUE, CAPABILITY, {"n": 3})
        await once.submit(QUEUE, CAPABILITY, {"n": 4})
        assert len(opened) == 4
    assert [task["payload"] for task in tasks] == [{"n": 0}, {"n": 1}, {"n": 2}]
    assert read["state"] == "QUEUED"
    assert refused.value.status == 404
