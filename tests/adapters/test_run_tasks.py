"""`RunTasks`, the streaming coordinator RPC, in-process: real actors and server, fake executors."""

from __future__ import annotations

import threading
from collections.abc import Sequence

import pytest
import trio
import trio.testing
import trio_asyncio
from grpclib.client import Channel
from grpclib.const import Cardinality, Status
from grpclib.exceptions import GRPCError
from grpclib.health.v1.health_grpc import HealthStub
from grpclib.health.v1.health_pb2 import HealthCheckRequest, HealthCheckResponse

from blockx._proto.blockx.worker import v1 as pb
from blockx.api import SERVICE_NAME, ThreadLoopUnderVirtualClock
from blockx.api._bridge import ThreadBridge
from blockx.api._service import MAX_RUN_TASKS_BATCH
from tests.adapters.worker_harness import (
    Harness,
    call_list_task,
    running_worker,
    virtual_clock_config,
    worker_config,
)

ROUTE = "/blockx.worker.v1.WorkerService/RunTasks"
FAIL_AFTER_S = 30


def request(task: pb.TaskSpec | None, slot_id: str = "") -> pb.RunTasksRequest:
    return pb.RunTasksRequest(task=task, slot_id=slot_id)


async def _exchange(
    channel: Channel,
    requests: Sequence[pb.RunTasksRequest],
    half_close: bool,
    responses: list[pb.RunTasksResponse],
) -> None:
    async with channel.request(
        ROUTE, Cardinality.STREAM_STREAM, pb.RunTasksRequest, pb.RunTasksResponse
    ) as stream:
        await stream.send_request()
        for one in requests:
            await stream.send_message(one)
        if half_close:
            await stream.end()
        async for response in stream:
            responses.append(response)


async def run(
    harness: Harness,
    *requests: pb.RunTasksRequest,
    half_close: bool = True,
    into: list[pb.RunTasksResponse] | None = None,
) -> list[pb.RunTasksResponse]:
    """Send `requests` on one stream and read it to its end (into `into`, as they come)."""
    responses = [] if into is None else into
    await trio_asyncio.aio_as_trio(_exchange)(harness.channel, requests, half_close, responses)
    return responses


def flat(responses: Sequence[pb.RunTasksResponse]) -> list[pb.RunTasksEvent]:
    """The events of `responses`, in order."""
    return [event for response in responses for event in response.events]


def events(responses: Sequence[pb.RunTasksResponse]) -> list[tuple[str, str]]:
    """(event, task id) of each event."""
    out = []
    for event in flat(responses):
        if event.accepted is not None:
            out.append(("accepted", event.accepted.task_id))
        elif event.refused is not None:
            out.append(("refused", event.refused.task_id))
        else:
            assert event.finished is not None
            out.append(("finished", event.finished.task_id))
    return out


def finished(responses: Sequence[pb.RunTasksResponse]) -> dict[str, pb.TaskUpdate]:
    return {e.finished.task_id: e.finished for e in flat(responses) if e.finished is not None}


def refusals(responses: Sequence[pb.RunTasksResponse]) -> list[pb.TaskRefusal]:
    return [e.refused for e in flat(responses) if e.refused is not None]


async def status(harness: Harness) -> pb.GetWorkerStatusResponse:
    return await harness.call(harness.stub.get_worker_status, pb.GetWorkerStatusRequest())


async def test_each_task_is_answered_in_request_order_then_finished_with_its_result() -> None:
    async with running_worker() as worker:  # 4 slots for 10 tasks: the rest wait, unrefused
        tasks = [call_list_task(f"s{i}", ("demo.add", [i, i])) for i in range(10)]
        responses = await run(worker, *(request(task) for task in tasks))
        seen = events(responses)
        answers = [event for event in seen if event[0] != "finished"]
        assert answers == [("accepted", f"s{i}") for i in range(10)]
        for i in range(10):
            assert seen.index(("accepted", f"s{i}")) < seen.index(("finished", f"s{i}"))
        ends = finished(responses)
        assert sorted(ends) == sorted(f"s{i}" for i in range(10))
        for update in ends.values():
            assert (update.is_terminal, update.state) == (True, pb.TaskState.SUCCEEDED)
            assert update.result is not None
            assert update.result.call_stats is not None
            assert update.result.call_stats.calls_succeeded == 1
        assert sorted(worker.calls.started) == sorted(ends)


async def test_a_task_id_seen_before_is_answered_as_it_stands_and_runs_once() -> None:
    async with running_worker() as worker:
        done = call_list_task("done", ("demo.add", [1, 1]))
        await run(worker, request(done))
        again = call_list_task("again", ("demo.add", [2, 2]))
        responses = await run(worker, request(done), request(again), request(again))
        seen = events(responses)
        # The ended task: its result at once, accepted then finished, and no second run.
        assert seen[:2] == [("accepted", "done"), ("finished", "done")]
        accepted = flat(responses)[0].accepted
        assert accepted is not None
        assert accepted.state == pb.TaskState.SUCCEEDED
        assert accepted.result is not None
        # The same new task twice on one stream: two answers, one run, one end.
        assert seen.count(("accepted", "again")) == 2
        assert seen.count(("finished", "again")) == 1
        assert sorted(worker.calls.started) == ["again", "done"]


async def test_a_refused_task_does_not_end_the_stream() -> None:
    async with running_worker() as worker:
        responses = await run(
            worker,
            request(None),
            request(call_list_task("")),
            request(call_list_task("in-slot", ("demo.add", [1, 2])), slot_id="slot-9"),
            request(call_list_task("ok", ("demo.add", [1, 2]))),
        )
        refused = refusals(responses)
        assert [(r.task_id, Status(r.status)) for r in refused] == [
            ("", Status.INVALID_ARGUMENT),
            ("", Status.INVALID_ARGUMENT),
            ("in-slot", Status.FAILED_PRECONDITION),
        ]
        assert "task" in refused[0].message
        assert "task_id" in refused[1].message
        assert "slot-9" in refused[2].message
        assert finished(responses)["ok"].state == pb.TaskState.SUCCEEDED
        assert worker.calls.started == ["ok"]


async def test_a_reserved_slot_is_used_by_the_task_that_names_it() -> None:
    async with running_worker() as worker:
        slot = await worker.call(
            worker.stub.request_task_slot, pb.RequestTaskSlotRequest(task_id="held")
        )
        responses = await run(
            worker, request(call_list_task("held", ("demo.add", [3, 4])), slot_id=slot.slot_id)
        )
        accepted = flat(responses)[0].accepted
        assert accepted is not None
        assert (accepted.task_id, accepted.slot_id) == ("held", slot.slot_id)
        assert finished(responses)["held"].state == pb.TaskState.SUCCEEDED


async def test_a_full_worker_holds_submits_and_stops_reading_until_a_slot_frees(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with running_worker(virtual_clock_config()) as worker:  # 4 slots
        hanging = [
            call_list_task(f"h{i}", ("demo.hang", []), task_timeout_ms=10_000) for i in range(4)
        ]
        quick = [call_list_task(f"q{i}", ("demo.add", [i, 1])) for i in range(100)]
        responses: list[pb.RunTasksResponse] = []
        async with trio.open_nursery() as nursery:
            nursery.start_soon(
                lambda: run(worker, *(request(t) for t in [*hanging, *quick]), into=responses)
            )
            await trio.sleep(5)
            # Four running, the window's worth of the rest held in the worker
            # (read, unanswered, unrefused), the others still unread.
            assert events(responses) == [("accepted", f"h{i}") for i in range(4)]
            now = await status(worker)
            assert (now.free_slots, now.running_tasks, now.waiting_submits) == (0, 4, 64)
        # The hanging tasks time out at 10 s; their slots take the held tasks in order.
        assert trio.current_time() >= 10
        seen = events(responses)
        answers = [event for event in seen if event[0] != "finished"]
        assert answers == [("accepted", t.task_id) for t in [*hanging, *quick]]
        ends = finished(responses)
        assert len(ends) == 104
        assert {ends[f"h{i}"].result.failure_code for i in range(4)} == {"TIMED_OUT"}  # type: ignore[union-attr]
        assert all(ends[f"q{i}"].state == pb.TaskState.SUCCEEDED for i in range(100))
        assert not refusals(responses)


async def test_a_broken_stream_is_a_broken_watch_for_every_task_it_followed(
    autojump_clock: trio.testing.MockClock,
) -> None:
    config = virtual_clock_config(**{"worker.watchDisconnectGraceMs": 3_000})
    async with running_worker(config) as worker:
        tasks = [call_list_task(f"b{i}", ("demo.hang", [])) for i in range(2)]
        with trio.move_on_after(1):  # the client goes away with its tasks running
            await run(worker, *(request(task) for task in tasks), half_close=False)
        now = await status(worker)
        assert now.running_tasks == 2  # within the grace
        await trio.sleep(4)
        for task in tasks:
            got = await worker.call(
                worker.stub.get_task_result, pb.GetTaskResultRequest(task_id=task.task_id)
            )
            assert got.result is not None
            assert (got.result.failure_code, got.result.retryable) == ("WATCH_DISCONNECTED", False)


async def test_a_stream_that_follows_a_task_submitted_before_breaks_its_watch_too(
    autojump_clock: trio.testing.MockClock,
) -> None:
    config = virtual_clock_config(**{"worker.watchDisconnectGraceMs": 3_000})
    async with running_worker(config) as worker:
        hang = call_list_task("stays", ("demo.hang", []), task_timeout_ms=60_000)
        await worker.call(worker.stub.submit_task, pb.SubmitTaskRequest(task=hang))
        responses = await run(worker, request(call_list_task("c1", ("demo.add", [1, 1]))))
        assert events(responses) == [("accepted", "c1"), ("finished", "c1")]
        with trio.move_on_after(1):  # a stream that followed the hanging task, then broke
            await run(worker, request(hang), half_close=False)
        await trio.sleep(4)
        got = await worker.call(
            worker.stub.get_task_result, pb.GetTaskResultRequest(task_id="stays")
        )
        assert got.result is not None
        assert got.result.failure_code == "WATCH_DISCONNECTED"


async def test_drain_refuses_held_submits_and_ends_running_tasks_on_the_stream(
    autojump_clock: trio.testing.MockClock,
) -> None:
    config = virtual_clock_config(drainTimeoutMs=5_000, **{"worker.taskSlots": 1})
    async with running_worker(config) as worker:
        tasks = [call_list_task(f"d{i}", ("demo.hang", [])) for i in range(3)]
        responses: list[pb.RunTasksResponse] = []
        async with trio.open_nursery() as nursery:
            nursery.start_soon(lambda: run(worker, *(request(t) for t in tasks), into=responses))
            await trio.sleep(1)
            assert (await status(worker)).waiting_submits == 2
            worker.stop.set()
        refused = refusals(responses)
        assert [(r.task_id, Status(r.status)) for r in refused] == [
            ("d1", Status.UNAVAILABLE),
            ("d2", Status.UNAVAILABLE),
        ]
        assert "draining" in refused[0].message
        result = finished(responses)["d0"].result
        assert result is not None
        assert (result.failure_code, result.retryable) == ("WORKER_SHUTDOWN", True)


async def test_a_worker_not_ready_refuses_each_task_and_health_covers_the_stream() -> None:
    async with running_worker(healthy=False) as worker:
        responses = await run(worker, request(call_list_task("early", ("demo.add", [1, 1]))))
        (refused,) = refusals(responses)
        assert (refused.task_id, Status(refused.status)) == ("early", Status.UNAVAILABLE)
        assert "not ready" in refused.message
        health = HealthStub(worker.channel)
        reply = await worker.call(health.Check, HealthCheckRequest(service=SERVICE_NAME))
        assert reply.status == HealthCheckResponse.NOT_SERVING

        worker.calls.become_healthy()
        await worker.serving.ready.wait()
        reply = await worker.call(health.Check, HealthCheckRequest(service=SERVICE_NAME))
        assert reply.status == HealthCheckResponse.SERVING
        responses = await run(worker, request(call_list_task("early", ("demo.add", [1, 1]))))
        assert events(responses) == [("accepted", "early"), ("finished", "early")]


def loop_threads() -> list[str]:
    return [thread.name for thread in threading.enumerate() if thread.name == "grpc-loop"]


async def test_the_production_arrangement_serves_rpcs_from_its_own_loop_thread() -> None:
    with trio.fail_after(FAIL_AFTER_S):
        async with running_worker(worker_config(grpcLoop="thread")) as worker:
            assert loop_threads() == ["grpc-loop"]
            assert isinstance(worker.serving.front_end.service.bridge, ThreadBridge)
            task = call_list_task(
                "u", ("demo.add", [40, 2]), result_handler=pb.ResultHandler("result")
            )
            await worker.call(worker.stub.submit_task, pb.SubmitTaskRequest(task=task))
            updates = await worker.watch("u")
            got = await worker.call(
                worker.stub.get_task_result, pb.GetTaskResultRequest(task_id="u")
            )
            responses = await run(worker, request(call_list_task("s", ("demo.add", [1, 1]))))
        assert loop_threads() == []  # stopped with the worker
    assert updates[-1].is_terminal
    assert got.state == pb.TaskState.SUCCEEDED
    assert got.result is not None
    assert got.result.outputs_json == "[42]"
    assert events(responses) == [("accepted", "s"), ("finished", "s")]


async def test_the_trio_asyncio_arrangement_serves_rpcs_on_the_workers_thread() -> None:
    with trio.fail_after(FAIL_AFTER_S):
        async with running_worker(worker_config(grpcLoop="trio-asyncio")) as worker:
            assert loop_threads() == []
            responses = await run(worker, request(call_list_task("t", ("demo.add", [1, 1]))))
    assert events(responses) == [("accepted", "t"), ("finished", "t")]


async def test_the_thread_arrangement_is_refused_under_a_virtual_clock_never_switched(
    autojump_clock: trio.testing.MockClock,
) -> None:
    refused = pytest.RaisesExc(ThreadLoopUnderVirtualClock, match='set grpcLoop "trio-asyncio"')
    with pytest.RaisesGroup(refused, flatten_subgroups=True):
        async with running_worker(worker_config(grpcLoop="thread")):
            raise AssertionError("the worker served under a virtual clock")
    assert loop_threads() == []


async def test_a_worker_ended_by_cancellation_stops_its_loop_thread_too() -> None:
    with trio.CancelScope() as scope:
        async with running_worker(worker_config(grpcLoop="thread")):
            assert loop_threads() == ["grpc-loop"]
            scope.cancel()  # the worker never sees its stop event
            await trio.sleep_forever()
    assert scope.cancelled_caught
    assert loop_threads() == []


async def test_a_unary_call_that_ends_without_its_request_is_told_so() -> None:
    async with running_worker() as worker:

        async def ask() -> tuple[Status, str]:
            async with worker.channel.request(  # streaming on this side: it may send nothing
                "/blockx.worker.v1.WorkerService/SubmitTask",
                Cardinality.STREAM_STREAM,
                pb.SubmitTaskRequest,
                pb.SubmitTaskResponse,
            ) as stream:
                await stream.send_request(end=True)
                try:
                    await stream.recv_message()
                except GRPCError as error:
                    return error.status, str(error.message)
            raise AssertionError("the call succeeded")

        code, message = await trio_asyncio.aio_as_trio(ask)()
        assert code is Status.INVALID_ARGUMENT
        assert "without its request" in message


def batch(*tasks: pb.TaskSpec | tuple[pb.TaskSpec, str] | None) -> pb.RunTasksRequest:
    """One request carrying `tasks` as items (a tuple: the task and its reserved slot)."""
    items = [
        pb.RunTasksItem(task=t[0], slot_id=t[1])
        if isinstance(t, tuple)
        else pb.RunTasksItem(task=t)
        for t in tasks
    ]
    return pb.RunTasksRequest(items=items)


async def test_a_batch_in_one_request_is_answered_in_order_and_each_task_finishes() -> None:
    async with running_worker() as worker:  # 4 slots for 10 tasks
        tasks = [call_list_task(f"b{i}", ("demo.add", [i, i])) for i in range(10)]
        responses = await run(worker, batch(*tasks))
        seen = events(responses)
        assert [e for e in seen if e[0] != "finished"] == [("accepted", f"b{i}") for i in range(10)]
        ends = finished(responses)
        assert sorted(ends) == sorted(f"b{i}" for i in range(10))
        assert all(update.state == pb.TaskState.SUCCEEDED for update in ends.values())
        assert sorted(worker.calls.started) == sorted(ends)


async def test_the_single_task_goes_before_the_items_and_each_item_has_its_slot() -> None:
    async with running_worker() as worker:
        slot = await worker.call(
            worker.stub.request_task_slot, pb.RequestTaskSlotRequest(task_id="held")
        )
        mixed = batch(
            call_list_task("second", ("demo.add", [1, 1])),
            (call_list_task("held", ("demo.add", [2, 2])), slot.slot_id),
        )
        mixed.task = call_list_task("first", ("demo.add", [3, 3]))
        responses = await run(worker, mixed, request(call_list_task("after", ("demo.add", [4, 4]))))
        answers = [e.accepted for e in flat(responses) if e.accepted is not None]
        assert [a.task_id for a in answers] == ["first", "second", "held", "after"]
        assert answers[2].slot_id == slot.slot_id
        assert len(finished(responses)) == 4


async def test_an_invalid_task_in_a_batch_is_refused_alone_and_named() -> None:
    async with running_worker() as worker:
        responses = await run(
            worker,
            batch(
                call_list_task("ok1", ("demo.add", [1, 1])),
                None,
                call_list_task(""),
                (call_list_task("in-slot", ("demo.add", [1, 2])), "slot-9"),
                call_list_task("ok2", ("demo.add", [2, 2])),
            ),
        )
        refused = refusals(responses)
        assert [(r.task_id, Status(r.status)) for r in refused] == [
            ("", Status.INVALID_ARGUMENT),
            ("", Status.INVALID_ARGUMENT),
            ("in-slot", Status.FAILED_PRECONDITION),
        ]
        assert "items[1].task" in refused[0].message
        assert "task_id" in refused[1].message
        assert [e for e in events(responses) if e[0] == "accepted"] == [
            ("accepted", "ok1"),
            ("accepted", "ok2"),
        ]
        assert sorted(worker.calls.started) == ["ok1", "ok2"]


async def test_a_batch_above_the_cap_is_refused_task_by_task_and_the_stream_goes_on() -> None:
    async with running_worker() as worker:
        count = MAX_RUN_TASKS_BATCH + 1
        big = batch(*(call_list_task(f"x{i}", ("demo.add", [1, 1])) for i in range(count)))
        after = request(call_list_task("after", ("demo.add", [1, 1])))
        responses = await run(worker, big, after)
        refused = refusals(responses)
        assert [r.task_id for r in refused] == [f"x{i}" for i in range(count)]
        assert {Status(r.status) for r in refused} == {Status.INVALID_ARGUMENT}
        assert f"at most {MAX_RUN_TASKS_BATCH} tasks per request" in refused[0].message
        assert str(count) in refused[0].message
        assert finished(responses)["after"].state == pb.TaskState.SUCCEEDED
        assert worker.calls.started == ["after"]


async def test_a_batch_beyond_the_window_is_taken_a_window_at_a_time(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with running_worker(virtual_clock_config()) as worker:  # 4 slots
        hanging = [
            call_list_task(f"h{i}", ("demo.hang", []), task_timeout_ms=10_000) for i in range(4)
        ]
        quick = [call_list_task(f"q{i}", ("demo.add", [i, 1])) for i in range(100)]
        responses: list[pb.RunTasksResponse] = []
        async with trio.open_nursery() as nursery:
            nursery.start_soon(lambda: run(worker, batch(*hanging, *quick), into=responses))
            await trio.sleep(5)
            now = await status(worker)
            assert (now.free_slots, now.running_tasks, now.waiting_submits) == (0, 4, 64)
        answers = [event for event in events(responses) if event[0] != "finished"]
        assert answers == [("accepted", t.task_id) for t in [*hanging, *quick]]
        assert len(finished(responses)) == 104
