"""Example functions: the worker's embedded default code directory serves these."""

import time


def add(a: int, b: int) -> int:
    return a + b


def echo(x: object) -> object:
    return x


def fail(msg: str) -> None:
    """Always raises: lets a test or an operator see a failing call end to end."""
    raise RuntimeError(msg)


def sleep(seconds: float) -> float:
    """Returns after `seconds`: a slow call for trying timeouts and shutdown."""
    time.sleep(seconds)
    return seconds


def burn(ms: float) -> float:
    """Keeps a core busy for `ms` milliseconds of CPU time: a compute-bound call."""
    until = time.process_time() + ms / 1000
    while time.process_time() < until:
        pass
    return ms
