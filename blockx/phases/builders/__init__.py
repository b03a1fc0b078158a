"""Builders: turn a task's function call and payload into the task's calls.

A worker assembles its `BuilderRegistry` once, from names (`builder_registry`);
the task actor looks the task's function-call type up in it and awaits
`build`. A builder refuses a bad payload or config with `BuilderFailed`, whose
message names the part that is wrong. Builders never run calls.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Final

from blockx.phases._registry import select
from blockx.phases.builders._bundle_scan import BundleScanBuilder
from blockx.phases.builders._call_list import CallListBuilder, call_list_calls
from blockx.phases.builders._dbscan import DbscanBuilder
from blockx.phases.builders._model import (
    Builder,
    BuilderFailed,
    BuilderRegistry,
    BuildRequest,
    InlineBuilder,
    StreamingBuilder,
    collect,
)
from blockx.phases.builders._stubs import PayloadBuilder, StaticBuilder

_FACTORIES: Final[Mapping[str, Callable[[], Builder]]] = {
    "call_list": CallListBuilder,
    "dbscan": DbscanBuilder,
    "bundle_scan": BundleScanBuilder,
    "static": StaticBuilder,
    "payload": PayloadBuilder,
}

KNOWN_BUILDERS: Final[tuple[str, ...]] = tuple(_FACTORIES)
"""Every builder name `builder_registry` accepts: call_list, dbscan, bundle_scan, static,
payload (and their camelCase aliases, `blockx.phases.CAMEL_CASE_ALIASES`)."""


def builder_registry(names: Iterable[str]) -> BuilderRegistry:
    """A registry of the named builders; `UnknownName` if a name is not in `KNOWN_BUILDERS`."""
    return BuilderRegistry(select(BuilderRegistry.kind, names, _FACTORIES))


__all__ = [
    "KNOWN_BUILDERS",
    "BuildRequest",
    "Builder",
    "BuilderFailed",
    "BuilderRegistry",
    "BundleScanBuilder",
    "CallListBuilder",
    "DbscanBuilder",
    "InlineBuilder",
    "PayloadBuilder",
    "StaticBuilder",
    "StreamingBuilder",
    "builder_registry",
    "call_list_calls",
    "collect",
]
