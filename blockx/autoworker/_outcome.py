"""How a handler's ending becomes the outcome reported to the hub.

| the handler                                  | reported                            |
|----------------------------------------------|-------------------------------------|
| returned a JSON value (not None)             | SUCCEEDED with it                   |
| raised `WorkerFailure(code, details, ...)`   | FAILED with them                    |
| raised anything else                         | UNKNOWN / HANDLER_ERROR             |
| raised a crash-like BaseException            | UNKNOWN / HANDLER_PANIC or _ABORTED |
| returned something the hub cannot take       | UNKNOWN / INVALID_HANDLER_RESULT    |
| was cancelled because its lease ran out      | UNKNOWN / LEASE_LOST                |

A result is checked before it is sent, so a report the hub would refuse for
ever is never made: JSON without NaN or infinities, integers within 64 bits,
nesting at most `MAX_NESTING` deep, at most `MAX_JSON_BYTES` as text. The
exception's own text is never sent: it may hold anything.
"""

from __future__ import annotations

import json
import math
from typing import Any, Final

from blockx.errors import BlockxError
from blockx.hubwire import CODE_FORM, MAX_JSON_BYTES, Failed, Outcome, Succeeded, Unknown

MAX_NESTING: Final = 64
"""Deepest nesting of arrays and objects in a result or details."""
INT_RANGE: Final = (-(2**63), 2**63 - 1)

HANDLER_ERROR: Final = "HANDLER_ERROR"
HANDLER_PANIC: Final = "HANDLER_PANIC"
HANDLER_ABORTED: Final = "HANDLER_ABORTED"
INVALID_HANDLER_RESULT: Final = "INVALID_HANDLER_RESULT"
LEASE_LOST: Final = "LEASE_LOST"


class WorkerFailure(BlockxError):
    """Raise from a handler to fail the attempt on purpose.

    `code` matches `[A-Z][A-Z0-9_]{0,63}`; `details` is any JSON value (an empty
    object when None); `retryable` says running the task again is safe and may
    succeed (the hub still applies the task's attempts and deadline).
    """

    def __init__(self, code: str, details: Any = None, *, retryable: bool = False) -> None:
        self.code = code
        self.details = {} if details is None else details
        self.retryable = retryable
        super().__init__(f"{code} (retryable: {retryable})")


class UnfitResult(ValueError):
    """A value the hub would not take as a result or details; says why."""


def json_text(value: Any) -> str:
    """`value` as compact JSON text, or `UnfitResult` saying why it cannot be sent."""
    _check_value(value, depth=1)
    try:
        text = json.dumps(value, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    except (TypeError, ValueError) as error:
        raise UnfitResult(str(error)) from None
    size = len(text.encode("utf-8"))
    if size > MAX_JSON_BYTES:
        raise UnfitResult(f"{size} bytes of JSON; at most {MAX_JSON_BYTES}")
    return text


def _check_value(value: Any, *, depth: int) -> None:
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return
    if isinstance(value, int):
        if not INT_RANGE[0] <= value <= INT_RANGE[1]:
            raise UnfitResult(f"an integer outside 64 bits: {value.bit_length()} bits")
        return
    if isinstance(value, float):
        if not math.isfinite(value):
            raise UnfitResult(f"a number JSON cannot hold: {value}")
        return
    if isinstance(value, (list, tuple, dict)):
        if depth > MAX_NESTING:
            raise UnfitResult(f"nested deeper than {MAX_NESTING} levels")
        items = value.values() if isinstance(value, dict) else value
        if isinstance(value, dict) and not all(isinstance(key, str) for key in value):
            raise UnfitResult("an object key that is not a string")
        for item in items:
            _check_value(item, depth=depth + 1)
        return
    raise UnfitResult(f"a {type(value).__name__}, which is not a JSON value")


def returned(value: Any) -> Outcome:
    """The outcome of a handler that returned `value`."""
    if value is None:
        return Unknown(code=INVALID_HANDLER_RESULT)
    try:
        return Succeeded(result=json_text(value))
    except UnfitResult:
        return Unknown(code=INVALID_HANDLER_RESULT)


def raised(error: BaseException) -> Outcome:
    """The outcome of a handler that raised `error` (never its text)."""
    if isinstance(error, WorkerFailure):
        return _failure(error)
    if isinstance(error, Exception):
        return Unknown(code=HANDLER_ERROR)
    if isinstance(error, (SystemExit, GeneratorExit)):
        return Unknown(code=HANDLER_ABORTED)
    return Unknown(code=HANDLER_PANIC)


def _failure(error: WorkerFailure) -> Outcome:
    if not isinstance(error.code, str) or not CODE_FORM.fullmatch(error.code):
        return Unknown(code=INVALID_HANDLER_RESULT)
    try:
        details = json_text(error.details)
    except UnfitResult:
        return Unknown(code=INVALID_HANDLER_RESULT)
    return Failed(code=error.code, details=details, retryable=bool(error.retryable))


def lease_lost() -> Outcome:
    return Unknown(code=LEASE_LOST)
