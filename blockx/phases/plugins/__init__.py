"""Writer plugins: store the outputs of a task's calls where its result handler says.

A worker assembles its `WriterRegistry` once, from names (`writer_registry`);
the task actor looks the result handler's type up in it and awaits `write`.
A writer that cannot store the outputs raises `WriterFailed`, whose message
names what is wrong and whose `retryable` says whether trying again may help.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Final

from blockx.phases.plugins._jsonl import JsonlWriter
from blockx.phases.plugins._log import LogWriter
from blockx.phases.plugins._memory import TEST_STORE_TASKS, MemoryWriter, test_outputs
from blockx.phases.plugins._model import Writer, WriteRequest, WriterFailed, WriterRegistry
from blockx.phases.plugins._registry import (
    DuplicatePlugin,
    PhaseFailed,
    UnknownPlugin,
    select_plugins,
)

_FACTORIES: Final[Mapping[str, Callable[[], Writer]]] = {
    "log": LogWriter,
    "test": MemoryWriter,
    "jsonl": JsonlWriter,
}

KNOWN_WRITERS: Final[tuple[str, ...]] = tuple(_FACTORIES)
"""Every writer name `writer_registry` accepts: log, test, jsonl."""


def writer_registry(names: Iterable[str]) -> WriterRegistry:
    """A registry of the named writers; `UnknownPlugin` if a name is not in `KNOWN_WRITERS`."""
    return WriterRegistry(select_plugins(WriterRegistry.kind, names, _FACTORIES))


__all__ = [
    "KNOWN_WRITERS",
    "TEST_STORE_TASKS",
    "DuplicatePlugin",
    "JsonlWriter",
    "LogWriter",
    "MemoryWriter",
    "PhaseFailed",
    "UnknownPlugin",
    "WriteRequest",
    "Writer",
    "WriterFailed",
    "WriterRegistry",
    "test_outputs",
    "writer_registry",
]
