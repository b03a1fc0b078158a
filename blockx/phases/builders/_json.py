"""What the builders read out of JSON: function references and call arguments.

Refusals are `BuilderFailed` naming the part of the task that is wrong (see
`blockx.phases._config`, whose JSON reading every builder uses). Pure: never
does IO.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final

from blockx.calls import encode_args
from blockx.errors import shown
from blockx.functions import is_valid_module_name
from blockx.phases import _config
from blockx.phases.builders._model import BuilderFailed

FUNCTION_FORM: Final = "'module.function' (dotted Python identifiers)"

json_type = _config.json_type


def parse_json(builder: str, what: str, text: str | bytes) -> object:
    return _config.parse_json(builder, what, text, BuilderFailed)


def parse_config(builder: str, config_json: str, allowed: Iterable[str]) -> dict[str, object]:
    return _config.parse_config(builder, config_json, allowed, BuilderFailed)


def check_keys(
    builder: str, where: str, mapping: dict[str, object], allowed: Iterable[str]
) -> None:
    _config.check_keys(builder, where, mapping, allowed, BuilderFailed)


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
