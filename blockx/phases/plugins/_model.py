"""What a plugin is: its request, its protocol, its error and its registry, and the
JSON form of an output that the plugins writing JSON share.

A plugin (a "writer" in older task files) runs the third phase of a task: it stores
the outputs of the task's successful calls, in call order, where the task's
result handler says. It runs after every call has finished and must never
block the Trio thread: file and network IO go to a worker thread.
"""

from __future__ import annotations

import base64
from collections.abc import Iterable
from typing import ClassVar, Final, Protocol

import attrs

from blockx.calls import VALUE_ERRORS, FailureCode, decode_value
from blockx.io import TaskIOScope
from blockx.phases import _config
from blockx.phases._registry import PhaseFailed, Registry
from blockx.slots import PluginResult, ResultHandler


@attrs.frozen(kw_only=True)
class PluginRequest:
    """One task's outputs and the result handler that says where they go.

    `outputs` are the msgpack-encoded values of the calls that succeeded, in
    call order (`blockx.calls.decode_value` reads one).
    """

    task_id: str
    handler: ResultHandler
    outputs: tuple[bytes, ...]
    task_code_epoch: str
    io: TaskIOScope | None = attrs.field(default=None, eq=False, hash=False)
    """The task's IO scope, for a writer that stores into a sink (None outside a worker)."""


class Plugin(Protocol):
    """Stores one task's outputs; `name` is the result-handler type it serves."""

    @property
    def name(self) -> str: ...

    @property
    def usage(self) -> str:
        """What it takes and does, in one line: its config keys (for `--help`)."""
        ...

    async def run(self, request: PluginRequest) -> PluginResult: ...


class InlinePlugin(Plugin, Protocol):
    """A plugin that does no IO and little work: it keeps, counts or logs the outputs.

    The worker runs `run_now` within the slot table's own step, as soon as the
    task's calls end, without a task actor and without taking a plugin slot (it
    is over before any other task runs), so such a task costs fewer trips
    through the scheduler. `run_now` may decline (None) a request that is too
    much work for a step (large outputs, a configured delay): the task actor
    then awaits `run`, which must store the same outputs the same way.
    """

    def run_now(self, request: PluginRequest) -> PluginResult | None: ...


class PluginFailed(PhaseFailed):
    """The outputs could not be stored (a full disk may clear, a bad config never does)."""

    default_code: ClassVar[FailureCode] = FailureCode.PLUGIN_FAILED


class PluginRegistry(Registry[Plugin]):
    """The plugins of one worker, by name (immutable)."""

    kind: ClassVar[str] = "plugin"
    __slots__ = ()


def parse_config(plugin: str, config_json: str, allowed: Iterable[str]) -> dict[str, object]:
    """The result handler's config as a JSON object ("" = {}), refusing keys outside `allowed`."""
    return _config.parse_config(plugin, config_json, allowed, PluginFailed)


def decoded_output(plugin: str, index: int, output: bytes) -> object:
    """The value of output `index`; `PluginFailed` if the bytes are not msgpack."""
    try:
        return decode_value(output)
    except VALUE_ERRORS as error:
        raise PluginFailed(
            message=f"{plugin}: output {index} is not a msgpack value ({error})"
        ) from error


BYTES_KEY: Final = "$bytes"


def json_ready(value: object) -> object:
    """`value` with bytes replaced by `{"$bytes": <base64>}`; TypeError for what JSON lacks.

    A walk rather than json's `default` hook: `default` never sees tuple
    subclasses such as msgpack's ExtType, and would write them as arrays.
    """
    if value is None or isinstance(value, str | int | float):
        return value
    if isinstance(value, bytes):
        return {BYTES_KEY: base64.b64encode(value).decode("ascii")}
    if type(value) is list:
        return [json_ready(item) for item in value]
    if type(value) is dict:
        return {key: json_ready(item) for key, item in value.items()}
    raise TypeError(f"values of type {type(value).__name__} have no JSON form")
