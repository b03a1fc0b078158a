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
