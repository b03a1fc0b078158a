"""The IO subsystem: per-task IO scopes over the worker's backends, with admission.

See `_scope` for the rules. The slot-table actor owns the opening and closing
of scopes; builders and writer plugins connect through the scope their
request carries.
"""

from __future__ import annotations

from blockx.io._scope import (
    BACKENDS,
    Connection,
    Connector,
    IOScopeError,
    IOSystem,
    TaskIOScope,
    shown_target,
)

__all__ = [
    "BACKENDS",
    "Connection",
    "Connector",
    "IOScopeError",
    "IOSystem",
    "TaskIOScope",
    "shown_target",
]
