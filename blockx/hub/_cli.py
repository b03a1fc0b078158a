"""`blockx hub ...`: run a hub, and the operators' commands on its database.

    hub [--config FILE] [--listen ADDR] [--db URL] ...    run a hub until SIGINT/SIGTERM
    hub queue create QUEUE                                create a queue
    hub queue limit QUEUE [--key K] --max-running N       limit a concurrency key's attempts
    hub queue list                                        queues: paused, tasks by state
    hub queue pause QUEUE / resume QUEUE                  stop offering its tasks / offer again
    hub credential create --queue Q --rights R[,R]       print a new credential's token
    hub credential list                                   credentials (never their secrets)
    hub credential revoke ID                              refuse it; its sessions are closed
    hub submit --queue Q --handler H ... --payload JSON   queue a task, print it
    hub submit --queue Q --file TASKS.jsonl               queue a file of tasks
    hub submit --queue Q --task-file F --hub URL ...      worker nodes' tasks, through a hub
                                                          (`_producer_cli`), [--wait]
    hub task show TASK                                    a task with attempts and history
    hub task list|retry|resolve|cancel ...                review and redrive (`_review_cli`)

Settings come from `blockx.settings` (defaults -> the `--config` file, else
`HUB_CONFIG`'s -> environment -> flags); `hub --help` lists every one. Every
command takes `--db` and `--config`. The operators' commands work on the
database directly, so they need no running hub; a running hub offers what they
queue within `pollMs`. A running hub follows the signal rule of every blockx
server (`blockx.process.signals`): the first SIGINT/SIGTERM drains it
(`Hub.drain`), a second exits at once.
"""

from __future__ import annotations

import argparse
import logging
import sys
import textwrap
import time
from pathlib import Path
from typing import Any, Final

import trio

from blockx.errors import BlockxError
from blockx.hub._admin import (
    UnknownQueue,
    create_credential,
    create_queue,
    pause_queue,
    revoke_credential,
    set_key_limit,
    show_credentials,
    show_queues,
    show_task,
    submit,
    submit_many,
)
from blockx.hub._admin_api import MAX_KEY_LIMIT
from blockx.hub._api import InvalidSubmission, submission_from_json, task_json
from blockx.hub._config import CONFIG_FILE_ENV, HubConfig
from blockx.hub._model import ANY_QUEUE, Right
from blockx.hub._ops import SubmitRefusal
from blockx.hub._producer_cli import (
    PROFILES,
    flag_of,
    refuse_task_file_flags,
    submission_fields,
    submit_task_file,
)
from blockx.hub._review_cli import add_task_commands
from blockx.hub._server import Hub
from blockx.hub._store import Store
from blockx.hubwire import MAX_BATCH_TASKS, InvalidJson, RawJson, dumps, parse_json
from blockx.process.lifecycle import lone_errors
from blockx.process.signals import watch_signals
from blockx.settings import FlagError, flag_overrides, help_text, refuse_flags

logger = logging.getLogger("blockx.hub")

SERVE_FLAGS: Final = {
    "listenAddr": "--listen",
    "db": "--db",
    "leaseMs": "--lease-ms",
    "sessionTtlMs": "--session-ttl-ms",
    "drainTimeoutMs": "--drain-timeout-ms",
}
"""The setting each of `hub`'s flags sets (its JSON path): the flag is named in its errors."""
STORE_FLAGS: Final = {"db": "--db"}
"""The settings flags of the commands that work on the database."""


def add_commands(commands: Any) -> None:
    """Add `hub` and its subcommands to the command line's subcommands."""
    hub = commands.add_parser(
        "hub",
        help="run a hub (the control plane of automatic workers), or work on its database",
        description=textwrap.fill(
            "Without a subcommand: run a hub until SIGINT or SIGTERM. The first signal drains "
            "it (no new sessions or requests; commits under way finish; workers are told to "
            "reconnect later); a second exits at once. Flags override the configuration file "
            f"(--config, else {CONFIG_FILE_ENV}) and the environment.",
            width=78,
        ),
        epilog=help_text(HubConfig, CONFIG_FILE_ENV),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _settings_flags(hub)
    hub.add_argument("--listen", metavar="ADDR", help="listenAddr, env HUB_LISTEN")
    hub.add_argument("--lease-ms", type=int, metavar="MS", help="leaseMs, env HUB_LEASE_MS")
    hub.add_argument(
        "--session-ttl-ms", type=int, metavar="MS", help="sessionTtlMs, env HUB_SESSION_TTL_MS"
    )
    hub.add_argument(
        "--drain-timeout-ms",
        type=int,
        metavar="MS",
        help="drainTimeoutMs, env HUB_DRAIN_TIMEOUT_MS",
    )
    hub.set_defaults(run=_serve, flags=SERVE_FLAGS)
    sub = hub.add_subparsers(dest="hub_command", metavar="SUBCOMMAND")
    _add_queue(sub)
    _add_credential(sub)
    _add_submit(sub)
    task = sub.add_parser("task", help="tasks").add_subparsers(dest="verb", required=True)
    show = task.add_parser("show", help="a task with its attempts, evidence and history")
    show.add_argument("task_id", metavar="TASK")
    _settings_flags(show)
    show.set_defaults(run=_show_task)
    add_task_commands(task)


def _add_queue(sub: Any) -> None:
    queue = sub.add_parser("queue", help="queues").add_subparsers(dest="verb", required=True)
    create = queue.add_parser("create", help="create a queue")
    create.add_argument("queue_id", metavar="QUEUE")
    _settings_flags(create)
    create.set_defaults(run=_create_queue)
    limit = queue.add_parser(
        "limit",
        help="limit the live (offered or running) attempts of one concurrency key at a time",
    )
    limit.add_argument("queue_id", metavar="QUEUE")
    limit.add_argument("--key", default="", help="one key (default: every key without its own)")
    limit.add_argument(
        "--max-running", type=int, required=True, metavar="N", help="0 removes the limit"
    )
    _settings_flags(limit)
    limit.set_defaults(run=_limit_key)
    listing = queue.add_parser("list", help="every queue: paused, tasks by state, oldest age")
    _settings_flags(listing)
    listing.set_defaults(run=_list_queues)
    for verb, help_line in (
        ("pause", "take submissions but offer none of the queue's tasks"),
        ("resume", "offer the queue's tasks again"),
    ):
        action = queue.add_parser(verb, help=help_line)
        action.add_argument("queue_id", metavar="QUEUE")
        _settings_flags(action)
        action.set_defaults(run=_pause_queue)


def _add_credential(sub: Any) -> None:
    credential = sub.add_parser("credential", help="credentials").add_subparsers(
        dest="verb", required=True
    )
    grant = credential.add_parser("create", help="create a credential and print its token")
    grant.add_argument("--queue", required=True, help=f"the queue, or {ANY_QUEUE!r} for all")
    grant.add_argument("--rights", required=True, help="comma-separated: producer, worker, admin")
    _settings_flags(grant)
    grant.set_defaults(run=_create_credential)
    listing = credential.add_parser("list", help="every credential (never its secret)")
    _settings_flags(listing)
    listing.set_defaults(run=_list_credentials)
    revoke = credential.add_parser(
        "revoke", help="refuse a credential from now on; its workers are disconnected"
    )
    revoke.add_argument("credential_id", metavar="ID")
    _settings_flags(revoke)
    revoke.set_defaults(run=_revoke_credential)


def _settings_flags(parser: argparse.ArgumentParser) -> None:
    """The flags every hub command takes: the configuration file and the database."""
    parser.add_argument(
        "--config",
        metavar="FILE",
        help=f"a JSON file of settings (default: the one {CONFIG_FILE_ENV} names, if any)",
    )
    parser.add_argument(
        "--db",
        metavar="URL",
        help="db, env HUB_DB: a SQLite file or a postgresql:// URL (default hub.sqlite3)",
    )
    parser.set_defaults(flags=STORE_FLAGS)


_SUBMIT_PARAGRAPHS: Final = (
    "Queue one task, described by the flags, and print it as JSON; or, with --file, "
    "the tasks of a JSON-lines file, one submission per line as the producers' API "
    "takes it (handler, handler_version, payload_version, payload, and optional "
    "keys). The whole file is checked first: if a line is bad, each bad line is named "
    "on stderr and nothing is queued. Then the tasks are queued in transactions of "
    f"{MAX_BATCH_TASKS}, printing a JSON line per task (its line, task_id and status, "
    "or the error); the exit status is 1 if any was refused. These work on the hub's "
    "database (--db).",
    "With --task-file, queue worker nodes' tasks through a running hub (--hub, with a "
    "producer's --credential-file) for the nodes of --profile: a task file as `blockx "
    "submit --file` takes it, one task in a .json file, one per line in a .jsonl file. "
    "The whole file is checked first (a bad line is named, and then nothing is queued); a "
    "task's task_id names it at the hub, so the same file sent again queues nothing new. "
    "Prints a JSON line per task (task_id and status, or the error). With --wait, prints "
    "one task's result as `blockx submit --watch` does, or a JSON line per task of a "
    ".jsonl file as each ends, a progress bar and a summary; the exit status is 1 if any "
    "did not succeed. The per-task flags apply to each task.",
)


def _add_submit(sub: Any) -> None:
    # The flags of every command that reaches a hub: the command line has loaded them.
    from blockx.autoworker.command import add_hub_flags  # noqa: PLC0415

    submit = sub.add_parser(
        "submit",
        help="queue a task and print it as JSON, or the tasks of a file",
        description="\n\n".join(textwrap.fill(text, width=78) for text in _SUBMIT_PARAGRAPHS),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    submit.add_argument("--queue", required=True)
    submit.add_argument("--file", metavar="TASKS.jsonl", help="the tasks, one per line")
    submit.add_argument(
        "--task-file",
        metavar="TASK.json",
        help="worker nodes' tasks: a JSON task file, or one task per line in a .jsonl file",
    )
    add_hub_flags(submit, "a producer's", required=False)
    submit.add_argument(
        "--profile",
        choices=PROFILES,
        help="with --task-file: the worker nodes' profile (default block)",
    )
    submit.add_argument(
        "--wait", action="store_true", help="with --task-file: print the tasks' results"
    )
    submit.add_argument("--handler")
    submit.add_argument("--handler-version")
    submit.add_argument("--payload-version")
    submit.add_argument("--payload", metavar="JSON", help="any JSON value")
    submit.add_argument(
        "--idempotent",
        action="store_true",
        help="running it again after an unknown outcome is safe",
    )
    submit.add_argument("--max-attempts", type=int, metavar="N")
    submit.add_argument("--deadline-ms", type=int, metavar="MS", help="the task's total deadline")
    submit.add_argument("--attempt-timeout-ms", type=int, metavar="MS")
    submit.add_argument(
        "--task-id", metavar="ID", help="default: a new id (with --task-file: the file's)"
    )
    submit.add_argument("--priority", type=int, metavar="0-9", help="higher goes first (default 5)")
    when = submit.add_mutually_exclusive_group()
    when.add_argument("--run-at-ms", type=int, metavar="MS", help="offered no sooner (epoch ms)")
    when.add_argument("--delay-ms", type=int, metavar="MS", help="offered no sooner than this")
    submit.add_argument(
        "--concurrency-key", metavar="KEY", help="its queue limits the key's attempts at once"
    )
    _settings_flags(submit)
    submit.set_defaults(run=_submit)


def _config(args: argparse.Namespace) -> HubConfig:
    """The hub's settings: defaults, the file, the environment, then the flags given."""
    overrides = flag_overrides(args, args.flags)
    return HubConfig.load(overrides=overrides, flags=args.flags, file=args.config)


def _store(args: argparse.Namespace) -> Store:
    return Store(_config(args).db)


def _now_ms() -> int:
    return int(time.time() * 1000)


def _create_queue(args: argparse.Namespace) -> int:
    created = create_queue(_store(args), args.queue_id, _now_ms())
    print(f"queue {args.queue_id} {'created' if created else 'exists already'}")
    return 0


def _limit_key(args: argparse.Namespace) -> int:
    if not 0 <= args.max_running <= MAX_KEY_LIMIT:
        allowed = f"0 (no limit) to {MAX_KEY_LIMIT}"
        raise FlagError(field="--max-running", value=args.max_running, allowed=allowed)
    try:
        set_key_limit(_store(args), args.queue_id, args.key, args.max_running)
    except UnknownQueue:
        raise FlagError(field="QUEUE", value=args.queue_id, allowed="no such queue") from None
    key = f"key {args.key!r}" if args.key else "every key"
    print(f"queue {args.queue_id}: {key} at most {args.max_running or 'unlimited'}")
    return 0


def _list_queues(args: argparse.Namespace) -> int:
    print(dumps(show_queues(_store(args), _now_ms()), indent=2))
    return 0


def _pause_queue(args: argparse.Namespace) -> int:
    try:
        pause_queue(_store(args), args.queue_id, args.verb == "pause")
    except UnknownQueue:
        raise FlagError(field="QUEUE", value=args.queue_id, allowed="no such queue") from None
    print(f"queue {args.queue_id} {'paused' if args.verb == 'pause' else 'resumed'}")
    return 0


def _list_credentials(args: argparse.Namespace) -> int:
    print(dumps(show_credentials(_store(args)), indent=2))
    return 0


def _revoke_credential(args: argparse.Namespace) -> int:
    if not revoke_credential(_store(args), args.credential_id):
        raise FlagError(field="ID", value=args.credential_id, allowed="no such credential")
    print(f"credential {args.credential_id} revoked")
    return 0


def _create_credential(args: argparse.Namespace) -> int:
    try:
        rights = frozenset(Right(name.strip()) for name in args.rights.split(",") if name.strip())
    except ValueError:
        raise FlagError(
            field="--rights", value=args.rights, allowed="comma-separated producer, worker, admin"
        ) from None
    if not rights:
        raise FlagError(field="--rights", value=args.rights, allowed="name at least one right")
    try:
        print(create_credential(_store(args), args.queue, rights, _now_ms()))
    except UnknownQueue:
        raise FlagError(field="--queue", value=args.queue, allowed="no such queue") from None
    return 0


def _submit(args: argparse.Namespace) -> int:
    if args.task_file is not None:
        return submit_task_file(args)
    refuse_task_file_flags(args)
    if args.file is not None:
        return _submit_file(args)
    for flag in ("handler", "handler_version", "payload_version", "payload"):
        FlagError.check(
            getattr(args, flag) is not None,
            field="--" + flag.replace("_", "-"),
            value=None,
            allowed="is required (or --file)",
        )
    try:
        parse_json(args.payload, "payload")
    except InvalidJson as error:
        raise FlagError(field="--payload", value=args.payload, allowed=f"JSON: {error}") from None
    document: dict[str, object] = {
        "handler": args.handler,
        "handler_version": args.handler_version,
        "payload_version": args.payload_version,
        "payload": RawJson(args.payload),
        **submission_fields(args),
    }
    try:
        submission = submission_from_json(dumps(document), args.queue)
    except InvalidSubmission as error:
        raise FlagError(
            field=flag_of(error.field), value=error.value, allowed=error.allowed
        ) from None
    outcome = submit(_store(args), submission, _now_ms())
    if isinstance(outcome, SubmitRefusal):
        flag = "--" + outcome.field.replace("_", "-")
        raise FlagError(field=flag, value=getattr(args, outcome.field), allowed=outcome.message)
    print(dumps(task_json(outcome.task), indent=2))
    return 0


def _submit_file(args: argparse.Namespace) -> int:
    refuse_flags(args, _ONE_TASK_FLAGS, "not with --file: each line describes its task")
    numbered = _task_lines(args.file)
    submissions, bad = [], []
    for number, line in numbered:
        try:
            submissions.append(submission_from_json(line, args.queue))
        except InvalidSubmission as error:
            bad.append(f"line {number}: {error}")
    for line in bad[:SHOWN_BAD_LINES]:
        print(f"blockx: {line}", file=sys.stderr)
    FlagError.check(
        not bad,
        field="--file",
        value=args.file,
        allowed=f"{len(bad)} bad line(s) (the first {SHOWN_BAD_LINES} above); nothing was queued",
    )
    store = _store(args)
    refused = 0
    for start in range(0, len(submissions), MAX_BATCH_TASKS):
        chunk = slice(start, start + MAX_BATCH_TASKS)
        outcomes = submit_many(store, submissions[chunk], _now_ms())
        for (number, _), outcome in zip(numbered[chunk], outcomes, strict=True):
            if isinstance(outcome, SubmitRefusal):
                refused += 1
                shown = {"line": number, "error": outcome.message, "field": outcome.field}
            else:
                status = 201 if outcome.created else 200
                shown = {"line": number, "task_id": outcome.task.task_id, "status": status}
            print(dumps(shown))
    return 1 if refused else 0


def _task_lines(path: str) -> list[tuple[int, str]]:
    """The numbered lines of a tasks file that are not blank."""
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as error:
        raise FlagError(
            field="--file", value=path, allowed=f"a readable UTF-8 file ({error})"
        ) from None
    return [(number, line) for number, line in enumerate(lines, 1) if line.strip()]


_ONE_TASK_FLAGS: Final = (
    "handler",
    "handler_version",
    "payload_version",
    "payload",
    "idempotent",
    "max_attempts",
    "deadline_ms",
    "attempt_timeout_ms",
    "task_id",
)
"""The flags that describe the one task of `submit` without `--file`."""
SHOWN_BAD_LINES: Final = 20


def _show_task(args: argparse.Namespace) -> int:
    shown = show_task(_store(args), args.task_id)
    if shown is None:
        raise FlagError(field="TASK", value=args.task_id, allowed="no such task")
    print(dumps(shown, indent=2))
    return 0


# ------------------------------------------------------------------ serving


def _serve(args: argparse.Namespace) -> int:
    # Only serving logs (the operators' commands print), and the log module is not small.
    from blockx.observability.logs import setup_logging  # noqa: PLC0415

    config = _config(args)
    setup_logging(config.log_format)
    store = Store(config.db)
    try:
        more = config.commit_connections - 1 if store.postgres else 0
        with lone_errors(BlockxError):
            lanes = [Store(config.db) for _ in range(more)]
            trio.run(_serve_until_drained, config, store, lanes)
    finally:
        store.close()
    return 0


async def _serve_until_drained(config: HubConfig, store: Store, lanes: list[Store]) -> None:
    """Serve until the first SIGINT/SIGTERM, then drain (`Hub.drain`); a second exits."""
    host, port = config.listen_host_port()
    drain = trio.Event()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(watch_signals, drain, "draining the hub")
        await Hub(config, store, lanes=lanes).run(host, port, stop=drain)
        nursery.cancel_scope.cancel()
