"""Helpers of e2e tests that look at real processes."""

import os
import re
import subprocess
import sys
from pathlib import Path

import attrs
import trio

from tests.e2e.serve_process import REPO

RESULT_LINE = re.compile(r"^RESULT name=(\w+) value=(-?[0-9.]+)$", re.MULTILINE)


def alive(pid: int) -> bool:
    """True while `pid` runs (a zombie has exited: it only waits to be reaped)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


async def wait_exited(pid: int) -> None:
    """Until `pid` has exited (a pidfd becomes readable then); returns at once if it is gone."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return
    try:
        await trio.lowlevel.wait_readable(fd)
    finally:
        os.close(fd)


def parent_of(pid: int) -> int:
    """The pid of `pid`'s parent, from /proc (`pid` must run)."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    return int(stat.rsplit(")", 1)[1].split()[1])


@attrs.frozen
class BenchRun:
    figures: dict[str, float]
    """Its `RESULT name=... value=...` lines."""
    output: str
    """Everything it wrote to standard output."""


async def run_bench(*args: str, timeout_s: float) -> BenchRun:
    """Run `python args...` in the repository, as a bench is run; it must exit 0 within
    `timeout_s`."""
    with trio.fail_after(timeout_s):
        done: subprocess.CompletedProcess[bytes] = await trio.run_process(
            [sys.executable, *args],
            cwd=REPO,
            capture_stdout=True,
            capture_stderr=True,
            check=False,
        )
    output = done.stdout.decode()
    assert done.returncode == 0, output + done.stderr.decode()
    figures = {name: float(value) for name, value in RESULT_LINE.findall(output)}
    return BenchRun(figures=figures, output=output)
