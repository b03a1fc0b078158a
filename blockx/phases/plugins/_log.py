"""The `log` plugin: one log line per task, through the stdlib logger `blockx.plugins.log`.

It stores nothing; it shows how many outputs a task produced, their size, and
a truncated preview of the first few values. A preview never fails the task.
"""

from __future__ import annotations

import logging
from typing import Final

from blockx.phases.plugins._model import PluginFailed, PluginRequest, decoded_output, parse_config
from blockx.slots import PluginResult

NAME: Final = "log"
PREVIEW_VALUES: Final = 3
PREVIEW_CHARS: Final = 200
"""Longest shown rendering of one value."""

logger = logging.getLogger("blockx.plugins.log")


def _preview(request: PluginRequest) -> str:
    shown: list[str] = []
    for index, output in enumerate(request.outputs[:PREVIEW_VALUES]):
        try:
            text = repr(decoded_output(NAME, index, output))
        except PluginFailed:
            text = f"<{len(output)} bytes that are not msgpack>"
        if len(text) > PREVIEW_CHARS:
            text = text[: PREVIEW_CHARS - 3] + "..."
        shown.append(text)
    if len(request.outputs) > PREVIEW_VALUES:
        shown.append("...")
    return "[" + ", ".join(shown) + "]"


class LogPlugin:
    """Logs a summary of each task's outputs at INFO."""

    name: Final = NAME
    usage: Final = "no config: logs how many outputs there were and a preview of them"

    async def run(self, request: PluginRequest) -> PluginResult:
        return self.run_now(request)

    def run_now(self, request: PluginRequest) -> PluginResult:
        """The same line, in the caller's step: it never blocks (`InlinePlugin`)."""
        parse_config(NAME, request.handler.config_json, ())
        if logger.isEnabledFor(logging.INFO):
            logger.info(
                "task %s: %d outputs, %d bytes: %s",
                request.task_id,
                len(request.outputs),
                sum(len(output) for output in request.outputs),
                _preview(request),
            )
        return PluginResult(plugin_type=NAME, ok=True, records_written=len(request.outputs))
