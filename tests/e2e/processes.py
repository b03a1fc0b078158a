"""Helpers of e2e tests that look at real processes."""

import os
from pathlib import Path

import trio


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
