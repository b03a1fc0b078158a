"""`WorkerClient.run_tasks`, and `submit --file TASKS.jsonl` that uses it, against an
in-process worker: real actors and server, fake executors.

Every test runs under `fail_after` (virtual time where the clock autojumps).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import trio
import trio.testing
from grpclib.const import Status

from blockx._proto.blockx.worker import v1 as pb
from blockx.client import (
    RUN_TASKS_BATCH,
    TaskOutcome,
    WorkerCallError,
    WorkerClient,
    WorkerUnreachable,
)
from blockx.client import _worker as client_worker
from blockx.client._worker import outcomes_of
from blockx.errors import Misuse
from tests.adapters.test_client import run_cli
from tests.adapters.test_discovery_placement import address, free_port
from tests.adapters.worker_harness import (
    Harness,
    call_list_task,
    running_worker,
    virtual_clock_config,
)

FAIL_AFTER_S = 10


def add(task_id: str, a: int = 1, b: int = 2, **fields: object) -> pb.TaskSpec:
    return call_list_task(task_id, ("demo.add", [a, b]), **fields)


def hang(task_id: str, **fields: object) -> pb.TaskSpec:
    return call_list_task(task_id, ("demo.hang", []), **fields)


def outcome_of(task_id: str) -> TaskOutcome:
    return TaskOutcome(
        task_id=task_id, worker_addr="127.0.0.1:1", result=pb.TaskResult(task_id=task_id)
    )


async def run_all(client: WorkerClient, tasks: object) -> list[TaskOutcome]:
    async with client.run_tasks(tasks) as outcomes:  # type: ignore[arg-type]
        return [outcome async for outcome in outcomes]


async def result_of(harness: Harness, task_id: str) -> pb.TaskResult:
    async with WorkerClient.connect(address(harness)) as client:
        response = await client.result(task_id)
    assert response.result is not None
    return response.result


async def test_every_task_ends_once_with_its_result_even_beyond_the_free_slots() -> None:
    with trio.fail_after(FAIL_AFTER_S):
        async with running_worker() as worker, WorkerClient.connect(address(worker)) as client:
            tasks = [add(f"t{i}", i, i) for i in range(10)]  # 4 slots: the worker holds the rest
            outcomes = await run_all(client, tasks)

    assert sorted(outcome.task_id for outcome in outcomes) == sorted(t.task_id for t in tasks)
    for outcome in outcomes:
        assert outcome.succeeded
        assert outcome.error is None
        assert outcome.refusal is None
        assert outcome.worker_addr == client.address
        assert outcome.accepted is not None
        assert outcome.accepted.task_id == outcome.task_id
        assert outcome.result is not None
        assert outcome.result.call_stats is not None
        assert outcome.result.call_stats.calls_succeeded == 1
    assert sorted(worker.calls.started) == sorted(t.task_id for t in tasks)


async def test_a_refusal_is_an_outcome_with_the_status_and_the_stream_goes_on() -> None:
    with trio.fail_after(FAIL_AFTER_S):
        async with running_worker() as worker, WorkerClient.connect(address(worker)) as client:
            outcomes = await run_all(
                client, [add(""), (add("in-slot"), "slot-9"), add("fails-not")]
            )

    by_id = {outcome.task_id: outcome for outcome in outcomes}
    assert sorted(by_id) == ["", "fails-not", "in-slot"]
    for task_id, status in (("", Status.INVALID_ARGUMENT), ("in-slot", Status.FAILED_PRECONDITION)):
        refusal = by_id[task_id].refusal
        assert refusal is not None
        assert (refusal.rpc, refusal.status) == ("RunTasks", status)
        assert by_id[task_id].result is None
        assert by_id[task_id].accepted is None
    assert "slot-9" in str(by_id["in-slot"].error)
    assert by_id["fails-not"].succeeded
    assert worker.calls.started == ["fails-not"]


async def test_a_task_that_ended_before_comes_back_with_its_result_and_does_not_run_again() -> None:
    with trio.fail_after(FAIL_AFTER_S):
        async with running_worker() as worker, WorkerClient.connect(address(worker)) as client:
            await client.run_task(add("done", 20, 22))
            [outcome] = await run_all(client, [add("done", 20, 22)])

    assert outcome.succeeded
    assert outcome.accepted is not None
    assert outcome.accepted.state == pb.TaskState.SUCCEEDED
    assert outcome.accepted.result == outcome.result
    assert worker.calls.started == ["done"]


async def test_tasks_come_from_an_async_iterable_and_may_name_a_reserved_slot() -> None:
    with trio.fail_after(FAIL_AFTER_S):
        async with running_worker() as worker, WorkerClient.connect(address(worker)) as client:
            slot = await client.request_slot("held")

            async def tasks() -> AsyncIterator[pb.TaskSpec | tuple[pb.TaskSpec, str]]:
                yield (add("held"), slot.slot_id)
                yield add("free")

            outcomes = await run_all(client, tasks())

    by_id = {outcome.task_id: outcome for outcome in outcomes}
    held = by_id["held"].accepted
    assert held is not None
    assert held.slot_id == slot.slot_id
    assert by_id["held"].succeeded
    assert by_id["free"].succeeded


async def test_sending_goes_on_while_outcomes_are_read() -> None:
    # The source waits for the first outcome before it gives the second task:
    # were sending and reading one after the other, this would never end.
    with trio.fail_after(FAIL_AFTER_S):
        async with running_worker() as worker, WorkerClient.connect(address(worker)) as client:
            first_ended = trio.Event()

            async def tasks() -> AsyncIterator[pb.TaskSpec]:
                yield add("first")
                await first_ended.wait()
                yield add("second")

            seen: list[str] = []
            async with client.run_tasks(tasks()) as outcomes:
                async for outcome in outcomes:
                    seen.append(outcome.task_id)
                    first_ended.set()

    assert seen == ["first", "second"]


async def test_a_drain_refuses_held_tasks_as_unavailable(
    autojump_clock: trio.testing.MockClock,
) -> None:
    config = virtual_clock_config(drainTimeoutMs=5_000, **{"worker.taskSlots": 1})
    async with (
        running_worker(config) as worker,
        WorkerClient.connect(address(worker)) as client,
        client.run_tasks([hang("d0"), add("d1"), add("d2")]) as outcomes,
    ):
        await worker.calls.hanging.wait()
        worker.stop.set()  # d1 and d2 wait for d0's slot when the drain begins
        ended = [outcome async for outcome in outcomes]

    refused = [(o.task_id, o.refusal.status) for o in ended if o.refusal is not None]
    assert refused == [("d1", Status.UNAVAILABLE), ("d2", Status.UNAVAILABLE)]
    assert ended[-1].task_id == "d0"
    assert ended[-1].result is not None
    assert (ended[-1].result.failure_code, ended[-1].result.retryable) == ("WORKER_SHUTDOWN", True)


async def test_leaving_early_resets_the_stream_and_the_worker_counts_a_broken_watch(
    autojump_clock: trio.testing.MockClock,
) -> None:
    config = virtual_clock_config(**{"worker.watchDisconnectGraceMs": 3_000})
    async with running_worker(config) as worker, WorkerClient.connect(address(worker)) as client:
        async with client.run_tasks([add("quick"), hang("left")]) as outcomes:
            async for outcome in outcomes:
                assert outcome.task_id == "quick"
                break
        await trio.sleep(4)
        result = await client.result("left")
        # The client is still usable after the reset.
        assert (await client.status()).running_tasks == 0
    assert result.result is not None
    assert result.result.failure_code == "WATCH_DISCONNECTED"


async def test_leaving_while_the_next_outcome_waits_to_be_handed_over_cancels_quietly() -> None:
    # The reader leaves with the producer blocked handing over the second outcome: the
    # producer is cancelled, and no BrokenResourceError (the reader closed its end)
    # escapes from the block, as it did when the channel was closed before the cancel.
    producer_cancelled = False

    async def produce(ended: trio.MemorySendChannel[TaskOutcome]) -> None:
        nonlocal producer_cancelled
        with ended:
            try:
                for task_id in ("first", "second"):
                    await ended.send(outcome_of(task_id))
            except trio.Cancelled:
                producer_cancelled = True
                raise

    with trio.fail_after(FAIL_AFTER_S):
        async with outcomes_of(produce) as outcomes:
            async for outcome in outcomes:
                assert outcome.task_id == "first"
                await trio.testing.wait_all_tasks_blocked()
                assert outcomes.statistics().tasks_waiting_send == 1  # "second", held
                break
    assert producer_cancelled


async def test_an_error_of_the_reader_reaches_the_caller_alone_while_an_outcome_waits() -> None:
    async def produce(ended: trio.MemorySendChannel[TaskOutcome]) -> None:
        with ended:
            for task_id in ("first", "second"):
                await ended.send(outcome_of(task_id))

    async def read_and_break() -> None:
        async with outcomes_of(produce) as outcomes:
            async for _ in outcomes:
                await trio.testing.wait_all_tasks_blocked()
                assert outcomes.statistics().tasks_waiting_send == 1
                raise ValueError("the reader broke")

    with trio.fail_after(FAIL_AFTER_S), pytest.raises(ValueError, match="the reader broke"):
        await read_and_break()


async def test_cancelling_the_reader_resets_the_stream(
    autojump_clock: trio.testing.MockClock,
) -> None:
    config = virtual_clock_config(**{"worker.watchDisconnectGraceMs": 3_000})
    async with running_worker(config) as worker, WorkerClient.connect(address(worker)) as client:
        with trio.move_on_after(1):
            await run_all(client, [hang("h1")])
        await trio.sleep(4)
        result = await client.result("h1")
    assert result.result is not None
    assert result.result.failure_code == "WATCH_DISCONNECTED"


async def test_an_unreachable_worker_raises_worker_unreachable_unwrapped() -> None:
    with trio.fail_after(FAIL_AFTER_S):
        async with running_worker() as _:
            gone = f"127.0.0.1:{free_port()}"
            async with WorkerClient.connect(gone) as client:
                with pytest.raises(WorkerUnreachable) as caught:
                    await run_all(client, [add("t1")])
    assert caught.value.address == gone
    assert isinstance(caught.value.__cause__, OSError)


async def test_an_error_of_the_task_source_ends_the_stream_and_reaches_the_caller(
    autojump_clock: trio.testing.MockClock,
) -> None:
    config = virtual_clock_config(**{"worker.watchDisconnectGraceMs": 3_000})
    async with running_worker(config) as worker, WorkerClient.connect(address(worker)) as client:

        async def tasks() -> AsyncIterator[pb.TaskSpec]:
            yield hang("before")
            await worker.calls.hanging.wait()
            raise ValueError("the source broke")

        with pytest.raises(ValueError, match="the source broke"):
            await run_all(client, tasks())
        await trio.sleep(4)
        result = await client.result("before")
    assert result.result is not None
    assert result.result.failure_code == "WATCH_DISCONNECTED"


async def test_an_item_that_is_not_a_task_is_a_misuse() -> None:
    with trio.fail_after(FAIL_AFTER_S):
        async with running_worker() as worker, WorkerClient.connect(address(worker)) as client:
            with pytest.raises(Misuse, match="TaskSpec or"):
                await run_all(client, ["t1"])
            with contextlib.suppress(WorkerCallError):
                assert (await client.status()).running_tasks == 0


async def test_a_list_of_tasks_goes_in_requests_of_up_to_a_batch_in_its_order() -> None:
    with trio.fail_after(FAIL_AFTER_S):
        async with running_worker() as worker, WorkerClient.connect(address(worker)) as client:
            slot = await client.request_slot("held")
            tasks: list[pb.TaskSpec | tuple[pb.TaskSpec, str]] = [
                add(f"t{i}", i) for i in range(2 * RUN_TASKS_BATCH + 10)
            ]
            tasks[5] = (add("held"), slot.slot_id)
            outcomes = await run_all(client, tasks)
            assert client.run_tasks_requests == 3  # 64 + 64 + 10
    by_id = {outcome.task_id: outcome for outcome in outcomes}
    assert len(by_id) == len(tasks)
    assert all(outcome.succeeded for outcome in outcomes)
    held = by_id["held"].accepted
    assert held is not None
    assert held.slot_id == slot.slot_id


# --- submit --file TASKS.jsonl -------------------------------------------------------------


def line_of(task_id: str, function: str, args: list[object], **keys: object) -> str:
    payload = {"calls": [{"function": function, "args": args}]}
    return json.dumps({"task_id": task_id, "builder": "call_list", "payload": payload, **keys})


async def test_cli_submit_a_batch_prints_a_line_per_task_and_a_summary(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    batch = tmp_path / "tasks.jsonl"
    lines = [line_of(f"add-{i}", "demo.add", [i, 1]) for i in range(6)]
    lines += [line_of("kept", "demo.add", [20, 22], plugin="result")]
    lines += [line_of("boom", "demo.fail", [])]
    batch.write_text("\n".join(lines) + "\n", encoding="utf-8")
    with trio.fail_after(FAIL_AFTER_S):
        async with running_worker() as worker:
            status = await run_cli("submit", "--worker", address(worker), "--file", str(batch))

    captured = capsys.readouterr()
    printed = {line["task_id"]: line for line in map(json.loads, captured.out.splitlines())}
    assert sorted(printed) == sorted([*(f"add-{i}" for i in range(6)), "kept", "boom"])
    assert printed["add-0"] == {"task_id": "add-0", "state": "SUCCEEDED", "failure_code": ""}
    assert printed["kept"]["outputs"] == [42]
    assert printed["boom"]["state"] == "FAILED"
    assert printed["boom"]["failure_code"] == "CALL_RAISED"
    assert captured.err.splitlines()[-1] == "blockx: 8 tasks: 1 failed, 7 succeeded"
    assert status == 1


async def test_cli_submit_a_batch_that_all_succeeds_exits_0(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    batch = tmp_path / "tasks.ndjson"
    batch.write_text(line_of("only", "demo.add", [1, 2]) + "\n", encoding="utf-8")
    with trio.fail_after(FAIL_AFTER_S):
        async with running_worker() as worker:
            status = await run_cli("submit", "--worker", address(worker), "--file", str(batch))
    captured = capsys.readouterr()
    assert status == 0
    assert json.loads(captured.out) == {"task_id": "only", "state": "SUCCEEDED", "failure_code": ""}
    assert captured.err == "blockx: 1 task: 1 succeeded\n"


async def test_cli_submit_sends_the_file_in_batches(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    sizes: list[int] = []
    make_request = client_worker._run_request

    def counted(items: list[pb.RunTasksItem]) -> pb.RunTasksRequest:
        sizes.append(len(items))
        return make_request(items)

    monkeypatch.setattr(client_worker, "_run_request", counted)
    lines = [line_of(f"add-{i}", "demo.add", [i, 1]) for i in range(RUN_TASKS_BATCH + 6)]
    batch = tmp_path / "tasks.jsonl"
    batch.write_text("\n".join(lines) + "\n", encoding="utf-8")
    with trio.fail_after(FAIL_AFTER_S):
        async with running_worker() as worker:
            status = await run_cli("submit", "--worker", address(worker), "--file", str(batch))
    assert status == 0
    assert sizes == [RUN_TASKS_BATCH, 6]
    assert capsys.readouterr().err == f"blockx: {len(lines)} tasks: {len(lines)} succeeded\n"
