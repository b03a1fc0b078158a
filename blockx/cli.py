"""The `blockx` command line.

Owns parsing arguments, running a subcommand and turning its outcome into an
exit status: 0 success, 1 a blockx error (one line on stderr), 2 a usage error
(argparse). Must never hold logic a subcommand's module should own.

Subcommands:

* `serve` runs a worker (`blockx.app.run`) with the profile and the flags as
  configuration overrides; `--print-config` prints the effective configuration.
* `submit`, `watch`, `result` and `status` talk to a running worker through
  `blockx.client`, each in its own `trio.run` with trio-asyncio's loop, with
  the bearer token (`blockx.net.auth`) and the TLS settings (`blockx.net.tls`) that
  the environment gives.
  `submit --etcd` places the task through the etcd registry instead
  (`PlacementClient`), and `workers --etcd` lists the registered fleet.
  `submit --file TASKS.jsonl` runs a batch on one `RunTasks` stream (spread
  over the fleet with `--etcd`), checked whole before anything is sent.
* `autoworker --hub URL --queue Q --credential-file F module:function ...` runs
  those functions as an automatic worker's handlers (`blockx.autoworker.command`).
* `functions publish DIR --redis URL [--prefix P]` publishes the `.py` files
  under DIR as the current function-code epoch and prints it.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import functools
import json
import re
import sys
import textwrap
import uuid
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from typing import Any, Final, TextIO, TypeAlias

import trio
import trio_asyncio

from blockx._proto.blockx.worker import v1 as pb
from blockx.autoworker.command import add_command as add_autoworker_command
from blockx.client import (
    DEFAULT_REGISTRY_PREFIX,
    ClientSettings,
    InvalidOutputs,
    InvalidTaskSpec,
    NoWorkerAvailable,
    PlacementClient,
    TaskOutcome,
    WatchEndedEarly,
    WorkerClient,
    readable,
    task_outputs,
    task_spec,
    task_spec_from_json,
)
from blockx.client.console import (
    BATCH_SUFFIXES,
    failure_line,
    follow_batch,
    read_batch,
    read_task_file,
)
from blockx.config import CONFIG_FILE_ENV, WorkerConfig, default_config, load_config
from blockx.discovery import WorkerHeartbeat
from blockx.errors import BlockxError, StartupError
from blockx.functions import DEFAULT_REDIS_PREFIX, publish_directory
from blockx.hub import add_commands as add_hub_commands
from blockx.net.tls import ClientTls
from blockx.phases import spelled
from blockx.phases.builders import builder_registry
from blockx.phases.plugins import plugin_registry
from blockx.process.lifecycle import lone_errors
from blockx.profiles import BLOCK, PROFILES
from blockx.settings import FlagError, flag_overrides, help_text

DEFAULT_WORKER = "127.0.0.1:8081"
PROGRESS_REDRAW_S = 0.5
"""How often the progress line on a terminal redraws its elapsed time."""
EXIT_INTERRUPTED = 130

_BYTES_PER_MB = 1024 * 1024


# ------------------------------------------------------------------ parsing


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="blockx", description="The blockx command line.")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _add_serve(commands)
    _add_submit(commands)
    _add_watch(commands)
    _add_result(commands)
    _add_status(commands)
    _add_workers(commands)
    _add_functions(commands)
    add_hub_commands(commands)
    add_autoworker_command(commands)
    return parser


_Commands: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"


SERVE_FLAGS: Final = {
    "listenAddr": "--listen",
    "worker.taskSlots": "--slots",
    "executorCount": "--executors",
    "functionCode.dir": "--functions",
    "hubUrl": "--hub",
    "hubQueue": "--hub-queue",
    "hubCredentialFile": "--hub-credential-file",
}
"""The setting each `serve` flag sets (its JSON path): the flag is named in its errors."""


def _add_serve(commands: _Commands) -> None:
    defaults = default_config()
    serve = commands.add_parser(
        "serve",
        help="run a worker",
        description=textwrap.fill(
            "Run a worker until SIGINT or SIGTERM (the first drains it, a second exits at "
            "once). Flags override the configuration file (--config, else the one "
            f"{CONFIG_FILE_ENV} names) and the environment; --print-config shows the effective "
            "configuration. Function code comes from --functions, or from Redis when "
            "FUNCTIONS_REDIS_URL is set (see `functions publish`).",
            width=78,
        ),
        epilog=help_text(WorkerConfig, CONFIG_FILE_ENV),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    serve.add_argument(
        "--config",
        metavar="FILE",
        help=f"a JSON file of settings (default: the one {CONFIG_FILE_ENV} names, if any)",
    )
    serve.add_argument(
        "--profile", choices=("block", "bundle"), default="block", help="default: block"
    )
    serve.add_argument(
        "--listen",
        metavar="ADDR",
        help=f"listenAddr, env WORKER_LISTEN (default {defaults.listen_addr})",
    )
    serve.add_argument(
        "--slots",
        type=int,
        metavar="N",
        help=f"worker.taskSlots, env TASK_SLOTS (default {defaults.worker.task_slots})",
    )
    serve.add_argument(
        "--executors",
        type=int,
        metavar="N",
        help=f"executorCount, env EXECUTOR_COUNT (default {defaults.executor.count})",
    )
    serve.add_argument(
        "--functions",
        metavar="DIR",
        help=f"functionCode.dir, env FUNCTIONS_DIR (default {defaults.function_code.dir}, "
        "from the current directory)",
    )
    _add_hub_flags(serve)
    serve.add_argument(
        "--print-config",
        action="store_true",
        help="print the effective configuration as JSON instead of serving",
    )
    serve.set_defaults(run=_serve)


def _add_hub_flags(serve: argparse.ArgumentParser) -> None:
    serve.add_argument(
        "--hub",
        metavar="URL",
        help="hubUrl, env WORKER_HUB_URL: also run the tasks of a hub's queue (default: none)",
    )
    serve.add_argument("--hub-queue", metavar="QUEUE", help="hubQueue, env WORKER_HUB_QUEUE")
    serve.add_argument(
        "--hub-credential-file",
        metavar="FILE",
        help="hubCredentialFile, env WORKER_HUB_CREDENTIAL_FILE: the node's worker credential",
    )


def _add_worker_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--worker",
        default=DEFAULT_WORKER,
        metavar="HOST:PORT",
        help=f"the worker's address (default {DEFAULT_WORKER})",
    )


_SUBMIT_PARAGRAPHS = (
    "Submit a task, described by a JSON task file or by flags. Prints the submit "
    "response as JSON, or with --watch follows the task and prints its result.",
    "A --file ending in .jsonl (or .ndjson) is a batch: one task object per line, "
    "as in a task file (blank lines skipped; a line without task_id gets a new id), "
    "run on one RunTasks stream (with --etcd, spread over the fleet) and each followed "
    "to its end. The whole file is checked first: if any line is bad, each bad line "
    "is named on stderr and nothing is sent. Prints one JSON line per task on stdout "
    "as it ends (task_id, state, failure_code and the kept outputs; a task that did "
    "not run has state REFUSED, or UNKNOWN when its worker was lost, with status and "
    "message), a progress bar (on a terminal) and a summary on stderr; exits 1 if "
    "any task failed or did not run.",
)
# Wrapped here: the epilog's layout is kept as written, so the formatter wraps nothing.
_SUBMIT_DESCRIPTION = "\n\n".join(textwrap.fill(text, width=78) for text in _SUBMIT_PARAGRAPHS)


def _add_submit(commands: _Commands) -> None:
    submit = commands.add_parser(
        "submit",
        help="submit a task to a worker",
        description=_SUBMIT_DESCRIPTION,
        epilog=_phases_help(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _add_worker_flag(submit)
    submit.add_argument("--task-id", metavar="ID", help="default: the file's, else a new id")
    source = submit.add_mutually_exclusive_group(required=True)
    source.add_argument(
        "--file",
        metavar="TASK.json",
        help="a JSON task file, or a batch of tasks, one per line, in a .jsonl file",
    )
    source.add_argument("--builder", metavar="TYPE", help="the builder type, e.g. call_list")
    submit.add_argument("--config", metavar="JSON", help="the builder's config (a JSON object)")
    payload = submit.add_mutually_exclusive_group()
    payload.add_argument("--payload", metavar="TEXT", help="the payload, as UTF-8 text")
    payload.add_argument("--payload-file", metavar="PATH", help="the payload, from a file")
    submit.add_argument(
        "--plugin",
        "--writer",
        metavar="TYPE",
        help="the plugin that stores the outputs, e.g. jsonl, or result to keep them in the "
        "task's result, printed as its outputs (default: none)",
    )
    submit.add_argument(
        "--plugin-config",
        "--writer-config",
        metavar="JSON",
        help="the plugin's config (a JSON object)",
    )
    submit.add_argument(
        "--timeout-ms", type=int, metavar="N", help="task deadline (default: the worker's)"
    )
    submit.add_argument(
        "--best-effort", action="store_true", help="run every call even when some fail"
    )
    submit.add_argument(
        "--max-attempts",
        type=int,
        metavar="N",
        help="retry policy: N attempts per call, no back-off (default: the worker's)",
    )
    submit.add_argument(
        "--label",
        action="extend",
        nargs="+",
        default=[],
        metavar="K=V",
        help="a label of the task (repeatable)",
    )
    submit.add_argument(
        "--slot-id", default="", metavar="ID", help="a reserved slot (default: reserve inline)"
    )
    submit.add_argument("--watch", action="store_true", help="follow the task and print its result")
    _add_etcd_flags(submit, required=False)
    submit.set_defaults(run=_submit, parser=submit)


def _phases_help() -> str:
    """The builders and plugins of the block profile, with what each one takes."""
    sections = (
        (
            "builders (--builder TYPE, with --config JSON and --payload)",
            builder_registry(BLOCK.builders),
        ),
        ("plugins (--plugin TYPE, with --plugin-config JSON)", plugin_registry(BLOCK.plugins)),
    )
    lines: list[str] = []
    for title, registry in sections:
        lines.append(f"{title}:")
        for name in registry.names():
            implementation = registry.get(name)
            assert implementation is not None
            lines.append(f"  {spelled(name)}")
            lines.extend(
                textwrap.wrap(
                    implementation.usage,
                    width=76,
                    initial_indent="      ",
                    subsequent_indent="      ",
                )
            )
    return "\n".join(lines)


def _add_watch(commands: _Commands) -> None:
    watch = commands.add_parser(
        "watch",
        help="follow tasks until they end",
        description="Print each update as one JSON line until every task has ended.",
    )
    watch.add_argument("task_ids", nargs="+", metavar="TASK_ID")
    _add_worker_flag(watch)
    watch.set_defaults(run=_watch)


def _add_result(commands: _Commands) -> None:
    result = commands.add_parser(
        "result", help="print a task's state and result", description="Print GetTaskResult."
    )
    result.add_argument("task_id", metavar="TASK_ID")
    _add_worker_flag(result)
    result.set_defaults(run=_result)


def _add_status(commands: _Commands) -> None:
    status = commands.add_parser(
        "status",
        help="show a worker's slots and executors",
        description="Show a worker's summary, the slots in use and its executors.",
    )
    _add_worker_flag(status)
    status.add_argument("--json", action="store_true", help="print the raw response as JSON")
    status.set_defaults(run=_status)


def _add_functions(commands: _Commands) -> None:
    functions = commands.add_parser("functions", help="manage function code")
    actions = functions.add_subparsers(dest="action", required=True, metavar="ACTION")
    publish = actions.add_parser(
        "publish",
        help="publish a directory of .py files to Redis as the current epoch",
        description=(
            "Publish every .py file under DIR to Redis as one snapshot, then make it the "
            "current epoch. Prints the epoch. Unchanged content publishes the same epoch."
        ),
    )
    publish.add_argument("directory", metavar="DIR", help="directory of function modules")
    publish.add_argument("--redis", required=True, metavar="URL", help="redis://host:port/db")
    publish.add_argument(
        "--prefix",
        default=DEFAULT_REDIS_PREFIX,
        metavar="P",
        help=f"Redis key prefix (default {DEFAULT_REDIS_PREFIX!r})",
    )
    publish.set_defaults(run=_publish)


# ------------------------------------------------------------------ serve


def _serve(args: argparse.Namespace) -> int:
    # Imported here: the worker's own modules are only needed by the worker.
    from blockx import app  # noqa: PLC0415

    profile = PROFILES[args.profile]
    overrides = flag_overrides(args, SERVE_FLAGS)
    if args.print_config:
        config = load_config(
            profile=profile.defaults, overrides=overrides, flags=SERVE_FLAGS, file=args.config
        )
        print(json.dumps(config.to_json_dict(), indent=2))
        return 0
    # Logging is set up by `app.run`: its format is configuration (logFormat).
    return app.run(profile, overrides=overrides, flags=SERVE_FLAGS, file=args.config)


# ------------------------------------------------------------------ functions


def _publish(args: argparse.Namespace) -> int:
    print(publish_directory(args.directory, args.redis, args.prefix))
    return 0


# ------------------------------------------------------------------ client commands


def _worker_credentials() -> tuple[str | None, ClientTls | None]:
    """The bearer token WORKER_AUTH_TOKEN or WORKER_AUTH_TOKEN_FILE gives, as the worker
    reads them, and the TLS settings of the client's WORKER_TLS_* variables
    (`blockx.client.ClientSettings`); None for each that is not set."""
    client = ClientSettings.load()
    return client.token(), client.tls()


def _run_client(address: str, action: Callable[[WorkerClient], Awaitable[int]]) -> int:
    """`action` with a client of `address`, in its own `trio.run` on trio-asyncio's loop,
    with the token and TLS settings of `_worker_credentials`."""
    token, tls = _worker_credentials()

    async def in_loop() -> int:
        async with (
            trio_asyncio.open_loop(),
            WorkerClient.connect(address, token=token, tls=tls) as client,
        ):
            return await action(client)

    with lone_errors():
        return trio.run(in_loop)


_CONFIG_FLAGS: Final = {pb.TaskPhase.BUILDER: "--config", pb.TaskPhase.PLUGIN: "--plugin-config"}
"""The flag that gave the config a failing phase read, for a task made from flags."""


def _submit(args: argparse.Namespace) -> int:
    if args.file is not None and args.file.endswith(BATCH_SUFFIXES):
        return _submit_batch(args)
    task = _task_from_args(args)
    flags = {} if args.file is not None else _CONFIG_FLAGS
    if args.etcd is not None:
        if args.slot_id:
            args.parser.error("--slot-id: not allowed with --etcd (placement reserves the slot)")
        return _run_placement(args, functools.partial(_place, task, args.watch, flags))
    if args.watch:
        action = functools.partial(_submit_and_follow, task, args.slot_id, flags)
    else:
        action = functools.partial(_submit_only, task, args.slot_id)
    return _run_client(args.worker, action)


def _submit_batch(args: argparse.Namespace) -> int:
    _refuse_builder_flags(args)
    for flag, given in (("--task-id", args.task_id), ("--slot-id", args.slot_id)):
        if given:
            args.parser.error(f"{flag}: not allowed with a batch (each line names its task)")
    tasks = _tasks_from_batch(args.file)
    if args.etcd is not None:
        return _run_placement(
            args, lambda placement: _follow_batch(placement.run_tasks(tasks), len(tasks))
        )
    return _run_client(
        args.worker, lambda client: _follow_batch(client.run_tasks(tasks), len(tasks))
    )


def _tasks_from_batch(path: str) -> list[pb.TaskSpec]:
    """Every task of the batch at `path`, or an error naming each bad line (on stderr)."""
    return [line.spec for line in read_batch(path, "--file")]


async def _follow_batch(
    run: AbstractAsyncContextManager[trio.MemoryReceiveChannel[TaskOutcome]], total: int
) -> int:
    """One JSON line per task as it ends, a progress bar while they run, then a summary."""
    return await follow_batch(run, total, outcome_line)


def outcome_line(outcome: TaskOutcome) -> dict[str, Any]:
    """What `submit` of a batch prints of a task that ended."""
    result = outcome.result
    if result is None:
        refusal = outcome.refusal
        if refusal is not None:
            return {
                "task_id": outcome.task_id,
                "state": "REFUSED",
                "status": refusal.status.name,
                "message": refusal.message,
            }
        state = "REFUSED" if isinstance(outcome.error, NoWorkerAvailable) else "UNKNOWN"
        return {"task_id": outcome.task_id, "state": state, "message": str(outcome.error)}
    line: dict[str, Any] = {
        "task_id": outcome.task_id,
        "state": result.state.name,
        "failure_code": result.failure_code,
    }
    with contextlib.suppress(InvalidOutputs):
        outputs = task_outputs(result)
        if outputs is not None:
            line["outputs"] = outputs
    return line


async def _submit_only(task: pb.TaskSpec, slot_id: str, client: WorkerClient) -> int:
    response = await client.submit(task, slot_id)
    _print_json(response)
    return 0


async def _submit_and_follow(
    task: pb.TaskSpec, slot_id: str, flags: Mapping[pb.TaskPhase, str], client: WorkerClient
) -> int:
    progress = Progress(sys.stderr, task.task_id, clock=trio.current_time)
    with progress:
        async with trio.open_nursery() as nursery:
            if progress.live:
                nursery.start_soon(_redraw_every, progress, PROGRESS_REDRAW_S)
            result = await client.run_task(task, slot_id=slot_id, on_update=progress.update)
            nursery.cancel_scope.cancel()
    _print_json(result)
    if result.state == pb.TaskState.SUCCEEDED:
        return 0
    _report_failure(task.task_id, result, flags)
    return 1


async def _redraw_every(progress: Progress, interval_s: float) -> None:
    while True:
        await trio.sleep(interval_s)
        progress.redraw()


def _watch(args: argparse.Namespace) -> int:
    task_ids = list(dict.fromkeys(args.task_ids))
    return _run_client(args.worker, functools.partial(_follow, task_ids))


async def _follow(task_ids: list[str], client: WorkerClient) -> int:
    pending = set(task_ids)
    failed: list[tuple[str, pb.TaskResult | None]] = []
    async with contextlib.aclosing(client.watch(task_ids)) as updates:
        async for update in updates:
            print(json.dumps(readable(update)), flush=True)
            if not update.is_terminal or update.task_id not in pending:
                continue
            pending.discard(update.task_id)
            state = update.result.state if update.result is not None else update.state
            if state != pb.TaskState.SUCCEEDED:
                failed.append((update.task_id, update.result))
            if not pending:
                break
    if pending:
        raise WatchEndedEarly(task_ids=tuple(task_id for task_id in task_ids if task_id in pending))
    for task_id, result in failed:
        _report_failure(task_id, result)
    return 1 if failed else 0


def _result(args: argparse.Namespace) -> int:
    return _run_client(args.worker, functools.partial(_print_result, args.task_id))


async def _print_result(task_id: str, client: WorkerClient) -> int:
    _print_json(await client.result(task_id))
    return 0


def _status(args: argparse.Namespace) -> int:
    return _run_client(args.worker, functools.partial(_print_status, args.json))


async def _print_status(as_json: bool, client: WorkerClient) -> int:
    status = await client.status()
    if as_json:
        _print_json(status)
    else:
        print("\n".join(status_lines(status)))
    return 0


# ------------------------------------------------------------------ the fleet (etcd)


def _add_etcd_flags(parser: argparse.ArgumentParser, *, required: bool) -> None:
    parser.add_argument(
        "--etcd",
        required=required,
        metavar="HOST:PORT[,...]",
        help="place through the workers registered in this etcd (instead of --worker)"
        if not required
        else "the etcd the workers register in",
    )
    parser.add_argument(
        "--prefix",
        default=DEFAULT_REGISTRY_PREFIX,
        metavar="P",
        help=f"the workers' registry prefix (default {DEFAULT_REGISTRY_PREFIX!r})",
    )


def _add_workers(commands: _Commands) -> None:
    workers = commands.add_parser(
        "workers",
        help="list the workers registered in etcd",
        description="List the workers registered under the prefix, with their last heartbeat.",
    )
    _add_etcd_flags(workers, required=True)
    workers.add_argument("--json", action="store_true", help="print the heartbeats as JSON")
    workers.set_defaults(run=_workers)


def _run_placement(
    args: argparse.Namespace, action: Callable[[PlacementClient], Awaitable[int]]
) -> int:
    """`action` with a placement client of the fleet, in its own `trio.run`; workers are
    called with the token and TLS settings of `_worker_credentials`."""
    token, tls = _worker_credentials()

    async def in_loop() -> int:
        async with (
            trio_asyncio.open_loop(),
            PlacementClient.connect(args.etcd, args.prefix, token=token, tls=tls) as placement,
        ):
            return await action(placement)

    with lone_errors():
        return trio.run(in_loop)


async def _place(
    task: pb.TaskSpec, follow: bool, flags: Mapping[pb.TaskPhase, str], placement: PlacementClient
) -> int:
    placed = await placement.place(task)
    print(
        f"blockx: task {task.task_id} placed on {placed.worker_addr} (slot {placed.slot_id})",
        file=sys.stderr,
        flush=True,
    )
    if follow:
        return await _submit_and_follow(task, placed.slot_id, flags, placed.client)
    _print_json(placed.response)
    return 0


def _workers(args: argparse.Namespace) -> int:
    return _run_placement(args, functools.partial(_print_workers, args.json, args.prefix))


async def _print_workers(as_json: bool, prefix: str, placement: PlacementClient) -> int:
    workers = placement.workers()
    if as_json:
        print(json.dumps([json.loads(worker.to_json()) for worker in workers], indent=2))
    elif workers:
        print("\n".join(fleet_lines(workers)))
    else:
        print(f"no workers registered under {prefix}")
    return 0


def fleet_lines(workers: Sequence[WorkerHeartbeat]) -> list[str]:
    """The readable table of registered workers."""
    return list(
        _table(
            (
                "ADDRESS",
                "DEPLOYMENT",
                "FREE/TOTAL",
                "RESERVED",
                "RUNNING",
                "EXECUTORS",
                "DRAINING",
                "VERSION",
                "STARTED",
            ),
            [
                (
                    worker.address,
                    worker.deployment,
                    f"{worker.free_slots}/{worker.slots_total}",
                    str(worker.reserved_slots),
                    str(worker.running_tasks),
                    str(worker.executors_healthy),
                    _yes_no(worker.draining),
                    worker.version,
                    _timestamp(worker.started_at_ms),
                )
                for worker in workers
            ],
        )
    )


# ------------------------------------------------------------------ task from flags


def _task_from_args(args: argparse.Namespace) -> pb.TaskSpec:
    if args.file is not None:
        _refuse_builder_flags(args)
        return _task_from_file(args.file, args.task_id)
    retry = None
    if args.max_attempts is not None:
        retry = pb.CallRetryPolicy(max_attempts=args.max_attempts)
    try:
        return task_spec(
            args.task_id or uuid.uuid4().hex,
            builder=args.builder,
            config=_json_object_flag("--config", args.config),
            payload=_payload(args),
            plugin=args.plugin,
            plugin_config=_json_object_flag("--plugin-config", args.plugin_config),
            timeout_ms=args.timeout_ms or 0,
            best_effort=args.best_effort,
            retry=retry,
            labels=_labels(args.label),
        )
    except InvalidTaskSpec as error:
        flag = _FLAG_OF_KEY.get(error.field.partition(".")[0], error.field)
        raise FlagError(field=flag, value=error.value, allowed=error.allowed) from error


_FLAG_OF_KEY = {
    "task_id": "--task-id",
    "builder": "--builder",
    "config": "--config",
    "plugin": "--plugin",
    "plugin_config": "--plugin-config",
    "timeout_ms": "--timeout-ms",
    "retry": "--max-attempts",
    "labels": "--label",
}
_BUILDER_FLAGS = {
    "config": "--config",
    "payload": "--payload",
    "payload_file": "--payload-file",
    "plugin": "--plugin",
    "plugin_config": "--plugin-config",
    "timeout_ms": "--timeout-ms",
    "best_effort": "--best-effort",
    "max_attempts": "--max-attempts",
    "label": "--label",
}


def _refuse_builder_flags(args: argparse.Namespace) -> None:
    # Unset flags are None, or False and [] for --best-effort and --label; 0 is a value.
    given = [
        flag
        for name, flag in _BUILDER_FLAGS.items()
        if not any(getattr(args, name) is unset for unset in (None, False))
        and getattr(args, name) != []
    ]
    if given:
        parser: argparse.ArgumentParser = args.parser
        parser.error(f"{', '.join(given)}: not allowed with --file (the task file says it)")


def _task_from_file(path: str, task_id: str | None) -> pb.TaskSpec:
    document = read_task_file(path, "--file")
    if task_id is None and not (isinstance(document, dict) and "task_id" in document):
        task_id = uuid.uuid4().hex
    try:
        return task_spec_from_json(document, task_id=task_id)
    except InvalidTaskSpec as error:
        raise FlagError(field="--file", value=path, allowed=str(error)) from error


def _json_object_flag(flag: str, text: str | None) -> dict[str, Any] | None:
    if text is None:
        return None
    try:
        value = json.loads(text)
    except json.JSONDecodeError as error:
        raise FlagError(field=flag, value=text, allowed=f"is not valid JSON ({error})") from error
    if not isinstance(value, dict):
        raise FlagError(field=flag, value=text, allowed="must be a JSON object")
    return value


def _payload(args: argparse.Namespace) -> bytes:
    if args.payload is not None:
        text: str = args.payload
        return text.encode("utf-8")
    if args.payload_file is not None:
        try:
            with open(args.payload_file, "rb") as file:
                return file.read()
        except OSError as error:
            allowed = f"cannot be read ({error.strerror or error})"
            raise FlagError(
                field="--payload-file", value=args.payload_file, allowed=allowed
            ) from error
    return b""


def _labels(items: Sequence[str]) -> dict[str, str]:
    labels: dict[str, str] = {}
    for item in items:
        key, equals, value = item.partition("=")
        if not equals or not key:
            raise FlagError(field="--label", value=item, allowed="must be KEY=VALUE")
        labels[key] = value
    return labels


# ------------------------------------------------------------------ output


def _print_json(message: Any) -> None:
    print(json.dumps(readable(message), indent=2), flush=True)


def _report_failure(
    task_id: str, result: pb.TaskResult | None, flags: Mapping[pb.TaskPhase, str] | None = None
) -> None:
    """One line on stderr: a message may carry a traceback, which the JSON result on stdout
    keeps. `flags`: for a task made from flags, the flag that gave each phase its config,
    named instead of the task's `config_json` field."""
    if result is None:
        print(failure_line(task_id, "", "no result"), file=sys.stderr)
        return
    first_line = result.message.partition("\n")[0]
    flag = (flags or {}).get(result.phase)
    if flag is not None:
        first_line = in_flag_terms(first_line, flag)
    print(failure_line(task_id, result.failure_code, first_line), file=sys.stderr)


def in_flag_terms(message: str, flag: str) -> str:
    """`message` naming `flag` where it names the config that flag gave:
    'config_json.path must be ...' -> '"path" in --plugin-config must be ...'."""
    message = re.sub(r"config_json\.([A-Za-z_]\w*)", lambda key: f'"{key[1]}" in {flag}', message)
    return message.replace("config_json", flag)


class Progress:
    """One progress line of a task on `stream`: its id, its phase and the seconds elapsed.

    On a terminal the line is redrawn in place ("\\r"); elsewhere (a pipe, a
    log) each update is a line of its own and `redraw` does nothing.
    """

    def __init__(self, stream: TextIO, task_id: str, *, clock: Callable[[], float]) -> None:
        self.live = stream.isatty()
        self._stream = stream
        self._task_id = task_id
        self._clock = clock
        self._started_s = clock()
        self._shown: str | None = None
        self._width = 0

    def update(self, update: pb.TaskUpdate) -> None:
        self._shown = update.state.name if update.is_terminal else update.phase.name
        self._draw()

    def redraw(self) -> None:
        if self.live and self._shown is not None:
            self._draw()

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc_info: object) -> None:
        if self.live and self._width:
            self._stream.write("\n")
            self._stream.flush()

    def _draw(self) -> None:
        elapsed_s = self._clock() - self._started_s
        line = f"task {self._task_id}: {self._shown} {elapsed_s:.1f}s"
        if self.live:
            self._stream.write("\r" + line.ljust(self._width))
            self._width = len(line)
        else:
            self._stream.write(line + "\n")
        self._stream.flush()


def status_lines(status: pb.GetWorkerStatusResponse) -> list[str]:
    """The readable form of a worker's status."""
    lines = [
        f"worker      {status.worker_addr}",
        f"deployment  {status.deployment}",
        f"version     {status.version}",
        f"started     {_timestamp(status.started_at_ms)}",
        f"ready       {_yes_no(status.ready)}",
        f"draining    {_yes_no(status.draining)}",
        f"slots       {status.slots_total} total, {status.reserved_slots} reserved, "
        f"{status.running_tasks} running, {status.free_slots} free",
        f"results     {status.retained_results} retained, "
        f"{status.retained_bytes / _BYTES_PER_MB:.1f} MB",
        "",
    ]
    in_use = [slot for slot in status.slots if slot.state != "FREE"]
    if in_use:
        lines.append("slots in use:")
        lines.extend(
            _table(
                ("SLOT", "STATE", "TASK", "LEASE EXPIRES"),
                [
                    (slot.slot_id, slot.state, slot.task_id, _timestamp(slot.lease_expires_at_ms))
                    for slot in in_use
                ],
            )
        )
    else:
        lines.append("slots in use: none")
    lines.append("")
    if status.executors:
        lines.append("executors:")
        lines.extend(
            _table(
                ("ID", "STATE", "PID", "RSS MB", "CALLS SERVED", "RESTARTS"),
                [
                    (
                        executor.executor_id,
                        executor.state,
                        str(executor.pid),
                        f"{executor.rss_bytes / _BYTES_PER_MB:.1f}",
                        str(executor.calls_served),
                        str(executor.restarts),
                    )
                    for executor in status.executors
                ],
            )
        )
    else:
        lines.append("executors: none")
    return lines


def _table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> Iterator[str]:
    widths = [max(len(row[column]) for row in (headers, *rows)) for column in range(len(headers))]
    for row in (headers, *rows):
        yield (
            "  "
            + "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        )


def _timestamp(epoch_ms: int) -> str:
    if not epoch_ms:
        return "-"
    moment = datetime.datetime.fromtimestamp(epoch_ms / 1000, tz=datetime.UTC)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _yes_no(flag: bool) -> str:
    return "yes" if flag else "no"


# ------------------------------------------------------------------ entry point


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    run: Callable[[argparse.Namespace], int] = args.run
    try:
        return run(args)
    except BlockxError as error:
        one_line = " ".join(str(error).splitlines())
        label = "" if isinstance(error, StartupError) else "error: "
        print(f"blockx: {label}{one_line}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("blockx: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
