"""Reading the JSON a task hands its builder and its plugin: configs and payloads.

Owns the wording of a refusal, so every builder and plugin names the part of
the task that is wrong (`config_json`, `payload`, `calls[3].args`) and what is
allowed. The refusal is the caller's own `PhaseFailed` subclass (`error`), so
it becomes the right phase's failure. Pure: never does IO.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping

from blockx.errors import shown
from blockx.phases._registry import PhaseFailed


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


def parse_json(owner: str, what: str, text: str | bytes, error: type[PhaseFailed]) -> object:
    """The JSON value in `text`; `error` naming `owner`, `what` and the error position."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise error(message=f"{owner}: {what} is not valid JSON: {exc}") from exc
    except UnicodeDecodeError as exc:
        raise error(message=f"{owner}: {what} is not UTF-8 text: {exc}") from exc
    except RecursionError as exc:
        raise error(message=f"{owner}: {what} is nested too deeply") from exc
    except ValueError as exc:  # JSON the parser refuses to hold, e.g. a 5,000-digit integer
        raise error(message=f"{owner}: {what} cannot be read: {exc}") from exc


def parse_config(
    owner: str, config_json: str, allowed: Iterable[str], error: type[PhaseFailed]
) -> dict[str, object]:
    """The config as a JSON object ("" = {}), refusing keys outside `allowed`."""
    if not config_json.strip():
        return {}
    config = parse_json(owner, "config_json", config_json, error)
    if not isinstance(config, dict):
        raise error(message=f"{owner}: config_json must be a JSON object, got {json_type(config)}")
    check_keys(owner, "config_json", config, allowed, error)
    return config


def check_keys(
    owner: str,
    where: str,
    mapping: dict[str, object],
    allowed: Iterable[str],
    error: type[PhaseFailed],
) -> None:
    allowed = tuple(allowed)
    unknown = sorted(set(mapping) - set(allowed))
    if unknown and not allowed:
        raise error(message=f"{owner}: {where} takes no keys, got {shown(unknown[0])}")
    if unknown:
        raise error(
            message=f"{owner}: {where} has unknown key {shown(unknown[0])}; "
            f"allowed keys: {', '.join(allowed)}"
        )


def config_integer(
    owner: str,
    config: Mapping[str, object],
    key: str,
    bounds: tuple[int, int, int],
    error: type[PhaseFailed],
) -> int:
    """`config[key]` (`bounds`: its default, lowest and highest value), an integer in
    range; `error` naming the key and the range otherwise."""
    default, low, high = bounds
    value = config.get(key, default)
    # bool is an int in Python but `"count": true` is a mistake in JSON.
    if type(value) is not int or not low <= value <= high:
        raise error(
            message=f"{owner}: config_json.{key} must be an integer from {low} to {high}, "
            f"got {shown(value)}"
        )
    return value
