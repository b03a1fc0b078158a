"""Shadow submits between two in-process workers.

The shadow target is the outer worker, reached through a `WorkerClient` made
while its own asyncio loop is current; the primary is the inner one, reached
through its harness.
"""

from __future__ import annotations

import inspect
import json
import socket
from collections.abc import Awaitable, Callable

import pytest
import trio
import trio.testing

from blockx import app
from blockx._proto.blockx.worker import v1 as pb
from blockx.client import ShadowForwarder, WorkerCallError, WorkerClient, _shadow
from blockx.client._shadow import RECENT_TASKS
from blockx.identity import WorkerIdentity
from blockx.phases.plugins import test_outputs as stored_outputs
from blockx.settings import ConfigError
from blockx.slots import SHADOW_LABEL
from tests.adapters.test_run_tasks import finished, refusals, run
from tests.adapters.worker_harness import Harness, call_list_task, running_worker, worker_config
from tests.worker_results import result_once_there

POLL_S = 0.01


def closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def forwarder_of(worker: Harness) -> ShadowForwarder:
    """The forwarder whose `offer` the worker's SubmitTask handler calls."""
    offer = worker.serving.front_end.service.shadow
    assert inspect.ismethod(offer)
    forwarder = offer.__self__
    assert isinstance(forwarder, ShadowForwarder)
    assert offer == forwarder.offer
    return forwarder


async def until(condition: Callable[[], bool]) -> None:
    while not condition():
        await trio.sleep(POLL_S)


async def submit(worker: Harness, task: pb.TaskSpec) -> pb.SubmitTaskResponse:
    return await worker.call(worker.stub.submit_task, pb.SubmitTaskRequest(task=task))


async def primary_result(worker: Harness, task_id: str) -> pb.TaskResult:
    while True:
        response = await worker.call(
            worker.stub.get_task_result, pb.GetTaskResultRequest(task_id=task_id)
        )
        if response.result is not None:
            return response.result
        await trio.sleep(POLL_S)


def written_task(task_id: str, *, delay_ms: int = 0) -> pb.TaskSpec:
    return call_list_task(
        task_id,
        ("demo.add", [1, 2]),
        result_handler=pb.ResultHandler(
            type="test", config_json=json.dumps({"delay_ms": delay_ms})
        ),
        labels={"team": "a"},
    )


async def with_target_and_primary(
    body: Callable[[WorkerClient, Harness], Awaitable[None]], **primary: object
) -> None:
    async with running_worker() as target:
        address = f"127.0.0.1:{target.serving.port}"
        async with WorkerClient.connect(address) as target_client:
            config = worker_config(shadowSubmitTargetAddr=address, **primary)
            async with running_worker(config) as worker:
                await body(target_client, worker)


async def test_a_sampled_submit_reaches_the_target_without_its_result_handler() -> None:
    async def body(target: WorkerClient, primary: Harness) -> None:
        # The primary's plugin waits: had the shadow kept its handler, it would
        # have written before its own result, while the store is still empty.
        reply = await submit(primary, written_task("mirrored", delay_ms=500))
        assert reply.state == pb.TaskState.RUNNING

        shadow_result = await result_once_there(target, "mirrored", poll_s=POLL_S)
        assert shadow_result.state == pb.TaskState.SUCCEEDED
        assert shadow_result.execute_result is not None
        assert shadow_result.execute_result.output_count == 1
        assert shadow_result.execute_result.plugin_results == []
        assert stored_outputs("mirrored") is None

        result = await primary_result(primary, "mirrored")
        assert result.state == pb.TaskState.SUCCEEDED
        assert result.execute_result is not None
        assert [p.plugin_type for p in result.execute_result.plugin_results] == ["test"]
        assert stored_outputs("mirrored") == [3]
        shadow = forwarder_of(primary)
        assert (shadow.queued, shadow.sent, shadow.failed, shadow.dropped) == (1, 1, 0, 0)

        # A duplicate of the finished task is answered from its result: nothing is mirrored.
        again = await submit(primary, written_task("mirrored"))
        assert again.state == pb.TaskState.SUCCEEDED
        assert shadow.queued == 1

    with trio.fail_after(20):
        await with_target_and_primary(body, shadowSubmitSampleRate=1.0)


async def test_rate_zero_mirrors_nothing() -> None:
    async def body(target: WorkerClient, primary: Harness) -> None:
        assert primary.serving.front_end.service.shadow is None
        await submit(primary, written_task("kept"))
        result = await primary_result(primary, "kept")
        assert result.state == pb.TaskState.SUCCEEDED
        with pytest.raises(WorkerCallError) as raised:
            await target.result("kept")
        assert raised.value.status.name == "NOT_FOUND"

    with trio.fail_after(20):
        await with_target_and_primary(body, shadowSubmitSampleRate=0.0)


async def test_the_primary_answers_at_once_when_the_target_is_down() -> None:
    config = worker_config(
        shadowSubmitTargetAddr=f"127.0.0.1:{closed_port()}", shadowSubmitSampleRate=1.0
    )
    with trio.fail_after(20):
        async with running_worker(config) as primary:
            with trio.fail_after(1):
                reply = await submit(primary, written_task("alone"))
            assert reply.state == pb.TaskState.RUNNING
            result = await primary_result(primary, "alone")
            assert result.state == pb.TaskState.SUCCEEDED
            assert stored_outputs("alone") == [3]
            shadow = forwarder_of(primary)
            await until(lambda: shadow.failed == 1)
            assert (shadow.queued, shadow.sent) == (1, 0)


async def test_the_primary_answers_at_once_when_the_target_never_answers(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(_shadow, "SEND_TIMEOUT_S", 0.2)
    with trio.fail_after(20):
        # A listener that accepts connections and never speaks.
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        port = listeners[0].socket.getsockname()[1]
        async with trio.open_nursery() as nursery:
            nursery.start_soon(trio.serve_listeners, _hold, listeners)
            config = worker_config(
                shadowSubmitTargetAddr=f"127.0.0.1:{port}", shadowSubmitSampleRate=1.0
            )
            async with running_worker(config) as primary:
                for task_id in ("slow-1", "slow-2"):
                    with trio.fail_after(1):
                        reply = await submit(primary, written_task(task_id))
                    assert reply.state == pb.TaskState.RUNNING
                for task_id in ("slow-1", "slow-2"):
                    assert (await primary_result(primary, task_id)).state == (
                        pb.TaskState.SUCCEEDED
                    )
                shadow = forwarder_of(primary)
                await until(lambda: shadow.failed == 2)
                assert shadow.sent == 0
            nursery.cancel_scope.cancel()


async def _hold(stream: trio.SocketStream) -> None:
    async with stream:
        await trio.sleep_forever()


async def test_a_shadow_submit_is_stripped_and_never_mirrored_again() -> None:
    config = worker_config(
        shadowSubmitTargetAddr=f"127.0.0.1:{closed_port()}", shadowSubmitSampleRate=1.0
    )
    with trio.fail_after(20):
        async with running_worker(config) as worker:
            task = written_task("from-elsewhere")
            task.labels[SHADOW_LABEL] = "10.0.0.9:8081"
            assert (await submit(worker, task)).state == pb.TaskState.RUNNING
            result = await primary_result(worker, "from-elsewhere")
            assert result.state == pb.TaskState.SUCCEEDED
            assert result.execute_result is not None
            assert result.execute_result.plugin_results == []
            assert stored_outputs("from-elsewhere") is None
            assert forwarder_of(worker).queued == 0


async def test_offer_samples_at_the_rate_and_drops_when_the_queue_is_full() -> None:
    draws = iter([0.7, 0.2, 0.1, 0.3])
    shadow = ShadowForwarder(
        target_addr=":9",
        sample_rate=0.5,
        source_addr="me:1",
        queue_tasks=2,
        draw=lambda: next(draws),
    )
    assert shadow.target_addr == "127.0.0.1:9"
    offered = [shadow.offer(written_task(f"t{n}")) for n in range(4)]
    assert offered == [False, True, True, False]
    assert (shadow.queued, shadow.dropped) == (2, 1)


def test_a_repeat_submit_is_neither_drawn_again_nor_mirrored_twice() -> None:
    draws = iter([0.1, 0.9])
    shadow = ShadowForwarder(
        target_addr=":9", sample_rate=0.5, source_addr="me:1", draw=lambda: next(draws)
    )
    assert shadow.offer(written_task("sampled"))
    assert not shadow.offer(written_task("sampled"))
    assert not shadow.offer(written_task("not-sampled"))
    assert not shadow.offer(written_task("not-sampled"))  # no third draw: none left
    assert shadow.queued == 1


def test_only_the_most_recent_task_ids_are_remembered() -> None:
    shadow = ShadowForwarder(
        target_addr=":9", sample_rate=1.0, source_addr="me:1", queue_tasks=RECENT_TASKS + 2
    )
    for n in range(RECENT_TASKS + 1):
        assert shadow.offer(written_task(f"t{n}"))
    assert shadow.offer(written_task("t0"))  # forgotten, so offered again
    assert not shadow.offer(written_task(f"t{RECENT_TASKS}"))


def test_a_shadow_target_that_cannot_be_dialled_is_a_config_error() -> None:
    identity = WorkerIdentity(
        worker_addr="127.0.0.1:8081", deployment="block", version="0", started_at_ms=0
    )
    with pytest.raises(ConfigError, match="shadowSubmitTargetAddr"):
        app._shadow(
            worker_config(shadowSubmitTargetAddr="127.0.0.1:0", shadowSubmitSampleRate=1.0),
            identity,
            None,
            None,
        )
    assert app._shadow(worker_config(shadowSubmitTargetAddr="none"), identity, None, None) is None
    assert (
        app._shadow(
            worker_config(shadowSubmitTargetAddr="NONE", shadowSubmitSampleRate=0.5),
            identity,
            None,
            None,
        )
        is None
    )


async def test_tasks_accepted_on_a_run_stream_are_mirrored_and_refused_ones_are_not() -> None:
    config = worker_config(
        shadowSubmitTargetAddr=f"127.0.0.1:{closed_port()}", shadowSubmitSampleRate=1.0
    )
    with trio.fail_after(20):
        async with running_worker(config) as worker:
            requests = [
                pb.RunTasksRequest(task=written_task("streamed-1")),
                pb.RunTasksRequest(task=written_task(""), slot_id=""),  # refused: no task id
                pb.RunTasksRequest(task=written_task("streamed-2")),
            ]
            responses = await run(worker, *requests)
            assert [len(refusals(responses)), len(finished(responses))] == [1, 2]
            shadow = forwarder_of(worker)
            await until(lambda: shadow.failed == 2)  # the target is closed: both fail
            await trio.testing.wait_all_tasks_blocked()
            assert (shadow.queued, shadow.failed) == (2, 2)  # not the refused one
