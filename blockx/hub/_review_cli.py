"""`blockx hub task list|retry|resolve|cancel`: review and redrive through a running hub.

    hub task list --queue Q [--state S] [--handler H] [--since-ms T] [--until-ms T]
                  [--limit N] [--cursor C]                   a page of a queue's tasks
    hub task retry TASK | --queue Q [filter] [--dry-run]     one more attempt
    hub task resolve TASK (--succeeded JSON | --failed CODE [--details JSON])
    hub task cancel TASK | --queue Q [filter] [--dry-run]    end queued tasks CANCELLED

Unlike the commands that work on the database, these ask a hub over HTTP
(`--hub URL`) with an admin credential (`--credential-file`), so every action
goes through the hub's rules, its history names the credential, and each is
kept under a request id (`--request-id`, default a new one: give the same one
to repeat a command safely). Each prints the hub's JSON answer as it came.
"""

from __future__ import annotations

import argparse
import urllib.parse
from typing import Any

import trio

from blockx.hub._ops import new_id
from blockx.hubwire import InvalidJson, RawJson, parse_json, queue_tasks_path, task_path
from blockx.settings import FlagError


def add_task_commands(task: Any) -> None:
    """Add `list`, `retry`, `resolve` and `cancel` to `hub task`'s subcommands."""
    listing = task.add_parser("list", help="a page of a queue's tasks (admin, through a hub)")
    _hub_flags(listing)
    listing.add_argument("--queue", required=True)
    _filter_flags(listing)
    listing.add_argument("--limit", type=int, metavar="N", help="tasks a page (default 100)")
    listing.add_argument("--cursor", metavar="C", help="the next_cursor of the page before")
    listing.set_defaults(run=_list)
    for verb, what in (
        ("retry", "give a NEEDS_REVIEW or FAILED task one more attempt"),
        ("cancel", "end a QUEUED task CANCELLED"),
    ):
        action = task.add_parser(verb, help=f"{what} (or every task --queue and a filter select)")
        _hub_flags(action)
        _request_id_flag(action)
        action.add_argument("task_id", metavar="TASK", nargs="?")
        action.add_argument("--queue", help="act on this queue's tasks the filter selects")
        _filter_flags(action)
        action.add_argument("--dry-run", action="store_true", help="with --queue: count only")
        action.set_defaults(run=_act, verb=verb)
    resolve = task.add_parser("resolve", help="end a NEEDS_REVIEW task as its attempt ended")
    _hub_flags(resolve)
    _request_id_flag(resolve)
    resolve.add_argument("task_id", metavar="TASK")
    ended = resolve.add_mutually_exclusive_group(required=True)
    ended.add_argument("--succeeded", metavar="JSON", help="it succeeded with this result")
    ended.add_argument("--failed", metavar="CODE", help="it failed with this code")
    resolve.add_argument("--details", metavar="JSON", help="with --failed: the failure's details")
    resolve.set_defaults(run=_resolve, verb="resolve")


def _hub_flags(parser: argparse.ArgumentParser) -> None:
    # The flags every command that reaches a hub takes: the command line has loaded them.
    from blockx.autoworker.command import add_hub_flags  # noqa: PLC0415

    add_hub_flags(parser, "an admin")


def _request_id_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--request-id", metavar="ID", help="the same one repeats an action safely (default: new)"
    )


def _filter_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--state", help="e.g. NEEDS_REVIEW, FAILED, QUEUED")
    parser.add_argument("--handler")
    parser.add_argument("--since-ms", type=int, metavar="T", help="created at or after")
    parser.add_argument("--until-ms", type=int, metavar="T", help="created before")


def _filter(args: argparse.Namespace) -> dict[str, Any]:
    chosen = {
        "state": args.state,
        "handler": args.handler,
        "since_ms": args.since_ms,
        "until_ms": args.until_ms,
    }
    return {key: value for key, value in chosen.items() if value is not None}


def _list(args: argparse.Namespace) -> int:
    query = {"queue": args.queue, **_filter(args), "limit": args.limit, "cursor": args.cursor}
    shown = {key: value for key, value in query.items() if value is not None}
    return _ask(args, "GET", f"/v1/tasks?{urllib.parse.urlencode(shown)}", None)


def _act(args: argparse.Namespace) -> int:
    request_id = args.request_id or new_id()
    if (args.task_id is None) == (args.queue is None):
        raise FlagError(field="TASK", value=args.task_id, allowed="give a task or --queue")
    if args.task_id is not None:
        given = {"--dry-run": args.dry_run or None, **_filter(args)}
        for flag, value in given.items():
            if value is not None:
                raise FlagError(field=_flag(flag), value=value, allowed="only with --queue")
        return _ask(
            args, "POST", f"{task_path(args.task_id)}:{args.verb}", {"request_id": request_id}
        )
    body = {"request_id": request_id, **_filter(args), "dry_run": args.dry_run}
    return _ask(args, "POST", f"{queue_tasks_path(args.queue)}:{args.verb}", body)


def _flag(key: str) -> str:
    return key if key.startswith("--") else "--" + key.replace("_", "-")


def _resolve(args: argparse.Namespace) -> int:
    body: dict[str, Any] = {"request_id": args.request_id or new_id()}
    if args.succeeded is not None:
        if args.details is not None:
            raise FlagError(field="--details", value=args.details, allowed="only with --failed")
        body |= {"outcome": "SUCCEEDED", "result": _json(args.succeeded, "--succeeded")}
    else:
        body |= {"outcome": "FAILED", "code": args.failed}
        if args.details is not None:
            body["details"] = _json(args.details, "--details")
    return _ask(args, "POST", f"{task_path(args.task_id)}:resolve", body)


def _json(text: str, flag: str) -> RawJson:
    """The flag's JSON text, sent exactly as given."""
    try:
        parse_json(text, flag)
    except InvalidJson as error:
        raise FlagError(field=flag, value=text, allowed=f"JSON: {error}") from None
    return RawJson(text)


def _ask(args: argparse.Namespace, method: str, target: str, body: Any) -> int:
    """Send the request with the credential of `--credential-file`; print the answer."""
    # Only these commands reach a hub over HTTP: the client is not loaded for the others.
    from blockx.autoworker.command import hub_client, hub_errors  # noqa: PLC0415

    client = hub_client(args)
    with hub_errors(args):
        print(trio.run(client.request_text, method, target, body))
    return 0
