"""Helpers of e2e tests that look at real processes."""

from pathlib import Path


def alive(pid: int) -> bool:
    """True while `pid` runs (a zombie has exited: it only waits to be reaped)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"
