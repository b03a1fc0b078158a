"""`blockx hub submit --task-file F`: worker nodes' tasks, queued through a running hub.

    hub submit --queue Q --task-file TASK.json --hub URL --credential-file F [--wait]
    hub submit --queue Q --task-file TASKS.jsonl --hub URL --credential-file F [--wait]

A task file (`examples/tasks/*.json`, or one task a line in a `.jsonl` file)
is checked whole as a node will read it and as the hub will take it before
anything is sent: each bad line is named on stderr, and then nothing is
queued. Its tasks go to the producers' API (`HubClient.submit_tasks`, one
transaction a batch) for the nodes of `--profile`; a task's own task_id names
it at the hub, so the same file sent again queues nothing new. With `--wait`,
one task's result is printed as `blockx submit --watch` prints it, and many
tasks are followed as `blockx submit --file` follows a batch (a JSON line as
each ends, a progress bar, a summary), at most `MAX_WAITS` waits at once.

Unlike the other `hub submit`, this goes through a hub, under its rules and
with a producer's credential, so it needs no access to the hub's database.
The per-task flags (`submission_fields`) are the other mode's.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from typing import TYPE_CHECKING, Any, Final

import attrs
import trio

from blockx.hub._api import InvalidSubmission, submission_from_json
from blockx.hubwire import dumps
from blockx.settings import FlagError, refuse_flags

if TYPE_CHECKING:
    from blockx.autoworker import HubClient

MAX_WAITS: Final = 16
"""Tasks of a batch waited for at once (each wait is a request the hub holds)."""
PROFILES: Final = ("block", "bundle")
"""The worker nodes' profiles (`blockx serve --profile`) a task may be queued for."""
SUBMIT_FLAGS: Final = {"total_deadline_ms": "--deadline-ms", "idempotency": "--idempotent"}
"""The flag of each submission key whose flag is not the key spelled as a flag."""
NOT_WITH_TASK_FILE: Final = (
    "file",
    "handler",
    "handler_version",
    "payload_version",
    "payload",
    "config",
    "db",
)
"""`hub submit`'s flags that do not fit `--task-file`: the file gives the task, and the
hub, not its database, takes it."""
ONLY_WITH_TASK_FILE: Final = ("hub", "credential_file", "ca_file", "profile", "wait")
"""`hub submit`'s flags for a hub reached over HTTP, which the database's modes ignore."""


def flag_of(key: str) -> str:
    """The `hub submit` flag that gives submission key `key`."""
    return SUBMIT_FLAGS.get(key, "--" + key.replace("_", "-"))


def submission_fields(args: argparse.Namespace) -> dict[str, Any]:
    """The submission keys `hub submit`'s per-task flags give (idempotency always: the
    safe NON_IDEMPOTENT unless `--idempotent`)."""
    fields: dict[str, Any] = {"idempotency": "IDEMPOTENT" if args.idempotent else "NON_IDEMPOTENT"}
    for key, value in (
        ("max_attempts", args.max_attempts),
        ("total_deadline_ms", args.deadline_ms),
        ("attempt_timeout_ms", args.attempt_timeout_ms),
        ("task_id", args.task_id),
        ("priority", args.priority),
        ("run_at_ms", args.run_at_ms),
        ("delay_ms", args.delay_ms),
        ("concurrency_key", args.concurrency_key),
    ):
        if value is not None:
            fields[key] = value
    return fields


def refuse_task_file_flags(args: argparse.Namespace) -> None:
    """`FlagError` for a flag given without `--task-file` that only it takes."""
    refuse_flags(
        args, ONLY_WITH_TASK_FILE, "only with --task-file (a worker node's tasks, through a hub)"
    )


def submit_task_file(args: argparse.Namespace) -> int:
    """`hub submit --task-file`: check, queue, and with `--wait` follow to their ends."""
    # The worker's client (its task format, the batch's report) and the hub's client
    # are loaded by this mode only.
    from blockx.autoworker.command import hub_client, hub_errors  # noqa: PLC0415
    from blockx.client.console import BATCH_SUFFIXES  # noqa: PLC0415

    refuse_flags(
        args,
        NOT_WITH_TASK_FILE,
        "not with --task-file: the file gives the task, and the hub takes it",
    )
    many = args.task_file.endswith(BATCH_SUFFIXES)
    if many and args.task_id is not None:
        raise FlagError(
            field="--task-id",
            value=args.task_id,
            allowed="not with a batch: each line names its task",
        )
    numbered = _batch(args) if many else [(0, _one_task(args))]
    client = hub_client(args, keep_alive=True)
    plan = _Plan(args=args, numbered=numbered, many=many)
    with hub_errors(args):
        return trio.run(plan.run, client)


def _one_task(args: argparse.Namespace) -> dict[str, Any]:
    """The task of a JSON task file, checked as a node will read it and as the hub will
    take it."""
    from blockx.client import InvalidTaskSpec  # noqa: PLC0415
    from blockx.client.console import read_task_file  # noqa: PLC0415

    path = args.task_file
    document = read_task_file(path, "--task-file")
    try:
        _check(args, document)
    except InvalidTaskSpec as error:
        raise FlagError(field="--task-file", value=path, allowed=str(error)) from None
    assert isinstance(document, dict)
    if args.task_id is not None:  # the id the hub and the node know the task by
        document["task_id"] = args.task_id
    return document


def _profile(args: argparse.Namespace) -> str:
    return args.profile or PROFILES[0]


def _batch(args: argparse.Namespace) -> list[tuple[int, dict[str, Any]]]:
    """The tasks of a JSON-lines task file with their line numbers, every line checked as
    a node will read it and as the hub will take it: else each bad line is named."""
    from blockx.client.console import read_batch  # noqa: PLC0415

    lines = read_batch(args.task_file, "--task-file", also=lambda task: _check(args, task))
    return [(line.number, line.document) for line in lines]


def _check(args: argparse.Namespace, task: Any) -> None:
    """`InvalidTaskSpec` naming what is wrong with `task` (a task file's JSON value) as a
    node reads it or as the hub takes it (`submission_from_json`, the hub's own check);
    a per-task flag that is wrong is a `FlagError` naming it."""
    from blockx.autoworker import node_task_submission  # noqa: PLC0415
    from blockx.client import InvalidTaskSpec  # noqa: PLC0415

    fields = submission_fields(args)
    try:
        document = node_task_submission(task, deployment=_profile(args), **fields)
        submission_from_json(dumps(document), args.queue)
    except InvalidTaskSpec as error:
        if error.field == "task_id" and args.task_id is not None:
            raise FlagError(field="--task-id", value=args.task_id, allowed=error.allowed) from None
        raise
    except InvalidSubmission as error:
        if error.field in fields:
            raise FlagError(
                field=flag_of(error.field), value=error.value, allowed=error.allowed
            ) from None
        key = error.field.removeprefix("payload").lstrip(".") or "as a whole"
        raise InvalidTaskSpec(field=key, value=error.value, allowed=error.allowed) from None


@attrs.frozen(kw_only=True)
class _Plan:
    """A task file's checked tasks (each with its line number, 0 for a .json file's one),
    to queue and, with `--wait`, to follow to their ends."""

    args: argparse.Namespace
    numbered: list[tuple[int, dict[str, Any]]]
    many: bool

    async def run(self, client: HubClient) -> int:
        fields = submission_fields(self.args)
        fields.pop("task_id", None)  # each task carries its own
        try:
            answers = await client.submit_tasks(
                self.args.queue,
                [task for _, task in self.numbered],
                deployment=_profile(self.args),
                **fields,
            )
            if not self.many:
                return await self._one(client, answers[0])
            if not self.args.wait:
                return _queued(self.numbered, answers)
            return await self._follow(client, answers)
        finally:
            await client.aclose()

    async def _one(self, client: HubClient, answer: dict[str, Any]) -> int:
        """The one task queued: its id and status, or with `--wait` its result as `blockx
        submit --watch` prints one (and a line on stderr if it did not succeed)."""
        from blockx.client.console import failure_line  # noqa: PLC0415

        if "error" in answer:
            raise self._refused(answer)
        if not self.args.wait:
            print(json.dumps({"task_id": answer["task_id"], "status": answer["status"]}))
            return 0
        task = await client.wait_task(answer["task_id"])
        result = node_result(task)
        print(json.dumps(result, indent=2), flush=True)
        state = state_name(result)
        if state == "SUCCEEDED":
            return 0
        ended = "failed" if state == "FAILED" else f"ended {state}"
        code, message = result.get("failureCode", ""), result.get("message", "")
        print(failure_line(task["task_id"], code, message, ended=ended), file=sys.stderr)
        return 1

    def _refused(self, answer: dict[str, Any]) -> FlagError:
        """The one task refused by the hub, naming the flag or the file at fault."""
        field, error = answer.get("field") or "", answer["error"]
        fields = submission_fields(self.args)
        if field in fields:
            return FlagError(field=flag_of(field), value=fields[field], allowed=error)
        if field == "queue":
            return FlagError(field="--queue", value=self.args.queue, allowed=error)
        return FlagError(field="--task-file", value=self.args.task_file, allowed=error)

    async def _follow(self, client: HubClient, answers: list[dict[str, Any]]) -> int:
        """A JSON line per task as it ends (a refused one at once), a progress bar, then
        a summary (`follow_batch`); at most `MAX_WAITS` waits at once."""
        from blockx.client.console import follow_batch  # noqa: PLC0415

        send, receive = trio.open_memory_channel[dict[str, Any]](math.inf)
        limiter = trio.CapacityLimiter(MAX_WAITS)
        async with trio.open_nursery() as nursery:
            async with send:
                for (number, task), answer in zip(self.numbered, answers, strict=True):
                    if "error" in answer:
                        send.send_nowait(_refused_line(number, task, answer))
                    else:
                        task_id = answer["task_id"]
                        nursery.start_soon(_wait, client, limiter, number, task_id, send.clone())
            return await follow_batch(receive, len(answers), lambda line: line)


def _queued(numbered: list[tuple[int, dict[str, Any]]], answers: list[dict[str, Any]]) -> int:
    """A JSON line per task of a batch as the hub answered it; 1 if it refused any."""
    refused = 0
    for (number, task), answer in zip(numbered, answers, strict=True):
        shown = {"line": number, "task_id": answer.get("task_id", task.get("task_id"))}
        shown["status"] = answer["status"]
        if "error" in answer:
            refused += 1
            shown |= {"error": answer["error"], "field": answer.get("field")}
        print(json.dumps(shown))
    return 1 if refused else 0


def _refused_line(number: int, task: dict[str, Any], answer: dict[str, Any]) -> dict[str, Any]:
    """A task of a batch the hub refused, as a line of those that ended."""
    return {
        "line": number,
        "task_id": task.get("task_id"),
        "state": "REFUSED",
        "status": answer["status"],
        "message": answer["error"],
        "field": answer.get("field"),
    }


async def _wait(
    client: HubClient,
    limiter: trio.CapacityLimiter,
    number: int,
    task_id: str,
    send: trio.MemorySendChannel[dict[str, Any]],
) -> None:
    """Send the line of task `task_id` once it ended; UNKNOWN, saying why, if the wait for
    it failed (the task is still at the hub: `hub task show` tells how it went)."""
    from blockx.errors import BlockxError  # noqa: PLC0415

    async with send:
        async with limiter:
            try:
                line = ended_line(number, await client.wait_task(task_id))
            except (BlockxError, OSError, trio.BrokenResourceError) as error:
                line = {
                    "line": number,
                    "task_id": task_id,
                    "state": "UNKNOWN",
                    "message": f"the wait for it failed: {error}",
                }
        await send.send(line)


def ended_line(number: int, task: dict[str, Any]) -> dict[str, Any]:
    """What `hub submit --task-file --wait` prints of a task of a batch that ended: as
    `blockx submit` prints a task of a batch (its state, failure code and the outputs it
    kept), with its line."""
    result = node_result(task)
    line: dict[str, Any] = {
        "line": number,
        "task_id": task["task_id"],
        "state": state_name(result),
        "failure_code": result.get("failureCode", ""),
    }
    if isinstance(result.get("outputs"), list):
        line["outputs"] = result["outputs"]
    return line


def state_name(result: dict[str, Any]) -> str:
    """The state of a result `node_result` gave, named as `blockx submit` names a task's
    state in a batch's lines: SUCCEEDED, not the JSON form's TASK_STATE_SUCCEEDED."""
    return str(result.get("state", "")).removeprefix("TASK_STATE_")


def node_result(task: dict[str, Any]) -> dict[str, Any]:
    """How a worker node's task ended, in the form `blockx submit --watch` prints a result
    (`blockx.client.readable`): what the node reported (the result of a SUCCEEDED task,
    the failure details of a FAILED one), or, for an end the hub decided (NEEDS_REVIEW,
    CANCELLED, a deadline that passed), the same keys made from the hub's task."""
    state = task["state"]
    failure = task.get("failure") or {}
    reported = task.get("result") if state == "SUCCEEDED" else failure.get("details")
    if isinstance(reported, dict) and ("state" in reported or "taskId" in reported):
        shown = {"taskId": task["task_id"], **reported}
        shown["state"] = reported.get("state") or state
        if state != "SUCCEEDED" and not shown.get("failureCode"):
            shown["failureCode"] = failure.get("code", "")
        return shown
    made: dict[str, Any] = {"taskId": task["task_id"], "state": state}
    if failure.get("code"):
        made["failureCode"] = failure["code"]
    if reported is not None:
        made["result" if state == "SUCCEEDED" else "details"] = reported
    message = _HUB_ENDS.get(state)
    if message is not None:
        made["message"] = message.format(task_id=task["task_id"])
    return made


_HUB_ENDS: Final = {
    "NEEDS_REVIEW": "an attempt may have had its effect, so nothing runs it again until an "
    "operator retries or resolves it (blockx hub task show {task_id})",
    "CANCELLED": "an operator cancelled it before it ran",
}
"""What a task that ended so without a node's report is told as."""
