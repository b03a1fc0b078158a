"""`blockx hub submit --task-file`: worker nodes' tasks through a hub in this process,
reached over loopback TCP, and a stand-in node (an automatic worker with a node's
capability) that answers them as a node would.

The command runs in a thread of its own (it runs Trio itself); the hub and the node
run on this test's Trio loop, so everything is driven by events, never by time.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, Final

import attrs
import pytest
import trio

from blockx import cli
from blockx._proto.blockx.worker import v1 as pb
from blockx.autoworker import (
    HubClient,
    Worker,
    WorkerExecution,
    WorkerFailure,
    WorkerHandler,
    WorkerOptions,
)
from blockx.client import readable
from blockx.hub import Hub, Right, Store, create_credential, create_queue
from blockx.hub._producer_cli import node_result, state_name
from blockx.hubwire import node_task_capability
from tests.adapters.hub_harness import QUEUE, TEST_CONFIG

TASKS: Final = Path(__file__).resolve().parents[2] / "examples" / "tasks"
FAIL_AFTER_S: Final = 60
"""A bound on a test that hangs, never reached when all is well."""


@attrs.define(eq=False)
class TcpHub:
    """A hub on a loopback port with queue `QUEUE`, and what a command needs to reach it."""

    url: str
    token: str
    credential_file: Path
    ran: list[dict[str, Any]] = attrs.Factory(list)
    """The payloads the stand-in node ran, in order."""

    def reach(self, credential_file: Path | None = None) -> list[str]:
        credential = str(credential_file or self.credential_file)
        return ["--queue", QUEUE, "--hub", self.url, "--credential-file", credential]

    async def tasks(self) -> list[dict[str, Any]]:
        """The queue's tasks as the hub lists them."""
        listed = await HubClient(url=self.url, credential=self.token).request(
            "GET", f"/v1/queues/{QUEUE}/tasks"
        )
        tasks: list[dict[str, Any]] = listed["tasks"]
        return tasks

    async def node(self, execution: WorkerExecution) -> Any:
        """A worker node's answer: its result as `blockx.client.readable` shows one; a task
        whose id says "fail" fails as a failing call would."""
        task = execution.payload
        self.ran.append(task)
        result = node_answer(task.get("task_id", execution.task_id))
        if result["state"] != "TASK_STATE_SUCCEEDED":
            raise WorkerFailure("TASK_FAILED", result)
        return result


def node_answer(task_id: str) -> dict[str, Any]:
    """What a node reports of task `task_id`: it fails if its id says "fail"."""
    if "fail" in task_id:
        failed = pb.TaskResult(
            task_id=task_id,
            state=pb.TaskState.FAILED,
            phase=pb.TaskPhase.CALLS,
            failure_code="CALL_RAISED",
            message="RuntimeError: no luck\nTraceback (most recent call last): ...",
        )
        return readable(failed)
    return readable(
        pb.TaskResult(task_id=task_id, state=pb.TaskState.SUCCEEDED, outputs_json="[42]")
    )


@asynccontextmanager
async def tcp_hub(tmp_path: Path, *, node: bool = False) -> AsyncIterator[TcpHub]:
    """A hub on a SQLite file, a producer's credential in a file, and with `node` a
    stand-in block node taking its tasks; all stopped on exit."""
    store = Store(str(tmp_path / "hub.sqlite3"))
    try:
        hub = Hub(TEST_CONFIG, store)
        create_queue(store, QUEUE, hub.now_ms())
        rights = frozenset({Right.PRODUCER, Right.WORKER})
        token = create_credential(store, QUEUE, rights, hub.now_ms())
        credential_file = tmp_path / "producer.credential"
        credential_file.write_text(token + "\n")
        async with trio.open_nursery() as nursery:
            port = await nursery.start(hub.run, "127.0.0.1", 0)
            rig = TcpHub(
                url=f"http://127.0.0.1:{port}", token=token, credential_file=credential_file
            )
            if node:
                handler = WorkerHandler(capability=node_task_capability("block"), handle=rig.node)
                options = WorkerOptions(queue_id=QUEUE, handlers=[handler])
                nursery.start_soon(Worker(HubClient(url=rig.url, credential=token), options).run)
            yield rig
            nursery.cancel_scope.cancel()
    finally:
        store.close()


async def blockx(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, list[str]]:
    """`blockx hub submit ...` in a thread: its exit status, stdout and stderr's lines."""
    with trio.fail_after(FAIL_AFTER_S):
        code = await trio.to_thread.run_sync(
            cli.main, ["hub", "submit", *argv], abandon_on_cancel=True
        )
    out, err = capsys.readouterr()
    return code, out, err.splitlines()


def task_file(tmp_path: Path, name: str, *tasks: dict[str, Any]) -> str:
    path = tmp_path / name
    path.write_text("\n".join(json.dumps(task) for task in tasks) + "\n")
    return str(path)


async def test_a_task_file_is_queued_once_and_waited_for_its_result(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    orders = str(TASKS / "orders_to_sqlite.json")
    async with tcp_hub(tmp_path) as hub:
        first = await blockx(capsys, *hub.reach(), "--task-file", orders)
        again = await blockx(capsys, *hub.reach(), "--task-file", orders)
    async with tcp_hub(tmp_path, node=True) as hub:  # the same database, now with a node
        waited = await blockx(capsys, *hub.reach(), "--task-file", orders, "--wait")
        [task] = await hub.tasks()
    assert first == (0, '{"task_id": "orders-to-sqlite", "status": 201}\n', [])
    assert again == (0, '{"task_id": "orders-to-sqlite", "status": 200}\n', [])
    code, out, err = waited
    assert (code, err) == (0, [])
    assert out == json.dumps(node_answer("orders-to-sqlite"), indent=2) + "\n"
    assert json.loads(out)["state"] == "TASK_STATE_SUCCEEDED"  # as `blockx submit --watch`
    assert hub.ran == [json.loads((TASKS / "orders_to_sqlite.json").read_text())]
    assert (task["task_id"], task["handler"]) == ("orders-to-sqlite", "blockx.task.block")


async def test_a_task_that_fails_prints_its_result_and_one_line_why(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    failing = task_file(tmp_path, "fail.json", {"task_id": "t-fail", "builder": "static"})
    async with tcp_hub(tmp_path, node=True) as hub:
        code, out, err = await blockx(capsys, *hub.reach(), "--task-file", failing, "--wait")
    assert code == 1
    assert json.loads(out) == node_answer("t-fail")
    assert err == ["blockx: task t-fail failed: CALL_RAISED: RuntimeError: no luck"]


async def test_a_batch_is_queued_once_then_followed_to_each_end_with_a_summary(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    batch = str(TASKS / "batch.jsonl")
    async with tcp_hub(tmp_path) as hub:
        queued = await blockx(capsys, *hub.reach(), "--task-file", batch, "--idempotent")
        wrong = await blockx(capsys, *hub.reach(), "--task-file", batch)  # other content
    async with tcp_hub(tmp_path, node=True) as hub:
        waited = await blockx(capsys, *hub.reach(), "--task-file", batch, "--idempotent", "--wait")
        tasks = await hub.tasks()
    names = ["batch-sum", "batch-shout", "batch-static", "batch-nap", "batch-fail"]
    code, out, err = queued
    assert (code, err) == (0, [])
    assert [json.loads(line) for line in out.splitlines()] == [
        {"line": number, "task_id": name, "status": 201} for number, name in enumerate(names, 1)
    ]
    code, out, _ = wrong
    assert code == 1
    assert json.loads(out.splitlines()[0]) == {
        "line": 1,
        "task_id": "batch-sum",
        "status": 409,
        "error": "task 'batch-sum' exists with other content",
        "field": "task_id",
    }
    code, out, err = waited
    ended = sorted((json.loads(line) for line in out.splitlines()), key=lambda line: line["line"])
    assert code == 1
    succeeded = {"state": "SUCCEEDED", "failure_code": "", "outputs": [42]}
    assert ended == [
        *({"line": n, "task_id": name, **succeeded} for n, name in enumerate(names[:4], 1)),
        {"line": 5, "task_id": "batch-fail", "state": "FAILED", "failure_code": "CALL_RAISED"},
    ]
    assert err == ["blockx: 5 tasks: 1 failed, 4 succeeded"]
    assert sorted(task["task_id"] for task in tasks) == sorted(names)  # no duplicate


async def test_a_batch_whose_tasks_all_succeed_exits_0(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    tasks = [{"builder": "static"}, {"task_id": "named", "builder": "static"}]
    batch = task_file(tmp_path, "tasks.jsonl", *tasks)
    async with tcp_hub(tmp_path, node=True) as hub:
        code, out, err = await blockx(capsys, *hub.reach(), "--task-file", batch, "--wait")
    lines = sorted((json.loads(line) for line in out.splitlines()), key=lambda line: line["line"])
    assert (code, err) == (0, ["blockx: 2 tasks: 2 succeeded"])
    assert [(line["line"], line["state"]) for line in lines] == [(1, "SUCCEEDED"), (2, "SUCCEEDED")]
    assert lines[1]["task_id"] == "named"
    ran = sorted(hub.ran, key=lambda task: "task_id" in task)
    assert ran == tasks  # as written: the hub named the first, its payload says no id


async def test_a_bad_line_is_named_and_nothing_is_queued(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    batch = tmp_path / "tasks.jsonl"
    batch.write_text(
        '{"task_id": "a", "builder": "static"}\n'
        "\n"
        "{not json\n"
        '{"task_id": "b", "builder": "static", "config": {"n": 18446744073709551616}}\n'
        f'{{"task_id": "{"c" * 300}", "builder": "static"}}\n'
        '{"task_id": "d"}\n'
    )
    async with tcp_hub(tmp_path) as hub:
        code, out, err = await blockx(capsys, *hub.reach(), "--task-file", str(batch))
        tasks = await hub.tasks()
    assert (code, out, tasks) == (1, "", [])
    assert [line.split(": ", 2)[1] for line in err[:-1]] == [
        f"{batch} line {number}" for number in (3, 4, 5, 6)
    ]
    assert "is not valid JSON" in err[0]
    assert err[1].endswith(
        "task config.n = '18446744073709551616': an integer from -9223372036854775808 to "
        "9223372036854775807 (64 bits)"
    )
    assert "a string of at most" in err[2]
    assert err[3].endswith("task builder = None: is required")
    assert err[-1] == (
        f"blockx: error: --task-file {str(batch)!r}: has 4 bad lines (3, 4, 5, 6); nothing was sent"
    )


async def test_a_bundle_task_is_not_taken_by_a_block_node(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    shout = str(TASKS / "shout.json")
    block = task_file(tmp_path, "block.json", {"task_id": "for-block", "builder": "static"})
    async with tcp_hub(tmp_path, node=True) as hub:
        bundle = await blockx(
            capsys, *hub.reach(), "--task-file", shout, "--profile", "bundle", "--task-id", "b-1"
        )
        waited = await blockx(capsys, *hub.reach(), "--task-file", block, "--wait")
        tasks = {task["task_id"]: task for task in await hub.tasks()}
    assert bundle == (0, '{"task_id": "b-1", "status": 201}\n', [])
    assert waited[0] == 0
    assert [task["task_id"] for task in hub.ran] == ["for-block"]  # submitted later, yet run
    assert (tasks["b-1"]["state"], tasks["b-1"]["handler"]) == ("QUEUED", "blockx.task.bundle")
    assert tasks["b-1"]["started_attempts"] == 0
    assert tasks["b-1"]["payload"]["task_id"] == "b-1"  # the node runs it under the hub's id


async def test_a_credential_the_hub_refuses_is_one_line_naming_the_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    unknown = tmp_path / "unknown.credential"
    unknown.write_text("bxc_nobody.nothing\n")
    shout = str(TASKS / "shout.json")
    async with tcp_hub(tmp_path) as hub:
        refused = await blockx(capsys, *hub.reach(unknown), "--task-file", shout)
        elsewhere = await blockx(
            capsys, *hub.reach(), "--task-file", shout, "--queue", "other-queue"
        )
        assert await hub.tasks() == []
    assert refused == (
        1,
        "",
        [
            f"blockx: error: --credential-file {str(unknown)!r}: the hub refused it "
            "(401: no valid credential (Authorization: Bearer <token>))"
        ],
    )
    assert elsewhere[2] == [
        f"blockx: error: --credential-file {str(hub.credential_file)!r}: the hub refused it "
        "(403: this credential may not use queue 'other-queue')"
    ]


@pytest.mark.parametrize(
    ("argv", "error"),
    [
        (["--payload", "1"], "--payload '1': not with --task-file: the file gives the task"),
        (["--db", "x.sqlite3"], "--db 'x.sqlite3': not with --task-file"),
        (["--max-attempts", "0"], "--max-attempts 0: an integer from 1 to 100"),
        (["--priority", "10"], "--priority 10: an integer from 0 to 9"),
        (["--task-id", ""], "--task-id '': must be a non-empty string"),
        (["--task-file", "/no/such.json"], "--task-file '/no/such.json': cannot be read"),
        (["--hub", "ftp://h"], "--hub 'ftp://h': the hub's address"),
        ([], "--hub 'http://127.0.0.1:9': cannot reach the hub: "),
    ],
)
async def test_flags_that_do_not_fit_and_an_unreachable_hub_are_one_line(
    tmp_path: Path, argv: list[str], error: str, capsys: pytest.CaptureFixture[str]
) -> None:
    credential = tmp_path / "producer.credential"
    credential.write_text("bxc_a.b\n")
    reach = ["--queue", QUEUE, "--hub", "http://127.0.0.1:9", "--credential-file", str(credential)]
    shout = ["--task-file", str(TASKS / "shout.json")]
    code, out, err = await blockx(capsys, *reach, *shout, *argv)  # later flags win
    assert (code, out, len(err)) == (1, "", 1)
    assert err[0].startswith(f"blockx: error: {error}"), err


@pytest.mark.parametrize(
    ("argv", "error"),
    [
        (["--hub", "http://h:1"], "--hub 'http://h:1': only with --task-file"),
        (["--wait"], "--wait True: only with --task-file"),
        (["--profile", "bundle"], "--profile 'bundle': only with --task-file"),
    ],
)
async def test_the_flags_of_a_hub_are_refused_without_a_task_file(
    argv: list[str], error: str, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["--queue", QUEUE, "--handler", "h", "--handler-version", "1", "--payload-version", "1",
            "--payload", "1", "--db", "/no/such/dir/hub.sqlite3", *argv]  # fmt: skip
    code, out, err = await blockx(capsys, *argv)
    assert (code, out, len(err)) == (1, "", 1)
    assert err[0] == f"blockx: error: {error} (a worker node's tasks, through a hub)"


def test_a_results_state_is_named_as_a_batchs_lines_name_it() -> None:
    assert state_name(node_answer("t-fail")) == "FAILED"  # TASK_STATE_FAILED, as printed
    assert state_name({"taskId": "t1", "state": "SUCCEEDED"}) == "SUCCEEDED"
    assert state_name({"taskId": "t1"}) == ""


def test_an_end_the_hub_decided_is_told_in_a_results_words() -> None:
    review = {"task_id": "t1", "state": "NEEDS_REVIEW", "failure": {"code": "LEASE_EXPIRED"}}
    assert node_result(review) == {
        "taskId": "t1",
        "state": "NEEDS_REVIEW",
        "failureCode": "LEASE_EXPIRED",
        "message": "an attempt may have had its effect, so nothing runs it again until an "
        "operator retries or resolves it (blockx hub task show t1)",
    }
    late = {
        "task_id": "t2",
        "state": "FAILED",
        "failure": {"code": "DEADLINE_EXCEEDED", "details": {"deadline_at_ms": 5}},
    }
    assert node_result(late) == {
        "taskId": "t2",
        "state": "FAILED",
        "failureCode": "DEADLINE_EXCEEDED",
        "details": {"deadline_at_ms": 5},
    }
    resolved = {"task_id": "t3", "state": "SUCCEEDED", "result": {"charged": True}, "failure": None}
    assert node_result(resolved) == {
        "taskId": "t3",
        "state": "SUCCEEDED",
        "result": {"charged": True},
    }
