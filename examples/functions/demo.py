"""Example functions: the worker's embedded default code directory serves these."""


def add(a: int, b: int) -> int:
    return a + b


def echo(x: object) -> object:
    return x


def fail(msg: str) -> None:
    """Always raises: lets a test or an operator see a failing call end to end."""
    raise RuntimeError(msg)
