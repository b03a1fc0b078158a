"""`blockx autoworker`: run handlers named `module:function` against a hub.

    blockx autoworker --hub URL --queue Q --credential-file F [--capacity N]
        [--shutdown-timeout-ms MS] [--ca-file PEM] module:function [...]

Each function is imported as Celery, RQ or Dramatiq import their tasks (the
current directory first on the path). Its capability is the `Capability` in
its `capability` attribute (`blockx.autoworker.handles` sets one), else
the handler name `module.function` with the `--handler-version` and
`--payload-version` flags. The worker runs until the first SIGINT/SIGTERM,
which drains it (no new attempts; running ones finish within the shutdown
timeout); a second exits at once. At the end the command prints the worker's
`stats()` as one JSON line, and exits 1 if `run` raised (the error on stderr).
A drain that had to abandon handlers (Python cannot kill a thread) ends the
process at once instead of waiting for them.

Every command that reaches a hub names it with the same flags (`add_hub_flags`),
reads them the same way (`hub_client`) and words the same errors (`hub_errors`):
`hub submit --task-file` and `hub task ...` use them too.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import os
import sys
import textwrap
from collections.abc import Callable, Iterator
from typing import Any, Final

import attrs
import trio

from blockx.autoworker._client import HubClient, HubRequestFailed, hub_client_of
from blockx.autoworker._handlers import (
    CAPABILITY_ATTRIBUTE,
    DEFAULT_CAPACITY,
    DEFAULT_SHUTDOWN_TIMEOUT_MS,
    DEFAULT_VERSION,
    InvalidOption,
    WorkerHandler,
    WorkerOptions,
)
from blockx.autoworker._runtime import Worker, WorkerRunError
from blockx.errors import BlockxError, InvalidValue
from blockx.hubwire import Capability
from blockx.process.lifecycle import lone_errors
from blockx.settings import FlagError


def add_command(commands: Any) -> None:
    """Add `autoworker` to the command line's subcommands."""
    parser = commands.add_parser(
        "autoworker",
        help="run handler functions against a hub (an automatic worker)",
        description=textwrap.fill(
            "Run an automatic worker that takes the tasks of QUEUE from the hub at URL and "
            "runs each with the handler its capability names, until SIGINT or SIGTERM (the "
            "first drains it, a second exits at once). Prints the worker's counts as JSON "
            "at the end; exits 1 if the worker ended with an error.",
            width=78,
        ),
    )
    add_hub_flags(parser, "the worker's")
    parser.add_argument("--queue", required=True, metavar="QUEUE")
    parser.add_argument(
        "--capacity", type=int, default=DEFAULT_CAPACITY, metavar="N", help="default %(default)s"
    )
    parser.add_argument(
        "--shutdown-timeout-ms",
        type=int,
        default=DEFAULT_SHUTDOWN_TIMEOUT_MS,
        metavar="MS",
        help="how long the drain may take (default %(default)s)",
    )
    for flag in ("--handler-version", "--payload-version"):
        parser.add_argument(
            flag,
            default=DEFAULT_VERSION,
            metavar="V",
            help="of functions without a capability attribute (default %(default)s)",
        )
    parser.add_argument(
        "functions", nargs="+", metavar="module:function", help="the handlers to run"
    )
    parser.set_defaults(run=run_command)


def add_hub_flags(parser: argparse.ArgumentParser, whose: str, *, required: bool = True) -> None:
    """`--hub URL`, `--credential-file FILE` (holding `whose` credential, e.g. "an admin")
    and `--ca-file PEM`: where the hub is and who the command is to it. Not `required`
    where other flags may stand in for them: `hub_client` then names a missing one."""
    parser.add_argument(
        "--hub", required=required, metavar="URL", help="the hub, e.g. http://127.0.0.1:8090"
    )
    parser.add_argument(
        "--credential-file",
        required=required,
        metavar="FILE",
        help=f"a file holding {whose} credential (a bxc_... token)",
    )
    parser.add_argument(
        "--ca-file", metavar="PEM", help="the CA certificates to verify an https/wss hub with"
    )


def run_command(args: argparse.Namespace) -> int:
    worker = Worker(hub_client(args), _options(args))
    failure = trio.run(_run_until_signalled, worker)
    print(json.dumps(attrs.asdict(worker.stats()), separators=(",", ":")), flush=True)
    if failure is not None and failure.running:
        # A handler that ignored cancellation may still hold a thread, which Python
        # cannot kill: the process ends without waiting for it.
        print(f"blockx: error: {failure}", file=sys.stderr, flush=True)
        os._exit(1)
    if failure is not None:
        raise failure
    return 0


async def _run_until_signalled(worker: Worker) -> WorkerRunError | None:
    # The logs are the command's own: the library leaves logging to its user.
    from blockx.observability.logs import setup_logging  # noqa: PLC0415
    from blockx.process.signals import watch_signals  # noqa: PLC0415

    setup_logging("auto")
    drain = trio.Event()
    failure: WorkerRunError | None = None
    async with trio.open_nursery() as nursery:
        nursery.start_soon(watch_signals, drain, "draining the automatic worker")

        async def work() -> None:
            nonlocal failure
            with trio.CancelScope() as scope:
                nursery.start_soon(_cancel_when_set, drain, scope)
                try:
                    await worker.run()
                except WorkerRunError as error:
                    failure = error
            nursery.cancel_scope.cancel()

        nursery.start_soon(work)
    return failure


async def _cancel_when_set(event: trio.Event, scope: trio.CancelScope) -> None:
    await event.wait()
    scope.cancel()


def hub_client(args: argparse.Namespace, *, keep_alive: bool = False) -> HubClient:
    """The client of the hub the flags of `add_hub_flags` name, its credential read from
    its file: `FlagError` naming the flag that is missing or wrong."""
    for flag, value in (("--hub", args.hub), ("--credential-file", args.credential_file)):
        FlagError.check(value is not None, field=flag, value=value, allowed="is required")
    try:
        return hub_client_of(
            args.hub, args.credential_file, ca_file=args.ca_file or "", keep_alive=keep_alive
        )
    except InvalidValue as error:
        flag = _FLAG_OF.get(error.field, "--hub")
        raise FlagError(field=flag, value=error.value, allowed=error.allowed) from None


_FLAG_OF: Final = {"credential_file": "--credential-file", "ca_file": "--ca-file"}


@contextlib.contextmanager
def hub_errors(args: argparse.Namespace) -> Iterator[None]:
    """Within: a hub that cannot be reached, or that refuses the credential (401, 403),
    raises one `FlagError` naming `--hub` or `--credential-file` and what happened, for a
    command to end with one line. A failure of a task's own stays as it is."""
    try:
        with lone_errors(BaseException):
            yield
    except HubRequestFailed as error:
        if error.status not in (401, 403):
            raise
        answer = error.body.get("error", error.body) if isinstance(error.body, dict) else error.body
        raise FlagError(
            field="--credential-file",
            value=args.credential_file,
            allowed=f"the hub refused it ({error.status}: {answer})",
        ) from None
    except BlockxError:
        raise  # its own words: a certificate the client does not trust says so
    except (OSError, trio.BrokenResourceError) as error:
        raise FlagError(
            field="--hub", value=args.hub, allowed=f"cannot reach the hub: {error}"
        ) from None


def _options(args: argparse.Namespace) -> WorkerOptions:
    handlers = [_handler(spec, args) for spec in args.functions]
    try:
        return WorkerOptions(
            queue_id=args.queue,
            handlers=handlers,
            capacity=args.capacity,
            shutdown_timeout_ms=args.shutdown_timeout_ms,
        )
    except InvalidOption as error:
        flag = _OPTION_FLAGS.get(error.field.partition(".")[0].partition("[")[0], "")
        raise FlagError(
            field=flag or error.field, value=error.value, allowed=error.allowed
        ) from None


_OPTION_FLAGS: Final = {
    "queue_id": "--queue",
    "capacity": "--capacity",
    "shutdown_timeout_ms": "--shutdown-timeout-ms",
}


def _handler(spec: str, args: argparse.Namespace) -> WorkerHandler:
    function = load_function(spec)
    declared = getattr(function, CAPABILITY_ATTRIBUTE, None)
    if declared is None:
        module, _, name = spec.partition(":")
        declared = Capability(
            handler=f"{module}.{name}",
            handler_version=args.handler_version,
            payload_version=args.payload_version,
        )
    FlagError.check(
        isinstance(declared, Capability),
        field=spec,
        value=declared,
        allowed=f"its {CAPABILITY_ATTRIBUTE!r} attribute must be a Capability",
    )
    return WorkerHandler(capability=declared, handle=function)


def load_function(spec: str) -> Callable[..., Any]:
    """The callable `module:function` names, imported with the current directory first on
    the import path; `FlagError` naming the spec otherwise."""
    module_name, colon, name = spec.partition(":")
    FlagError.check(
        bool(colon and module_name and name),
        field=spec,
        value=spec,
        allowed="module:function, e.g. handlers:resize",
    )
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ImportError as error:
        raise FlagError(
            field=spec, value=module_name, allowed=f"an importable module ({error})"
        ) from None
    function: Any = module
    for part in name.split("."):
        function = getattr(function, part, None)
        if function is None:
            raise FlagError(field=spec, value=name, allowed=f"a name defined in {module_name}")
    FlagError.check(callable(function), field=spec, value=function, allowed="a function")
    return function  # type: ignore[no-any-return]
