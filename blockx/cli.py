"""The `blockx` command line.

Owns parsing arguments, running a subcommand and turning its outcome into an
exit status: 0 success, 1 a blockx error (one line on stderr), 2 a usage error
(argparse). Must never hold logic a subcommand's module should own.

Subcommands: `functions publish DIR --redis URL [--prefix P]` publishes the
`.py` files under DIR as the current function-code epoch and prints it.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence

from blockx.errors import BlockxError
from blockx.functions import DEFAULT_REDIS_PREFIX, publish_directory


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m blockx", description="The blockx command line."
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

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
    return parser


def _publish(args: argparse.Namespace) -> int:
    print(publish_directory(args.directory, args.redis, args.prefix))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    run: Callable[[argparse.Namespace], int] = args.run
    try:
        return run(args)
    except BlockxError as error:
        one_line = " ".join(str(error).splitlines())
        print(f"blockx: error: {one_line}", file=sys.stderr)
        return 1
