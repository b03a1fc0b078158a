"""Fault: a submit racing the expiry of its reservation's lease.

Eight reservations' leases end around the same virtual instant while their submits
are in flight. Whichever wins, a task is either accepted and ends exactly once, or
refused with a status naming the lapsed lease and never runs; no slot stays taken
and the worker goes on serving.
"""

from __future__ import annotations

import pytest
import trio
import trio.testing
from grpclib.const import Status
from grpclib.exceptions import GRPCError

from blockx._proto.blockx.worker import v1 as pb
from tests.adapters.worker_harness import (
    Harness,
    call_list_task,
    running_worker,
    virtual_clock_config,
)

TTLS_MS = [990 + 5 * i for i in range(8)]  # 990 .. 1025: the clock jumps to 1000
JUMP_S = 1.0


async def submit(worker: Harness, task_id: str, slot_id: str, into: dict[str, object]) -> None:
    task = call_list_task(task_id, ("demo.add", [1, 2]))
    request = pb.SubmitTaskRequest(task=task, slot_id=slot_id)
    try:
        await worker.call(worker.stub.submit_task, request)
    except GRPCError as refused:
        into[task_id] = refused
    else:
        into[task_id] = "accepted"


async def terminal_updates(worker: Harness, task_id: str) -> list[pb.TaskUpdate]:
    return [update for update in await worker.watch(task_id) if update.is_terminal]


@pytest.mark.parametrize("steps", [0, 3, 6, 10, 20, None])
async def test_a_submit_racing_its_lease_expiry_runs_once_or_is_refused_never_both(
    mock_clock: trio.testing.MockClock, steps: int | None
) -> None:
    """`steps`: how far the submits get (scheduler steps; None: all the way) before the
    clock jumps, from "not sent yet" through "in flight" to "answered"."""
    outcomes: dict[str, object] = {}
    async with running_worker(virtual_clock_config(**{"worker.taskSlots": 8})) as worker:
        slots = {}
        for i, ttl_ms in enumerate(TTLS_MS):
            reply = await worker.call(
                worker.stub.request_task_slot,
                pb.RequestTaskSlotRequest(task_id=f"r{i}", ttl_ms=ttl_ms),
            )
            slots[f"r{i}"] = reply.slot_id
        async with trio.open_nursery() as nursery:
            for task_id, slot_id in slots.items():
                nursery.start_soon(submit, worker, task_id, slot_id, outcomes)
            if steps is None:
                await trio.testing.wait_all_tasks_blocked()
            for _ in range(steps or 0):
                await trio.lowlevel.checkpoint()
            mock_clock.jump(JUMP_S)  # the short leases end, racing the submits
        accepted = [task_id for task_id, outcome in outcomes.items() if outcome == "accepted"]
        ended = {task_id: await terminal_updates(worker, task_id) for task_id in accepted}
        unknown = {}
        for task_id in set(slots) - set(accepted):
            try:
                await worker.call(
                    worker.stub.get_task_result, pb.GetTaskResultRequest(task_id=task_id)
                )
            except GRPCError as error:
                unknown[task_id] = error.status
        status = await worker.call(worker.stub.get_worker_status, pb.GetWorkerStatusRequest())
        after = call_list_task("after", ("demo.add", [2, 2]))
        await worker.call(worker.stub.submit_task, pb.SubmitTaskRequest(task=after))
        served = await terminal_updates(worker, "after")

    assert set(outcomes) == set(slots)
    for ttl_ms, task_id in zip(TTLS_MS, slots, strict=True):
        if ttl_ms > JUMP_S * 1000:  # still leased when the clock stopped: always admitted
            assert outcomes[task_id] == "accepted", (task_id, outcomes[task_id])
        elif steps == 0:  # sent after the jump: the lease had ended
            assert outcomes[task_id] != "accepted", task_id
    for task_id in accepted:
        assert len(ended[task_id]) == 1, task_id  # one terminal result, exactly
        result = ended[task_id][0].result
        assert result is not None
        assert result.state == pb.TaskState.SUCCEEDED
    for task_id, outcome in outcomes.items():
        if outcome != "accepted":
            assert isinstance(outcome, GRPCError)
            assert outcome.status in {Status.FAILED_PRECONDITION, Status.ABORTED}
            assert "expired at" in str(outcome.message), outcome.message
            assert unknown[task_id] is Status.NOT_FOUND  # refused: it never ran
    assert status.free_slots == status.slots_total  # no slot stays taken
    assert served[0].result is not None
    assert served[0].result.state == pb.TaskState.SUCCEEDED
