"""The phases of a task that builders and plugins fill in.

`builders/` turn a task's payload into calls; `plugins/` store the outputs of
the calls (the third phase, Plugin). What both share lives here: the
name -> implementation registry (with the camelCase aliases of the names,
`CAMEL_CASE_ALIASES`), the phase error, and reading the JSON a task hands them.
The calls phase itself is the dispatch core (`blockx.dispatch`).
"""

from blockx.phases._registry import (
    CAMEL_CASE_ALIASES,
    DuplicateName,
    PhaseFailed,
    Registry,
    UnknownName,
    our_name,
    spelled,
)

__all__ = [
    "CAMEL_CASE_ALIASES",
    "DuplicateName",
    "PhaseFailed",
    "Registry",
    "UnknownName",
    "our_name",
    "spelled",
]
