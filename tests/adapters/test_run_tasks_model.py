"""RunTasks against its rules, on random batches: a model test of the streams and held submits.

Each example runs a worker with 2 slots and 1 to 3 concurrent streams, each
writing a random list of requests (quick tasks, tasks that hang until their
deadline, a task id repeated on the stream or shared with another stream, a
request without a task) and reading to its end. Whatever the interleaving,
every request is answered once, in request order, never with NoSlot (a full
worker holds submits instead); every accepted task ends exactly once on every
stream that followed it, with the result its kind predicts; no task runs
twice; and the worker ends with nothing held or running.
"""

from __future__ import annotations

import functools
from collections import Counter

import trio
import trio.testing
from grpclib.const import Status
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from blockx._proto.blockx.worker import v1 as pb
from tests.adapters.test_run_tasks import events, finished, refusals, request, run, status
from tests.adapters.worker_harness import call_list_task, running_worker, virtual_clock_config

KINDS = ("quick", "hang", "missing", "again", "shared")


def task_of(task_id: str) -> pb.TaskSpec:
    """`q*` ends at once, `h*` hangs until its 2 s deadline."""
    if task_id.startswith("q"):
        return call_list_task(task_id, ("demo.add", [1, 2]))
    return call_list_task(task_id, ("demo.hang", []), task_timeout_ms=2_000)


@st.composite
def batches(draw: st.DrawFn) -> list[list[str | None]]:
    """Per stream, the task id of each request (None: a request without a task)."""
    shared = draw(st.sampled_from(["q-shared", "h-shared"]))
    streams: list[list[str | None]] = []
    for index in range(draw(st.integers(1, 3))):
        ids: list[str | None] = []
        for kind in draw(st.lists(st.sampled_from(KINDS), max_size=8)):
            n = len(ids)
            seen = [task_id for task_id in ids if task_id is not None]
            match kind:
                case "quick" | "hang":
                    ids.append(f"{kind[0]}{index}-{n}")
                case "missing":
                    ids.append(None)
                case "again":
                    ids.append(draw(st.sampled_from(seen)) if seen else f"q{index}-{n}")
                case "shared":
                    ids.append(shared)
        streams.append(ids)
    return streams


async def scenario(streams: list[list[str | None]]) -> None:
    config = virtual_clock_config(**{"worker.taskSlots": 2})
    async with running_worker(config) as worker:
        answers: list[list[pb.RunTasksResponse]] = [[] for _ in streams]
        async with trio.open_nursery() as nursery:
            for ids, into in zip(streams, answers, strict=True):
                requests = [request(None if i is None else task_of(i)) for i in ids]
                nursery.start_soon(functools.partial(run, worker, *requests, into=into))
        for ids, responses in zip(streams, answers, strict=True):
            check_stream(ids, responses)
        runs = Counter(worker.calls.started)
        assert all(count == 1 for count in runs.values()), runs
        now = await status(worker)
        assert (now.waiting_submits, now.running_tasks, now.free_slots) == (0, 0, 2)


def check_stream(ids: list[str | None], responses: list[pb.RunTasksResponse]) -> None:
    seen = events(responses)
    answers = [(kind, task_id) for kind, task_id in seen if kind != "finished"]
    assert [task_id for _, task_id in answers] == [i or "" for i in ids]
    for refused in refusals(responses):
        assert refused.task_id == ""  # only a request without a task is refused
        assert Status(refused.status) is Status.INVALID_ARGUMENT
    accepted = {task_id for kind, task_id in answers if kind == "accepted"}
    assert accepted == {i for i in ids if i is not None}
    ends = [task_id for kind, task_id in seen if kind == "finished"]
    assert sorted(ends) == sorted(accepted)  # once each, on every stream that followed it
    for task_id in accepted:
        assert seen.index(("accepted", task_id)) < seen.index(("finished", task_id))
    for task_id, update in finished(responses).items():
        assert update.result is not None
        if task_id.startswith("q"):
            assert update.state == pb.TaskState.SUCCEEDED
        else:
            assert update.result.failure_code == "TIMED_OUT"


@settings(max_examples=40, suppress_health_check=[HealthCheck.too_slow])
@given(batches())
def test_every_request_is_answered_once_and_every_accepted_task_ends_once(
    streams: list[list[str | None]],
) -> None:
    trio.run(scenario, streams, clock=trio.testing.MockClock(autojump_threshold=0))
