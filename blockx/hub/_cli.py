"""`python -m blockx hub ...`: run a hub, and the operators' commands on its database.

    hub [--listen ADDR] [--db URL]                       run a hub until SIGINT/SIGTERM
    hub queue create QUEUE                               create a queue
    hub credential create --queue Q --rights R[,R]      print a new credential's token
    hub submit --queue Q --handler H ... --payload JSON  queue a task, print it
    hub task show TASK                                   a task with attempts and history

Every command takes `--db` (default `HUB_DB`, else `hub.sqlite3`). The
operators' commands work on the database directly, so they need no running
hub; a running hub offers what they queue within `HUB_POLL_MS`.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import time
from typing import Any

import trio

from blockx.config import parse_listen_addr
from blockx.errors import InvalidValue
from blockx.hub._admin import UnknownQueue, create_credential, create_queue, show_task, submit
from blockx.hub._api import InvalidSubmission, submission_from_json, task_json
from blockx.hub._config import HubConfig
from blockx.hub._model import ANY_QUEUE, Right
from blockx.hub._ops import SubmitRefusal
from blockx.hub._server import Hub
from blockx.hub._store import Store

logger = logging.getLogger("blockx.hub")


class CommandError(InvalidValue):
    """A command's argument is wrong: `field` is the flag."""

    def describe(self) -> str:
        return f"{self.field} {self.value!r}: {self.allowed}"


def add_commands(commands: Any) -> None:
    """Add `hub` and its subcommands to the command line's subcommands."""
    hub = commands.add_parser(
        "hub",
        help="run a hub (the control plane of automatic workers), or work on its database",
        description="Without a subcommand: run a hub until SIGINT or SIGTERM.",
    )
    _db_flag(hub)
    hub.add_argument("--listen", metavar="ADDR", help="host:port (default HUB_LISTEN, else :8090)")
    hub.set_defaults(run=_serve)
    sub = hub.add_subparsers(dest="hub_command", metavar="SUBCOMMAND")
    queue = sub.add_parser("queue", help="queues").add_subparsers(dest="verb", required=True)
    create = queue.add_parser("create", help="create a queue")
    create.add_argument("queue_id", metavar="QUEUE")
    _db_flag(create)
    create.set_defaults(run=_create_queue)
    credential = sub.add_parser("credential", help="credentials").add_subparsers(
        dest="verb", required=True
    )
    grant = credential.add_parser("create", help="create a credential and print its token")
    grant.add_argument("--queue", required=True, help=f"the queue, or {ANY_QUEUE!r} for all")
    grant.add_argument("--rights", required=True, help="comma-separated: producer, worker, admin")
    _db_flag(grant)
    grant.set_defaults(run=_create_credential)
    _add_submit(sub)
    task = sub.add_parser("task", help="tasks").add_subparsers(dest="verb", required=True)
    show = task.add_parser("show", help="a task with its attempts, evidence and history")
    show.add_argument("task_id", metavar="TASK")
    _db_flag(show)
    show.set_defaults(run=_show_task)


def _db_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--db",
        metavar="URL",
        help="SQLite file or postgresql:// URL (default HUB_DB, else hub.sqlite3)",
    )


def _add_submit(sub: Any) -> None:
    submit = sub.add_parser("submit", help="queue a task and print it as JSON")
    submit.add_argument("--queue", required=True)
    submit.add_argument("--handler", required=True)
    submit.add_argument("--handler-version", required=True)
    submit.add_argument("--payload-version", required=True)
    submit.add_argument("--payload", required=True, metavar="JSON", help="any JSON value")
    submit.add_argument(
        "--idempotent",
        action="store_true",
        help="running it again after an unknown outcome is safe",
    )
    submit.add_argument("--max-attempts", type=int, metavar="N")
    submit.add_argument("--deadline-ms", type=int, metavar="MS", help="the task's total deadline")
    submit.add_argument("--attempt-timeout-ms", type=int, metavar="MS")
    submit.add_argument("--task-id", metavar="ID", help="default: a new id")
    _db_flag(submit)
    submit.set_defaults(run=_submit)


def _config(args: argparse.Namespace) -> HubConfig:
    listen = getattr(args, "listen", None)
    if listen is not None:
        try:
            parse_listen_addr(listen)
        except ValueError as error:
            raise CommandError(field="--listen", value=listen, allowed=str(error)) from None
    return HubConfig.load(os.environ, {"db": args.db, "listen_addr": listen})


def _store(args: argparse.Namespace) -> Store:
    return Store(_config(args).db)


def _now_ms() -> int:
    return int(time.time() * 1000)


def _create_queue(args: argparse.Namespace) -> int:
    created = create_queue(_store(args), args.queue_id, _now_ms())
    print(f"queue {args.queue_id} {'created' if created else 'exists already'}")
    return 0


def _create_credential(args: argparse.Namespace) -> int:
    try:
        rights = frozenset(Right(name.strip()) for name in args.rights.split(",") if name.strip())
    except ValueError:
        raise CommandError(
            field="--rights", value=args.rights, allowed="comma-separated producer, worker, admin"
        ) from None
    if not rights:
        raise CommandError(field="--rights", value=args.rights, allowed="name at least one right")
    try:
        print(create_credential(_store(args), args.queue, rights, _now_ms()))
    except UnknownQueue:
        raise CommandError(field="--queue", value=args.queue, allowed="no such queue") from None
    return 0


def _submit(args: argparse.Namespace) -> int:
    try:
        payload = json.loads(args.payload)
    except ValueError as error:
        raise CommandError(
            field="--payload", value=args.payload, allowed=f"JSON: {error}"
        ) from None
    document: dict[str, object] = {
        "handler": args.handler,
        "handler_version": args.handler_version,
        "payload_version": args.payload_version,
        "payload": payload,
        "idempotency": "IDEMPOTENT" if args.idempotent else "NON_IDEMPOTENT",
    }
    for key, value in (
        ("max_attempts", args.max_attempts),
        ("total_deadline_ms", args.deadline_ms),
        ("attempt_timeout_ms", args.attempt_timeout_ms),
        ("task_id", args.task_id),
    ):
        if value is not None:
            document[key] = value
    try:
        submission = submission_from_json(document, args.queue)
    except InvalidSubmission as error:
        flag = _SUBMIT_FLAGS.get(error.field, "--" + error.field.replace("_", "-"))
        raise CommandError(field=flag, value=error.value, allowed=error.allowed) from None
    outcome = submit(_store(args), submission, _now_ms())
    if isinstance(outcome, SubmitRefusal):
        flag = "--" + outcome.field.replace("_", "-")
        raise CommandError(field=flag, value=getattr(args, outcome.field), allowed=outcome.message)
    print(json.dumps(task_json(outcome.task), indent=2))
    return 0


_SUBMIT_FLAGS = {"total_deadline_ms": "--deadline-ms", "idempotency": "--idempotent"}
"""The flag of each submission key whose flag is not the key spelled as a flag."""


def _show_task(args: argparse.Namespace) -> int:
    shown = show_task(_store(args), args.task_id)
    if shown is None:
        raise CommandError(field="TASK", value=args.task_id, allowed="no such task")
    print(json.dumps(shown, indent=2))
    return 0


# ------------------------------------------------------------------ serving


def _serve(args: argparse.Namespace) -> int:
    from blockx.observability.logs import setup_logging  # noqa: PLC0415

    config = _config(args)
    store = Store(config.db)
    setup_logging(os.environ.get("LOG_FORMAT", "json"))
    try:
        trio.run(_serve_until_signalled, config, store)
    finally:
        store.close()
    return 0


async def _serve_until_signalled(config: HubConfig, store: Store) -> None:
    host, port = config.listen_host_port()
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async with trio.open_nursery() as nursery:
            await nursery.start(Hub(config, store).run, host, port)
            async for signum in signals:
                logger.info("%s: the hub stops", signal.Signals(signum).name)
                nursery.cancel_scope.cancel()
                break
