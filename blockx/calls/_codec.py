"""The msgpack value codec: how a call's arguments and its value travel as bytes.

Arguments are msgpack of a list (positional), a map (keywords), or a map of
keywords with the positional list under `"*"` when there are both. A value is
msgpack of whatever the function returned. Builders encode, executors decode
and encode, plugins decode: every one of them uses these four functions, so
the bytes a builder makes are exactly the bytes a function receives.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final

import msgpack  # type: ignore[import-untyped]  # ships no type information

from blockx.errors import BlockxError

POSITIONAL_KEY: Final = "*"
"""Key of the positional arguments when a call has both kinds (not an identifier)."""


class InvalidArguments(BlockxError):
    """A call's argument bytes are not a msgpack argument list or keyword map."""

    def __init__(self, *, reason: str) -> None:
        self.reason = reason
        super().__init__(f"invalid call arguments: {reason}")


def encode_args(
    args: Sequence[object] = (),
    kwargs: Mapping[str, object] | None = None,
    *,
    default: Callable[[Any], object] | None = None,
) -> bytes:
    """msgpack of a call's arguments. Raises TypeError / OverflowError (from msgpack)
    when an argument cannot be encoded; `default` gives a value msgpack lacks a form for
    one it has (msgpack's hook)."""
    packed: bytes
    if not kwargs:
        packed = msgpack.packb(list(args), default=default)
    elif not args:
        packed = msgpack.packb(dict(kwargs), default=default)
    else:
        packed = msgpack.packb({POSITIONAL_KEY: list(args), **kwargs}, default=default)
    return packed


def decode_args(data: bytes) -> tuple[list[Any], dict[str, Any]]:
    """The positional and keyword arguments in `data`; `InvalidArguments` if malformed."""
    try:
        decoded = msgpack.unpackb(data, strict_map_key=False)
    except (ValueError, TypeError, msgpack.UnpackException) as exc:
        raise InvalidArguments(reason=f"not valid msgpack ({exc})") from exc
    if isinstance(decoded, list):
        return decoded, {}
    if not isinstance(decoded, dict):
        raise InvalidArguments(reason=f"a {type(decoded).__name__}, not a list or a map")
    positional = decoded.pop(POSITIONAL_KEY, [])
    if not isinstance(positional, list):
        raise InvalidArguments(
            reason=f"{POSITIONAL_KEY!r} holds a {type(positional).__name__}, not a list"
        )
    for key in decoded:
        if not isinstance(key, str):
            raise InvalidArguments(reason=f"keyword {key!r} is not a string")
    return positional, decoded


def encode_value(value: object) -> bytes:
    """msgpack of a call's value. Raises TypeError / OverflowError (from msgpack)
    when the value has no msgpack form."""
    packed: bytes = msgpack.packb(value)
    return packed


def decode_value(data: bytes) -> Any:
    """The value in `data` as msgpack gives it (tuples come back as lists).

    Raises `ValueError`, `TypeError` or msgpack's `UnpackException` for bytes
    that are not one msgpack value (`VALUE_ERRORS` catches them all).
    """
    return msgpack.unpackb(data, strict_map_key=False)


VALUE_ERRORS: Final[tuple[type[Exception], ...]] = (ValueError, TypeError, msgpack.UnpackException)
"""What `decode_value` raises for bytes that are not a msgpack value."""
