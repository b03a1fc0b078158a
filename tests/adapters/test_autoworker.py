"""The automatic worker against the in-process hub, on Trio's virtual clock."""

from __future__ import annotations

from typing import Any

import trio
import trio.testing

from blockx.autoworker import WorkerExecution, WorkerFailure
from tests.adapters.autoworker_rig import SQLITE, options, state_of, worker
from tests.adapters.hub_harness import running_hub


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
async def test_each_outcome_is_reported_as_the_seed_classifies_it(
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
    assert reported["error"] == {"code": "HANDLER_ERROR"}  # unknown: nothing else
    assert ended["error"]["state"] == "NEEDS_REVIEW"  # not idempotent: a person decides
    assert reported["nan"]["code"] == "INVALID_HANDLER_RESULT"
    assert reported["none"]["code"] == "INVALID_HANDLER_RESULT"
    assert "secret text" not in repr(ended)
