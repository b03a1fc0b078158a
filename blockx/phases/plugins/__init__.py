"""Plugins: the third phase of a task, storing the outputs where its result handler says.

A worker assembles its `PluginRegistry` once, from names (`plugin_registry`);
the slot table looks the result handler's type up in it; the task actor awaits
`run`, unless the plugin is an `InlinePlugin`, whose `run_now` the slot table
calls in its own step. A
plugin that cannot store the outputs raises `PluginFailed`, whose message
names what is wrong and whose `retryable` says whether trying again may help.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Final

from blockx.phases._registry import select
from blockx.phases.plugins._bundle_write import BundleWritePlugin
from blockx.phases.plugins._jsonl import JsonlPlugin
from blockx.phases.plugins._log import LogPlugin
from blockx.phases.plugins._memory import TEST_STORE_TASKS, MemoryPlugin, test_outputs
from blockx.phases.plugins._model import (
    InlinePlugin,
    Plugin,
    PluginFailed,
    PluginRegistry,
    PluginRequest,
)
from blockx.phases.plugins._result import INLINE_OUTPUTS_BYTES, MAX_OUTPUTS_BYTES, ResultPlugin
from blockx.phases.plugins._table_upserts import TableUpsertsPlugin

_FACTORIES: Final[Mapping[str, Callable[[], Plugin]]] = {
    "log": LogPlugin,
    "test": MemoryPlugin,
    "jsonl": JsonlPlugin,
    "result": ResultPlugin,
    "table_upserts": TableUpsertsPlugin,
    "bundle_write": BundleWritePlugin,
}

KNOWN_PLUGINS: Final[tuple[str, ...]] = tuple(_FACTORIES)
"""Every plugin name `plugin_registry` accepts: log, test, jsonl, result, table_upserts,
bundle_write (and their camelCase aliases, `blockx.phases.CAMEL_CASE_ALIASES`)."""


def plugin_registry(names: Iterable[str]) -> PluginRegistry:
    """A registry of the named plugins; `UnknownName` if a name is not in `KNOWN_PLUGINS`."""
    return PluginRegistry(select(PluginRegistry.kind, names, _FACTORIES))


__all__ = [
    "INLINE_OUTPUTS_BYTES",
    "KNOWN_PLUGINS",
    "MAX_OUTPUTS_BYTES",
    "TEST_STORE_TASKS",
    "BundleWritePlugin",
    "InlinePlugin",
    "JsonlPlugin",
    "LogPlugin",
    "MemoryPlugin",
    "Plugin",
    "PluginFailed",
    "PluginRegistry",
    "PluginRequest",
    "ResultPlugin",
    "TableUpsertsPlugin",
    "plugin_registry",
    "test_outputs",
]
