"""JSON reading shared by the builders: config objects, payloads, function refs.

Owns the wording of a builder's refusal, so every builder names the part of
the task that is wrong (`config_json`, `payload`, `calls[3].args`) and what is
allowed. Pure: never does IO.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Final

from blockx.executors._wire import encode_args
from blockx.functions import is_valid_module_name
from blockx.phases.builders._model import BuilderFailed

SHOWN_CHARS: Final = 80
"""How much of an offending value a message quotes."""

FUNCTION_FORM: Final = "'module.function' (dotted Python identifiers)"


def shown(value: object) -> str:
    text = repr(value)
    return text if len(text) <= SHOWN_CHARS else text[: SHOWN_CHARS - 3] + "..."


def json_type(value: object) -> str:
    """The JSON name of a decoded value's type, for messages."""
    match value:
        case dict():
            return "an object"
        case list():
            return "an array"
        case str():
            return "a string"
        case bool():
            return "a boolean"
        case int() | float():
            return "a number"
        case None:
            return "null"
        case _:
            return type(value).__name__


def parse_json(builder: str, what: str, text: str | bytes) -> object:
    """The JSON value in `text`; `BuilderFailed` naming `what` and the error position."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as error:
        raise BuilderFailed(message=f"{builder}: {what} is not valid JSON: {error}") from error
    except UnicodeDecodeError as error:
        raise BuilderFailed(message=f"{builder}: {what} is not UTF-8 text: {error}") from error
    except RecursionError as error:
        raise BuilderFailed(message=f"{builder}: {what} is nested too deeply") from error


def parse_config(builder: str, config_json: str, allowed: Iterable[str]) -> dict[str, object]:
    """The function-call config as a JSON object ("" = {}), refusing keys outside `allowed`."""
    if not config_json.strip():
        return {}
    config = parse_json(builder, "config_json", config_json)
    if not isinstance(config, dict):
        raise BuilderFailed(
            message=f"{builder}: config_json must be a JSON object, got {json_type(config)}"
        )
    check_keys(builder, "config_json", config, allowed)
    return config


def check_keys(
    builder: str, where: str, mapping: dict[str, object], allowed: Iterable[str]
) -> None:
    allowed = tuple(allowed)
    unknown = sorted(set(mapping) - set(allowed))
    if unknown and not allowed:
        raise BuilderFailed(message=f"{builder}: {where} takes no keys, got {shown(unknown[0])}")
    if unknown:
        raise BuilderFailed(
            message=f"{builder}: {where} has unknown key {shown(unknown[0])}; "
            f"allowed keys: {', '.join(allowed)}"
        )


def function_ref(builder: str, where: str, value: object) -> str:
    """`value` if it is a function reference the executors can resolve."""
    if value is None:
        raise BuilderFailed(message=f"{builder}: {where} is required: {FUNCTION_FORM}")
    if isinstance(value, str):
        module, dot, function = value.rpartition(".")
        # The executor's loader applies the same rule; refusing here fails the
        # task before any call is dispatched.
        if dot and is_valid_module_name(module) and function.isidentifier():
            return value
    raise BuilderFailed(message=f"{builder}: {where} must be {FUNCTION_FORM}, got {shown(value)}")


def argument_list(builder: str, where: str, value: object) -> list[object]:
    if not isinstance(value, list):
        raise BuilderFailed(
            message=f"{builder}: {where} must be a JSON array of arguments, got {json_type(value)}"
        )
    return value


def encoded_args(builder: str, where: str, args: list[object]) -> bytes:
    try:
        return encode_args(args)
    except (TypeError, ValueError, OverflowError) as error:
        # JSON integers are unbounded; msgpack's stop at 64 bits.
        raise BuilderFailed(
            message=f"{builder}: {where} cannot be encoded as call arguments: {error}"
        ) from error
