"""What the command lines read and print of the tasks they submit: a task file, a batch
file's bad lines, and a batch's tasks as each ends, with a progress bar and a summary.

`blockx submit --file TASKS.jsonl` (tasks sent to a worker) and `blockx hub
submit --task-file TASKS.jsonl` (the same tasks sent to worker nodes through the
hub) read one file format, so they refuse a file in the same words and report
its tasks the same way. Only the command lines import this module: `import
blockx.client` loads neither it nor tqdm.
"""

from __future__ import annotations

import collections
import json
import sys
import uuid
from collections.abc import AsyncIterable, Callable
from contextlib import AbstractAsyncContextManager
from typing import Any, TypeVar

from tqdm import tqdm

from blockx.client._specs import InvalidTaskLines, TaskLine, task_lines
from blockx.settings import FlagError

BATCH_SUFFIXES = (".jsonl", ".ndjson")
"""A task file whose name ends so is a batch, one task per line."""
SHOWN_BAD_LINES = 20
"""How many bad lines of a batch are shown before the count of the rest."""

Ended = TypeVar("Ended")


def read_task_file(path: str, flag: str) -> Any:
    """The JSON value of the one-task file at `path`: else a `FlagError` naming `flag` and
    why it cannot be read."""
    try:
        with open(path, encoding="utf-8") as file:
            return json.load(file)
    except OSError as error:
        allowed = f"cannot be read ({error.strerror or error})"
        raise FlagError(field=flag, value=path, allowed=allowed) from error
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        allowed = f"is not valid JSON ({error})"
        raise FlagError(field=flag, value=path, allowed=allowed) from error


def read_batch(
    path: str,
    flag: str,
    *,
    new_task_id: Callable[[], str] = lambda: uuid.uuid4().hex,
    also: Callable[[dict[str, Any]], object] | None = None,
) -> list[TaskLine]:
    """Every task of the batch file at `path` (`task_lines`, with `also`): else a
    `FlagError` naming `flag`, once each bad line is named on stderr, for nothing may
    be sent."""
    try:
        with open(path, "rb") as file:
            lines = file.read().split(b"\n")
    except OSError as error:
        allowed = f"cannot be read ({error.strerror or error})"
        raise FlagError(field=flag, value=path, allowed=allowed) from error
    try:
        tasks = task_lines(lines, new_task_id=new_task_id, also=also)
    except InvalidTaskLines as error:
        raise refused_lines(path, flag, error) from error
    if not tasks:
        raise FlagError(field=flag, value=path, allowed="holds no task")
    return tasks


def refused_lines(path: str, flag: str, error: InvalidTaskLines) -> FlagError:
    """The error that refuses the batch at `path` (given by `flag`) for `error`'s bad
    lines, once the first `SHOWN_BAD_LINES` of them are named on stderr."""
    for line, problem in error.problems[:SHOWN_BAD_LINES]:
        print(f"blockx: {path} line {line}: {problem}", file=sys.stderr)
    if len(error.problems) > SHOWN_BAD_LINES:
        more = len(error.problems) - SHOWN_BAD_LINES
        print(f"blockx: {path}: {more} more bad lines", file=sys.stderr)
    return FlagError(field=flag, value=path, allowed=f"has {error}; nothing was sent")


async def follow_batch(
    run: AbstractAsyncContextManager[AsyncIterable[Ended]],
    total: int,
    line_of: Callable[[Ended], dict[str, Any]],
) -> int:
    """One JSON line per task as it ends (`line_of` what `run` yields, a dict with its
    `state`), a progress bar on stderr while they run, then a summary line there; the
    exit status: 0 when all `total` succeeded, else 1."""
    states: collections.Counter[str] = collections.Counter()
    with tqdm(total=total, unit="task", file=sys.stderr, disable=None, dynamic_ncols=True) as bar:
        async with run as ended:
            async for each in ended:
                line = line_of(each)
                states[line["state"]] += 1
                tqdm.write(json.dumps(line), file=sys.stdout)
                sys.stdout.flush()
                bar.update(1)
    counts = ", ".join(f"{count} {state.lower()}" for state, count in sorted(states.items()))
    print(f"blockx: {total} task{'' if total == 1 else 's'}: {counts}", file=sys.stderr)
    return 0 if states["SUCCEEDED"] == total else 1


def failure_line(task_id: str, code: str, message: str, *, ended: str = "failed") -> str:
    """The one line on stderr of a task that did not succeed: its code and the first line
    of its message (a message may carry a traceback, which the JSON result keeps)."""
    detail = ": ".join(part for part in (code, message.partition("\n")[0]) if part)
    return f"blockx: task {task_id} {ended}: {detail or 'no failure code'}"
