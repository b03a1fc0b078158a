"""The worker's gRPC front end in-process: real actors and server, fake executors."""

from __future__ import annotations

import os
import threading
from collections.abc import Awaitable
from typing import Any

import pytest
import trio
import trio_asyncio
from google.protobuf.descriptor_pb2 import FileDescriptorProto  # type: ignore[import-untyped]  # no stubs
from grpclib.client import Channel
from grpclib.const import Status
from grpclib.exceptions import GRPCError
from grpclib.health.v1.health_grpc import HealthStub
from grpclib.health.v1.health_pb2 import HealthCheckRequest, HealthCheckResponse
from grpclib.reflection.v1 import reflection_grpc as reflection_v1_grpc
from grpclib.reflection.v1 import reflection_pb2 as reflection_v1
from grpclib.reflection.v1alpha import reflection_grpc as reflection_v1alpha_grpc
from grpclib.reflection.v1alpha import reflection_pb2 as reflection_v1alpha

from blockx._proto.blockx.worker import v1 as pb
from blockx.actors import SlotTableMessage
from blockx.actors import _slot_table as slot_table
from blockx.actors._task import TaskRuntime, TaskStart, run_task
from blockx.api import SERVICE_NAME, STATUS_OF, grpc_error
from blockx.calls import CallSpec
from blockx.phases import builders
from blockx.phases.builders import BuildRequest, call_list_calls
from blockx.phases.plugins import PluginRequest, ResultPlugin
from blockx.slots import (
    ErrorCode,
    InvalidArgument,
    InvalidSlot,
    NoSlot,
    NotFound,
    PluginResult,
    SlotUncertain,
    Unavailable,
)
from tests.adapters.worker_harness import (
    Harness,
    call_list_task,
    running_worker,
    virtual_clock_config,
    worker_config,
)


async def watch(harness: Harness, *task_ids: str) -> list[pb.TaskUpdate]:
    updates = []
    stream = harness.stub.watch_tasks(pb.WatchTasksRequest(task_ids=list(task_ids)))
    async for update in trio_asyncio.aio_as_trio(stream):
        updates.append(update)
    return updates


async def status_of(harness: Harness, method: object, request: object) -> tuple[Status, str]:
    with pytest.raises(GRPCError) as raised:
        await harness.call(method, request)  # type: ignore[arg-type]
    return raised.value.status, str(raised.value.message)


async def test_a_reserved_slot_runs_a_task_to_success_and_keeps_its_result() -> None:
    async with running_worker() as worker:
        slot = await worker.call(
            worker.stub.request_task_slot, pb.RequestTaskSlotRequest(task_id="t1", ttl_ms=5000)
        )
        assert (slot.task_id, slot.slot_id, slot.state) == ("t1", "slot-0", pb.TaskState.ALLOCATED)
        assert slot.lease_expires_at_ms > 0
        task = call_list_task("t1", ("demo.add", [1, 2]), ("demo.add", [3, 4]))
        submitted = await worker.call(
            worker.stub.submit_task, pb.SubmitTaskRequest(task=task, slot_id="slot-0")
        )
        assert (submitted.state, submitted.slot_id) == (pb.TaskState.RUNNING, "slot-0")

        updates = await watch(worker, "t1")
        final = updates[-1]
        assert final.is_terminal
        assert final.state == pb.TaskState.SUCCEEDED
        assert [u.is_terminal for u in updates].count(True) == 1
        assert final.result is not None
        assert final.result.execute_result is not None
        assert final.result.execute_result.output_count == 2
        assert final.result.call_stats is not None
        assert final.result.call_stats.calls_succeeded == 2

        got = await worker.call(worker.stub.get_task_result, pb.GetTaskResultRequest(task_id="t1"))
        assert got.state == pb.TaskState.SUCCEEDED
        assert got.phase == pb.TaskPhase.TERMINAL
        assert got.result is not None
        assert got.result.task_code_epoch != ""


async def test_a_duplicate_submit_over_the_wire_runs_the_task_once() -> None:
    async with running_worker() as worker:
        task = call_list_task("dup", ("demo.add", [1, 1]))
        first = await worker.call(worker.stub.submit_task, pb.SubmitTaskRequest(task=task))
        second = await worker.call(worker.stub.submit_task, pb.SubmitTaskRequest(task=task))
        assert first.slot_id == second.slot_id
        await watch(worker, "dup")
        third = await worker.call(worker.stub.submit_task, pb.SubmitTaskRequest(task=task))
        assert third.state == pb.TaskState.SUCCEEDED
        assert third.result is not None
        assert worker.calls.started == ["dup"]


async def test_each_domain_error_reaches_the_client_as_its_status() -> None:
    async with running_worker() as worker:
        stub = worker.stub
        code, message = await status_of(
            worker, stub.request_task_slot, pb.RequestTaskSlotRequest(task_id="")
        )
        assert code is Status.INVALID_ARGUMENT
        assert "task_id" in message

        for n in range(4):
            await worker.call(stub.request_task_slot, pb.RequestTaskSlotRequest(task_id=f"r{n}"))
        code, message = await status_of(
            worker, stub.request_task_slot, pb.RequestTaskSlotRequest(task_id="r4")
        )
        assert code is Status.RESOURCE_EXHAUSTED
        assert "all 4 slots" in message

        task = call_list_task("r0", ("demo.add", [1, 2]))
        code, message = await status_of(
            worker, stub.submit_task, pb.SubmitTaskRequest(task=task, slot_id="slot-3")
        )
        assert code is Status.FAILED_PRECONDITION
        assert "held by task 'r3'" in message

        code, message = await status_of(
            worker, stub.get_task_result, pb.GetTaskResultRequest(task_id="nobody")
        )
        assert code is Status.NOT_FOUND
        assert "'nobody'" in message

        code, message = await status_of(worker, stub.submit_task, pb.SubmitTaskRequest())
        assert code is Status.INVALID_ARGUMENT
        assert "task is required" in message


def test_every_domain_error_code_has_its_documented_status() -> None:
    assert STATUS_OF == {
        ErrorCode.INVALID_ARGUMENT: Status.INVALID_ARGUMENT,
        ErrorCode.NO_SLOT: Status.RESOURCE_EXHAUSTED,
        ErrorCode.UNAVAILABLE: Status.UNAVAILABLE,
        ErrorCode.INVALID_SLOT: Status.FAILED_PRECONDITION,
        ErrorCode.NOT_FOUND: Status.NOT_FOUND,
        ErrorCode.SLOT_UNCERTAIN: Status.ABORTED,
    }
    errors = [
        InvalidArgument(field="task_id", value="", allowed="non-empty"),
        NoSlot(task_id="t", task_slots=2),
        Unavailable(task_id="t"),
        InvalidSlot(task_id="t", slot_id="slot-9", held_by=None, known=False),
        NotFound(task_id="t"),
        SlotUncertain(task_id="t", slot_id="slot-0", lease_expired_at_ms=5),
    ]
    statuses = [grpc_error(error).status for error in errors]
    assert statuses == [
        Status.INVALID_ARGUMENT,
        Status.RESOURCE_EXHAUSTED,
        Status.UNAVAILABLE,
        Status.FAILED_PRECONDITION,
        Status.NOT_FOUND,
        Status.ABORTED,
    ]
    assert grpc_error(errors[5]).message == str(errors[5])


async def test_failed_calls_and_unknown_builders_end_failed_with_their_codes() -> None:
    async with running_worker() as worker:
        failing = call_list_task("f1", ("demo.fail", []))
        await worker.call(worker.stub.submit_task, pb.SubmitTaskRequest(task=failing))
        unknown = pb.TaskSpec(task_id="f2", function_call=pb.FunctionCallConfig(type="dbscan9"))
        await worker.call(worker.stub.submit_task, pb.SubmitTaskRequest(task=unknown))
        updates = await watch(worker, "f1", "f2")
        results = {u.task_id: u.result for u in updates if u.is_terminal}
        assert results["f1"] is not None
        assert (results["f1"].state, results["f1"].failure_code) == (
            pb.TaskState.FAILED,
            "CALL_RAISED",
        )
        assert results["f1"].phase == pb.TaskPhase.CALLS
        assert results["f2"] is not None
        assert results["f2"].failure_code == "BUILDER_NOT_FOUND"
        assert "'dbscan9'" in results["f2"].message


async def test_a_task_naming_its_builder_by_its_camel_case_alias_runs_as_ours() -> None:
    """Coordinators written for the Go worker say `callList` for `call_list`."""
    async with running_worker() as worker:
        task = call_list_task("first", ("demo.add", [1, 2]), ("demo.add", [3, 4]))
        task.function_call = pb.FunctionCallConfig(type="callList")
        await worker.call(worker.stub.submit_task, pb.SubmitTaskRequest(task=task))
        scan = pb.FunctionCallConfig(type="bundleScan")  # reaches bundle_scan, which says why
        await worker.call(
            worker.stub.submit_task,
            pb.SubmitTaskRequest(task=pb.TaskSpec(task_id="scan", function_call=scan)),
        )
        missing = pb.FunctionCallConfig(type="tableScan")
        unknown = pb.TaskSpec(task_id="later", function_call=missing)
        await worker.call(worker.stub.submit_task, pb.SubmitTaskRequest(task=unknown))
        updates = await watch(worker, "first", "scan", "later")
        results = {u.task_id: u.result for u in updates if u.is_terminal}
        succeeded = results["first"]
        assert succeeded is not None
        assert (succeeded.state, succeeded.failure_code) == (pb.TaskState.SUCCEEDED, "")
        assert succeeded.call_stats is not None
        assert succeeded.call_stats.calls_succeeded == 2
        assert succeeded.execute_result is not None
        assert succeeded.execute_result.output_count == 2
        scanned = results["scan"]
        assert scanned is not None
        assert (scanned.failure_code, scanned.message) == (
            "BUILDER_FAILED",
            "bundle_scan: config_json.path is required: the bundle's directory; got None",
        )
        refused = results["later"]
        assert refused is not None
        assert (refused.state, refused.failure_code) == (pb.TaskState.FAILED, "BUILDER_NOT_FOUND")
        assert refused.message == (
            "unknown builder 'tableScan'; known builders: dbscan, call_list (callList), "
            "bundle_scan (bundleScan), static, payload"
        )


@pytest.mark.parametrize(
    ("builder", "plugin", "code", "message"),
    [
        pytest.param(
            "call_list",
            "nowhere",
            "PLUGIN_NOT_FOUND",
            "unknown plugin 'nowhere'; known plugins: log, test, jsonl, result, "
            "table_upserts (tableUpserts), bundle_write (bundleWrite)",
            id="plugin",
        ),
        pytest.param(
            "tableScan",
            "test",
            "BUILDER_NOT_FOUND",
            "unknown builder 'tableScan'; known builders: dbscan, call_list (callList), "
            "bundle_scan (bundleScan), static, payload",
            id="builder",
        ),
    ],
)
async def test_an_unknown_builder_or_plugin_fails_the_task_at_activation_before_any_call(
    builder: str, plugin: str, code: str, message: str
) -> None:
    """Found only after the calls ran, an unknown writer would waste them all."""
    async with running_worker() as worker:
        handler = pb.ResultHandler(type=plugin)
        task = call_list_task("lost", ("demo.add", [1, 2]), result_handler=handler)
        task.function_call = pb.FunctionCallConfig(type=builder)
        await worker.call(worker.stub.submit_task, pb.SubmitTaskRequest(task=task))
        updates = await watch(worker, "lost")
        final = updates[-1]
        assert final.is_terminal
        result = final.result
        assert result is not None
        assert (result.state, result.phase, result.failure_code, result.retryable) == (
            pb.TaskState.FAILED,
            pb.TaskPhase.PREPARING,
            code,
            False,
        )
        assert result.message == message
        # Neither the builder nor a call ran.
        ran = {pb.TaskPhase.BUILDER, pb.TaskPhase.CALLS, pb.TaskPhase.PLUGIN}
        assert not ran & {u.phase for u in updates}
        assert worker.calls.started == []
        assert result.call_stats is None or result.call_stats.calls_total == 0
        assert result.execute_result is None or result.execute_result.output_count == 0
        got = await worker.call(
            worker.stub.get_task_result, pb.GetTaskResultRequest(task_id="lost")
        )
        assert (got.state, got.phase) == (pb.TaskState.FAILED, pb.TaskPhase.TERMINAL)
        status = await worker.call(worker.stub.get_worker_status, pb.GetWorkerStatusRequest())
        assert status.free_slots == 4


async def test_a_task_past_its_timeout_ends_timed_out_and_its_calls_are_cancelled(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with running_worker(virtual_clock_config()) as worker:
        task = call_list_task("slow", ("demo.hang", []), task_timeout_ms=2_000)
        await worker.call(worker.stub.submit_task, pb.SubmitTaskRequest(task=task))
        updates = await watch(worker, "slow")
        final = updates[-1].result
        assert final is not None
        assert (final.state, final.failure_code, final.retryable) == (
            pb.TaskState.FAILED,
            "TIMED_OUT",
            True,
        )
        assert worker.calls.cancelled == ["slow"]


async def test_a_broken_watch_fails_the_task_after_the_grace(
    autojump_clock: trio.testing.MockClock,
) -> None:
    config = virtual_clock_config(**{"worker.watchDisconnectGraceMs": 3_000})
    async with running_worker(config) as worker:
        task = call_list_task("w1", ("demo.hang", []))
        await worker.call(worker.stub.submit_task, pb.SubmitTaskRequest(task=task))
        with trio.move_on_after(1):  # the client goes away mid-stream
            await watch(worker, "w1")
        got = await worker.call(worker.stub.get_task_result, pb.GetTaskResultRequest(task_id="w1"))
        assert got.state == pb.TaskState.RUNNING  # within the grace
        await trio.sleep(4)
        got = await worker.call(worker.stub.get_task_result, pb.GetTaskResultRequest(task_id="w1"))
        assert got.result is not None
        assert (got.result.failure_code, got.result.retryable) == ("WATCH_DISCONNECTED", False)


async def test_a_watcher_that_comes_back_within_the_grace_keeps_the_task(
    autojump_clock: trio.testing.MockClock,
) -> None:
    config = virtual_clock_config(**{"worker.watchDisconnectGraceMs": 3_000})
    async with running_worker(config) as worker:
        task = call_list_task("w2", ("demo.hang", []))
        await worker.call(worker.stub.submit_task, pb.SubmitTaskRequest(task=task))
        with trio.move_on_after(1):
            await watch(worker, "w2")
        with trio.move_on_after(10):  # reattached after 1 s; stays attached 10 s
            await watch(worker, "w2")
        got = await worker.call(worker.stub.get_task_result, pb.GetTaskResultRequest(task_id="w2"))
        assert got.state == pb.TaskState.RUNNING


async def test_watching_an_unknown_task_is_not_found() -> None:
    async with running_worker() as worker:
        with pytest.raises(GRPCError) as raised:
            await watch(worker, "ghost")
        assert raised.value.status is Status.NOT_FOUND
        assert "'ghost'" in str(raised.value.message)


async def test_drain_refuses_new_work_and_ends_what_is_left_for_its_watchers(
    autojump_clock: trio.testing.MockClock,
) -> None:
    config = virtual_clock_config(drainTimeoutMs=5_000)
    async with running_worker(config) as worker:
        task = call_list_task("d1", ("demo.hang", []))
        await worker.call(worker.stub.submit_task, pb.SubmitTaskRequest(task=task))
        await worker.calls.hanging.wait()
        seen: list[pb.TaskUpdate] = []

        async def follow() -> None:
            seen.extend(await watch(worker, "d1"))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(follow)
            await trio.sleep(0.1)
            worker.stop.set()
            await trio.sleep(0.1)
            code, message = await status_of(
                worker, worker.stub.request_task_slot, pb.RequestTaskSlotRequest(task_id="late")
            )
            assert code is Status.UNAVAILABLE
            assert "draining" in message
        final = seen[-1]
        assert final.is_terminal
        assert final.result is not None
        assert (final.result.failure_code, final.result.retryable) == ("WORKER_SHUTDOWN", True)
        assert trio.current_time() >= 5.0  # waited for the drain timeout first


async def test_slots_and_submits_wait_until_an_executor_is_healthy() -> None:
    async with running_worker(healthy=False) as worker:
        for method, request in (
            (worker.stub.request_task_slot, pb.RequestTaskSlotRequest(task_id="early")),
            (worker.stub.submit_task, pb.SubmitTaskRequest(task=call_list_task("early"))),
        ):
            code, message = await status_of(worker, method, request)
            assert code is Status.UNAVAILABLE
            assert "not ready" in message

        worker.calls.become_healthy()
        await trio.testing.wait_all_tasks_blocked()
        reply = await worker.call(
            worker.stub.submit_task, pb.SubmitTaskRequest(task=call_list_task("early"))
        )
        assert reply.state == pb.TaskState.RUNNING


async def test_a_drain_ends_as_soon_as_the_last_task_reaches_its_deadline(
    autojump_clock: trio.testing.MockClock,
) -> None:
    config = virtual_clock_config(drainTimeoutMs=30_000)
    async with running_worker(config) as worker:
        task = call_list_task("late", ("demo.hang", []), task_timeout_ms=2_000)
        await worker.call(worker.stub.submit_task, pb.SubmitTaskRequest(task=task))
        await worker.calls.hanging.wait()
        worker.stop.set()  # no one watches the task: only its deadline ends it
    assert 2.0 <= trio.current_time() < 3.0
    assert worker.calls.cancelled == ["late"]


REFLECTION_SERVICES = (
    "grpc.reflection.v1.ServerReflection",
    "grpc.reflection.v1alpha.ServerReflection",
)


async def test_health_serves_once_ready_and_reflection_lists_the_service() -> None:
    async with running_worker() as worker:
        health = HealthStub(worker.channel)
        await worker.serving.ready.wait()
        reply = await worker.call(health.Check, HealthCheckRequest(service=SERVICE_NAME))
        assert reply.status == HealthCheckResponse.SERVING
        reflection = reflection_v1_grpc.ServerReflectionStub(worker.channel)

        async def list_services() -> list[str]:
            request = reflection_v1.ServerReflectionRequest(list_services="")
            async with reflection.ServerReflectionInfo.open() as stream:
                await stream.send_message(request, end=True)
                response = await stream.recv_message()
                assert response is not None
                return [s.name for s in response.list_services_response.service]

        names = await trio_asyncio.aio_as_trio(list_services)()
        assert {SERVICE_NAME, "grpc.health.v1.Health", *REFLECTION_SERVICES} <= set(names)
        worker.serving.front_end.set_serving(False)
        reply = await worker.call(health.Check, HealthCheckRequest(service=SERVICE_NAME))
        assert reply.status == HealthCheckResponse.NOT_SERVING


@pytest.mark.parametrize(
    ("stub", "messages"),
    [
        pytest.param(reflection_v1_grpc, reflection_v1, id="v1"),
        pytest.param(reflection_v1alpha_grpc, reflection_v1alpha, id="v1alpha"),
    ],
)
async def test_reflection_answers_in_both_versions(stub: Any, messages: Any) -> None:
    """The official Python reflection client and many GUI clients speak only v1alpha."""
    async with running_worker() as worker:
        reflection = stub.ServerReflectionStub(worker.channel)

        async def ask(**question: str) -> Any:
            async with reflection.ServerReflectionInfo.open() as stream:
                await stream.send_message(messages.ServerReflectionRequest(**question), end=True)
                return await stream.recv_message()

        listed = await trio_asyncio.aio_as_trio(ask)(list_services="")
        names = {s.name for s in listed.list_services_response.service}
        assert {SERVICE_NAME, "grpc.health.v1.Health", *REFLECTION_SERVICES} <= names

        found = await trio_asyncio.aio_as_trio(ask)(file_containing_symbol=SERVICE_NAME)
        assert found.WhichOneof("message_response") == "file_descriptor_response"
        (serialized,) = found.file_descriptor_response.file_descriptor_proto
        file = FileDescriptorProto.FromString(serialized)
        assert file.package == "blockx.worker.v1"
        (service,) = file.service
        assert service.name == "WorkerService"
        methods = {method.name: method for method in service.method}
        assert "SubmitTask" in methods
        run_tasks = methods["RunTasks"]
        assert (run_tasks.client_streaming, run_tasks.server_streaming) == (True, True)
        assert run_tasks.input_type == ".blockx.worker.v1.RunTasksRequest"


async def test_a_request_over_the_size_limit_is_refused_naming_the_limit() -> None:
    config = worker_config(grpcMaxMessageBytes=1_024)
    async with running_worker(config) as worker:
        task = call_list_task("big", ("demo.add", [1, 2]))
        task.labels = {"pad": "x" * 2_000}
        code, message = await status_of(
            worker, worker.stub.submit_task, pb.SubmitTaskRequest(task=task)
        )
        assert code is Status.RESOURCE_EXHAUSTED
        assert "grpcMaxMessageBytes (1024)" in message


async def test_status_reports_slots() -> None:
    async with running_worker() as worker:
        await worker.call(worker.stub.request_task_slot, pb.RequestTaskSlotRequest(task_id="s1"))
        status = await worker.call(worker.stub.get_worker_status, pb.GetWorkerStatusRequest())
        assert (status.slots_total, status.reserved_slots, status.free_slots) == (4, 1, 3)
        assert status.deployment == "block"
        assert status.worker_addr == f"127.0.0.1:{worker.serving.port}"
        assert [s.state for s in status.slots] == ["ALLOCATED", "FREE", "FREE", "FREE"]
        assert status.slots[0].task_id == "s1"


async def test_channel_closed_is_harmless() -> None:
    async with running_worker() as worker:
        other = await trio_asyncio.aio_as_trio(_open)(worker.serving.port)
        other.close()
        status = await worker.call(worker.stub.get_worker_status, pb.GetWorkerStatusRequest())
        assert status.slots_total == 4


async def _open(port: int) -> Channel:
    return Channel("127.0.0.1", port)


async def test_a_lapsed_reservation_frees_its_slot_when_its_lease_ends(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with running_worker(virtual_clock_config()) as worker:
        await worker.call(
            worker.stub.request_task_slot, pb.RequestTaskSlotRequest(task_id="l1", ttl_ms=1_200)
        )
        await trio.sleep(1.190)
        status = await worker.call(worker.stub.get_worker_status, pb.GetWorkerStatusRequest())
        assert status.reserved_slots == 1
        await trio.sleep(0.020)  # the timer woke at the lease's end, not at a 500 ms tick
        status = await worker.call(worker.stub.get_worker_status, pb.GetWorkerStatusRequest())
        assert status.reserved_slots == 0
        code, _ = await status_of(
            worker, worker.stub.get_task_result, pb.GetTaskResultRequest(task_id="l1")
        )
        assert code is Status.NOT_FOUND


async def test_plugin_failures_unknown_plugins_and_slow_plugins_end_with_their_codes(
    autojump_clock: trio.testing.MockClock,
) -> None:
    config = virtual_clock_config(phaseIoTimeoutMs=1_000)
    async with running_worker(config) as worker:
        handlers = {
            "p1": pb.ResultHandler(type="test", config_json='{"fail": true, "message": "disk"}'),
            "p2": pb.ResultHandler(type="warehouse"),
            "p3": pb.ResultHandler(type="test", config_json='{"delay_ms": 5000}'),
            "p4": pb.ResultHandler(type="test"),
        }
        for task_id, handler in handlers.items():
            task = call_list_task(task_id, ("demo.add", [1, 2]), result_handler=handler)
            await worker.call(worker.stub.submit_task, pb.SubmitTaskRequest(task=task))
        updates = await watch(worker, *handlers)
        results = {u.task_id: u.result for u in updates if u.result is not None}
        codes = {task_id: (r.state, r.failure_code) for task_id, r in results.items()}
        assert codes == {
            "p1": (pb.TaskState.FAILED, "PLUGIN_FAILED"),
            "p2": (pb.TaskState.FAILED, "PLUGIN_NOT_FOUND"),
            "p3": (pb.TaskState.FAILED, "PHASE_IO_TIMEOUT"),
            "p4": (pb.TaskState.SUCCEEDED, ""),
        }
        assert results["p1"].message == "disk"
        assert "'warehouse'" in results["p2"].message
        assert "phaseIoTimeoutMs (1000)" in results["p3"].message
        assert results["p3"].retryable
        assert results["p4"].execute_result is not None
        assert results["p4"].execute_result.plugin_results[0].records_written == 1


async def test_call_values_kept_by_the_result_plugin_reach_get_result_and_watch() -> None:
    static = pb.FunctionCallConfig(
        type="static", config_json='{"function": "demo.add", "args": [20, 22], "count": 2}'
    )
    tasks = {
        "kept": pb.TaskSpec(
            task_id="kept", function_call=static, result_handler=pb.ResultHandler(type="result")
        ),
        "too-big": call_list_task(
            "too-big",
            ("demo.add", [1, 2]),
            ("demo.add", [3, 4]),
            result_handler=pb.ResultHandler(type="result", config_json='{"max_bytes": 4}'),
        ),
    }
    async with running_worker() as worker:
        for task in tasks.values():
            await worker.call(worker.stub.submit_task, pb.SubmitTaskRequest(task=task))
        updates = await watch(worker, *tasks)
        final = {u.task_id: u.result for u in updates if u.is_terminal}
        got = {
            task_id: await worker.call(
                worker.stub.get_task_result, pb.GetTaskResultRequest(task_id=task_id)
            )
            for task_id in tasks
        }

    kept = final["kept"]
    assert kept is not None
    assert (kept.state, kept.outputs_json) == (pb.TaskState.SUCCEEDED, "[42,42]")
    assert kept.execute_result is not None
    assert [(p.plugin_type, p.records_written) for p in kept.execute_result.plugin_results] == [
        ("result", 2)
    ]
    assert got["kept"].result == kept

    too_big = final["too-big"]
    assert too_big is not None
    assert (too_big.state, too_big.phase, too_big.failure_code, too_big.outputs_json) == (
        pb.TaskState.FAILED,
        pb.TaskPhase.PLUGIN,
        "OUTPUTS_TOO_LARGE",
        "",
    )
    assert too_big.message == (
        "result: the outputs take 5 bytes as JSON, over the limit of 4 bytes "
        "(config_json.max_bytes)"
    )
    assert got["too-big"].result == too_big


async def test_inline_plugins_store_in_the_slot_tables_step_and_a_declined_one_in_an_actor(
    autojump_clock: trio.testing.MockClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    actors: list[str] = []

    def counted(runtime: TaskRuntime, start: TaskStart) -> Awaitable[None]:
        actors.append(start.command.task_id)
        return run_task(runtime, start)

    keep = ResultPlugin.run_now

    def working(plugin: ResultPlugin, request: PluginRequest) -> PluginResult | None:
        autojump_clock.jump(0.025)  # the plugin's work, as the worker's clock sees it
        return keep(plugin, request)

    monkeypatch.setattr(slot_table, "run_task", counted)
    monkeypatch.setattr(ResultPlugin, "run_now", working)
    handlers = {
        "kept": pb.ResultHandler(type="result"),
        "refused": pb.ResultHandler(type="test", config_json='{"fail": true, "message": "full"}'),
        "delayed": pb.ResultHandler(type="test", config_json='{"delay_ms": 40}'),
    }
    async with running_worker(virtual_clock_config()) as worker:
        for task_id, handler in handlers.items():
            task = call_list_task(task_id, ("demo.add", [20, 22]), result_handler=handler)
            await worker.call(worker.stub.submit_task, pb.SubmitTaskRequest(task=task))
        updates = await watch(worker, *handlers)
    final = {u.task_id: u.result for u in updates if u.is_terminal and u.result is not None}

    kept, refused, delayed = final["kept"], final["refused"], final["delayed"]
    assert (kept.state, kept.outputs_json) == (pb.TaskState.SUCCEEDED, "[42]")
    assert kept.timings is not None
    assert kept.timings.plugin_ms == 25
    assert (refused.state, refused.phase, refused.failure_code, refused.message) == (
        pb.TaskState.FAILED,
        pb.TaskPhase.PLUGIN,
        "PLUGIN_FAILED",
        "full",
    )
    assert delayed.state == pb.TaskState.SUCCEEDED
    assert delayed.timings is not None
    assert delayed.timings.plugin_ms == 40
    assert actors == ["delayed"]  # the one its plugin declined to run in a step


async def test_a_result_read_again_is_the_same_and_a_rerun_after_purge_is_new(
    autojump_clock: trio.testing.MockClock,
) -> None:
    config = virtual_clock_config(**{"worker.resultRetentionMs": 1_000})
    async with running_worker(config) as worker:
        task = call_list_task("again", ("demo.add", [1, 2]))
        request = pb.GetTaskResultRequest(task_id="again")
        await worker.call(worker.stub.submit_task, pb.SubmitTaskRequest(task=task))
        await watch(worker, "again")
        first = await worker.call(worker.stub.get_task_result, request)
        second = await worker.call(worker.stub.get_task_result, request)
        assert first == second
        assert first.result is not None
        await trio.sleep(2)  # past the retention
        code, _ = await status_of(worker, worker.stub.get_task_result, request)
        assert code is Status.NOT_FOUND
        await worker.call(worker.stub.submit_task, pb.SubmitTaskRequest(task=task))
        await watch(worker, "again")
        third = await worker.call(worker.stub.get_task_result, request)
        assert third.result is not None
        assert third.result.accepted_at_ms > first.result.finished_at_ms
        assert worker.calls.started == ["again", "again"]


async def test_ended_tasks_are_watched_and_read_without_a_trip_to_the_slot_table(
    autojump_clock: trio.testing.MockClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = virtual_clock_config(**{"worker.resultRetentionMs": 1_000})
    async with running_worker(config) as worker:
        for task_id in ("e1", "e2"):
            task = call_list_task(task_id, ("demo.add", [1, 2]))
            await worker.call(worker.stub.submit_task, pb.SubmitTaskRequest(task=task))
            await watch(worker, task_id)
        inbox = worker.serving.slot_table
        posted: list[str] = []
        post = inbox.post

        def recording(message: SlotTableMessage) -> None:
            posted.append(type(message).__name__)
            post(message)

        monkeypatch.setattr(inbox, "post", recording)
        updates = await watch(worker, "e2", "e1", "e2")
        assert [(update.task_id, update.state) for update in updates] == [
            ("e2", pb.TaskState.SUCCEEDED),
            ("e1", pb.TaskState.SUCCEEDED),
        ]
        assert all(update.is_terminal and update.result is not None for update in updates)
        request = pb.GetTaskResultRequest(task_id="e1")
        read = await worker.call(worker.stub.get_task_result, request)
        assert read.state == pb.TaskState.SUCCEEDED
        assert posted == []
        with pytest.raises(GRPCError) as raised:  # one id not ended: the slot table answers
            await watch(worker, "e1", "ghost")
        assert raised.value.status is Status.NOT_FOUND
        assert posted[0] == "OpenWatch"
        await trio.sleep(2)  # past the retention: forgotten, and no longer answered here
        posted.clear()
        code, _ = await status_of(worker, worker.stub.get_task_result, request)
        assert code is Status.NOT_FOUND
        assert posted == ["GetResult"]


async def test_results_past_the_byte_bound_are_evicted_oldest_first_and_read_as_evicted(
    autojump_clock: trio.testing.MockClock,
) -> None:
    # Each result here counts some 140 bytes: two fit under 300.
    config = virtual_clock_config(**{"worker.resultRetentionBytes": 300})
    async with running_worker(config) as worker:
        for task_id in ("r1", "r2", "r3", "r4"):
            task = call_list_task(task_id, ("demo.add", [1, 2]))
            await worker.call(worker.stub.submit_task, pb.SubmitTaskRequest(task=task))
            await watch(worker, task_id)
            await trio.sleep(1)
        kept = [
            await worker.call(worker.stub.get_task_result, pb.GetTaskResultRequest(task_id=kept))
            for kept in ("r3", "r4")
        ]
        assert [got.state for got in kept] == [pb.TaskState.SUCCEEDED] * 2
        status = await worker.call(worker.stub.get_worker_status, pb.GetWorkerStatusRequest())
        assert status.retained_results == 2
        assert 200 < status.retained_bytes <= 300
        for evicted in ("r1", "r2"):
            request = pb.GetTaskResultRequest(task_id=evicted)
            code, message = await status_of(worker, worker.stub.get_task_result, request)
            assert code is Status.NOT_FOUND
            assert f"the result of task {evicted!r} was evicted" in message
            assert "worker.resultRetentionBytes" in message
        with pytest.raises(GRPCError) as raised:
            await watch(worker, "r1")
        assert raised.value.status is Status.NOT_FOUND
        assert "evicted" in str(raised.value.message)
        request = pb.GetTaskResultRequest(task_id="r0")
        _, unknown = await status_of(worker, worker.stub.get_task_result, request)
        assert "is unknown" in unknown


async def test_a_call_phase_waits_for_executor_admission_and_runs_once_it_is_freed(
    autojump_clock: trio.testing.MockClock,
) -> None:
    # One task at a time may hold the executors: the second task's calls wait,
    # built, until the first one's end frees its admission.
    config = virtual_clock_config(**{"admission.executorTaskSlots": 1})
    async with running_worker(config) as worker:
        slow = call_list_task("slow", ("demo.hang", []), task_timeout_ms=2_000)
        quick = call_list_task("quick", ("demo.add", [2, 3]))
        for task in (slow, quick):
            await worker.call(worker.stub.submit_task, pb.SubmitTaskRequest(task=task))
        await trio.sleep(1)
        got = await worker.call(
            worker.stub.get_task_result, pb.GetTaskResultRequest(task_id="quick")
        )
        assert (got.state, got.phase) == (pb.TaskState.RUNNING, pb.TaskPhase.CALLS)
        assert worker.calls.started == ["slow"]
        [update] = [u for u in await watch(worker, "quick") if u.is_terminal]
        assert update.result is not None
        assert update.result.state == pb.TaskState.SUCCEEDED
        assert worker.calls.started == ["slow", "quick"]
        assert worker.calls.cancelled == ["slow"]


class _WaitingCallList:
    """call_list with only the awaitable `build`, as a builder doing IO has: its task
    gets a task actor."""

    name = "call_list"
    usage = "call_list, awaited"

    def __init__(self) -> None:
        self.built: list[str] = []

    async def build(self, request: BuildRequest) -> list[CallSpec]:
        await trio.sleep(0.01)
        self.built.append(request.task_id)
        return call_list_calls(request)


async def test_a_builder_that_waits_runs_in_a_task_actor_with_or_without_a_plugin(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    builder = _WaitingCallList()
    monkeypatch.setitem(builders._FACTORIES, "call_list", lambda: builder)
    tasks = [
        call_list_task("bare", ("demo.add", [1, 2])),
        call_list_task(
            "kept", ("demo.add", [3, 4]), result_handler=pb.ResultHandler(type="result")
        ),
        call_list_task("failing", ("demo.fail", [])),
    ]
    async with running_worker() as worker:
        for task in tasks:
            await worker.call(worker.stub.submit_task, pb.SubmitTaskRequest(task=task))
        updates = await watch(worker, "bare", "kept", "failing")
    final = {u.task_id: u.result for u in updates if u.is_terminal and u.result is not None}
    assert {task_id: (r.state, r.outputs_json) for task_id, r in final.items()} == {
        "bare": (pb.TaskState.SUCCEEDED, ""),
        "kept": (pb.TaskState.SUCCEEDED, "[7]"),
        "failing": (pb.TaskState.FAILED, ""),
    }
    assert final["kept"].message == ""
    assert final["failing"].failure_code == "CALL_RAISED"
    assert sorted(builder.built) == ["bare", "failing", "kept"]
    assert sorted(worker.calls.started) == ["bare", "failing", "kept"]


@pytest.mark.skipif(
    not hasattr(os, "sched_getaffinity") or len(os.sched_getaffinity(0)) < 2,
    reason="needs Linux and at least 2 CPUs",
)
async def test_an_in_process_worker_holds_its_threads_cpu_only_while_it_serves() -> None:
    allowed = os.sched_getaffinity(0)
    policy = os.sched_getscheduler(0)
    with trio.CancelScope() as serving:
        async with running_worker():
            assert len(os.sched_getaffinity(0)) == 1  # pinLoopThreads, on by default
            [grpc_loop] = [t for t in threading.enumerate() if t.name == "grpc-loop"]
            assert grpc_loop.native_id is not None
            for thread_id in (0, grpc_loop.native_id):  # woken, neither preempts the other
                assert os.sched_getscheduler(thread_id) == os.SCHED_BATCH
            serving.cancel()  # ended by cancellation, not by its stop event
            await trio.sleep_forever()
    assert os.sched_getaffinity(0) == allowed
    assert os.sched_getscheduler(0) == policy
