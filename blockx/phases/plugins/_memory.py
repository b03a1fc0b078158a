"""The `test` plugin (development stub): keeps decoded outputs in memory.

The store is module-level on purpose, an exception to "no global mutable
state": an end-to-end test reads what a task wrote through `test_outputs`
without reaching into the worker's objects. It is bounded (the last
`TEST_STORE_TASKS` tasks; the oldest is dropped) and touched only from the
Trio thread. Config `{"fail": true, "message": ..., "retryable": ...,
"code": ...}` makes the plugin fail instead, to test failure handling (the
code is one of `blockx.calls.FailureCode`), and
`{"delay_ms": N}` makes it take N ms first, to try the phase IO timeout.
"""

from __future__ import annotations

import collections
from typing import Final

import trio

from blockx.calls import FailureCode
from blockx.errors import shown
from blockx.phases._config import config_integer
from blockx.phases.plugins._model import (
    PluginFailed,
    PluginRequest,
    decoded_output,
    parse_config,
)
from blockx.slots import PluginResult

NAME: Final = "test"
TEST_STORE_TASKS: Final = 1000
DEFAULT_FAILURE: Final = "test plugin configured to fail"
MAX_DELAY_MS: Final = 86_400_000
"""A day: longer than any phase IO timeout, and small enough to be a sleep (a larger JSON
integer has no float form)."""

_stored: collections.OrderedDict[str, tuple[object, ...]] = collections.OrderedDict()


def test_outputs(task_id: str) -> list[object] | None:
    """The decoded outputs the `test` plugin kept for `task_id`, or None.

    Import it under another name in a test module (pytest would collect a
    function named `test_*`).
    """
    outputs = _stored.get(task_id)
    return None if outputs is None else list(outputs)


def _flag(config: dict[str, object], key: str) -> bool:
    value = config.get(key, False)
    if not isinstance(value, bool):
        raise PluginFailed(
            message=f"{NAME}: config_json.{key} must be true or false, got {shown(value)}"
        )
    return value


def _text(config: dict[str, object], key: str, default: str) -> str:
    value = config.get(key, default)
    if not isinstance(value, str) or not value:
        raise PluginFailed(
            message=f"{NAME}: config_json.{key} must be a non-empty string, got {shown(value)}"
        )
    return value


def _code(config: dict[str, object]) -> FailureCode:
    value = _text(config, "code", FailureCode.PLUGIN_FAILED)
    try:
        return FailureCode(value)
    except ValueError:
        raise PluginFailed(
            message=f"{NAME}: config_json.code must be a failure code such as "
            f"{FailureCode.PLUGIN_FAILED.value}, got {shown(value)}"
        ) from None


class MemoryPlugin:
    """Keeps each task's decoded outputs in memory for `test_outputs` (development stub)."""

    name: Final = NAME
    usage: Final = (
        "no config needed: keeps the outputs in the worker's memory for tests "
        '(optional {"fail": true, "message": "...", "code": "...", "retryable": true, '
        '"delay_ms": N})'
    )

    async def run(self, request: PluginRequest) -> PluginResult:
        config, delay_ms = _config(request)
        await trio.sleep(delay_ms / 1000)
        return _store(request, config)

    def run_now(self, request: PluginRequest) -> PluginResult | None:
        """`run` in the caller's step (`InlinePlugin`); declined when a delay is configured."""
        config, delay_ms = _config(request)
        return _store(request, config) if delay_ms == 0 else None


def _config(request: PluginRequest) -> tuple[dict[str, object], int]:
    """The handler's config, every key checked before any delay, and its delay in ms."""
    config = parse_config(
        NAME, request.handler.config_json, ("fail", "message", "retryable", "code", "delay_ms")
    )
    delay_ms = config_integer(NAME, config, "delay_ms", (0, 0, MAX_DELAY_MS), PluginFailed)
    _code(config)
    return config, delay_ms


def _store(request: PluginRequest, config: dict[str, object]) -> PluginResult:
    """Fail as configured, or keep the decoded outputs."""
    if _flag(config, "fail"):
        raise PluginFailed(
            message=_text(config, "message", DEFAULT_FAILURE),
            code=_code(config),
            retryable=_flag(config, "retryable"),
        )
    values = tuple(
        decoded_output(NAME, index, output) for index, output in enumerate(request.outputs)
    )
    _stored.pop(request.task_id, None)
    _stored[request.task_id] = values
    while len(_stored) > TEST_STORE_TASKS:
        _stored.popitem(last=False)
    return PluginResult(plugin_type=NAME, ok=True, records_written=len(values))
