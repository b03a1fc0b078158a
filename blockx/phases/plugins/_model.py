"""What a writer plugin is: its request, its protocol, its error and its registry.

A writer stores the outputs of a task's successful calls, in call order, where
the task's result handler says. It runs after every call has finished and must
never block the Trio thread: file and network IO go to a worker thread.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import ClassVar, Final, Protocol

import attrs
import msgpack  # type: ignore[import-untyped]  # ships no type information

from blockx.executors._wire import decode_value
from blockx.phases.plugins._registry import PhaseFailed, PluginRegistry
from blockx.slots import FailureCode, PluginResult, ResultHandler

SHOWN_CHARS: Final = 80
"""How much of an offending value a message quotes."""


@attrs.frozen(kw_only=True)
class WriteRequest:
    """One task's outputs and the handler that says where they go.

    `outputs` are the msgpack-encoded values of the calls that succeeded, in
    call order (`blockx.executors.decode_value` reads one).
    """

    task_id: str
    handler: ResultHandler
    outputs: tuple[bytes, ...]
    task_code_epoch: str


class Writer(Protocol):
    """Stores one task's outputs; `name` is the result-handler type it serves."""

    @property
    def name(self) -> str: ...

    async def write(self, request: WriteRequest) -> PluginResult: ...


class WriterFailed(PhaseFailed):
    """The outputs could not be stored (a full disk may clear, a bad config never does)."""

    default_code: ClassVar[str] = FailureCode.PLUGIN_FAILED.value


class WriterRegistry(PluginRegistry[Writer]):
    """The writer plugins of one worker, by name (immutable)."""

    kind: ClassVar[str] = "writer plugin"
    __slots__ = ()


def shown(value: object) -> str:
    text = repr(value)
    return text if len(text) <= SHOWN_CHARS else text[: SHOWN_CHARS - 3] + "..."


def parse_config(writer: str, config_json: str, allowed: Iterable[str]) -> dict[str, object]:
    """The handler config as a JSON object ("" = {}), refusing keys outside `allowed`."""
    if not config_json.strip():
        return {}
    try:
        config = json.loads(config_json)
    except json.JSONDecodeError as error:
        raise WriterFailed(message=f"{writer}: config_json is not valid JSON: {error}") from error
    except RecursionError as error:
        raise WriterFailed(message=f"{writer}: config_json is nested too deeply") from error
    if not isinstance(config, dict):
        raise WriterFailed(
            message=f"{writer}: config_json must be a JSON object, got {shown(config)}"
        )
    allowed = tuple(allowed)
    unknown = sorted(set(config) - set(allowed))
    if unknown and not allowed:
        raise WriterFailed(message=f"{writer}: config_json takes no keys, got {shown(unknown[0])}")
    if unknown:
        raise WriterFailed(
            message=f"{writer}: config_json has unknown key {shown(unknown[0])}; "
            f"allowed keys: {', '.join(allowed)}"
        )
    return config


def decoded_output(writer: str, index: int, output: bytes) -> object:
    """The value of output `index`; `WriterFailed` if the bytes are not msgpack."""
    try:
        return decode_value(output)
    except (ValueError, TypeError, msgpack.UnpackException) as error:
        raise WriterFailed(
            message=f"{writer}: output {index} is not a msgpack value ({error})"
        ) from error
