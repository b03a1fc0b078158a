"""The phases of a task that builders and plugins fill in.

`builders/` turn a task's payload into calls; `plugins/` store the outputs of
the calls (the third phase, Plugin). What both share lives here: the
name -> implementation registry, the phase error, and reading the JSON a task
hands them. The calls phase itself is the dispatch core (`blockx.dispatch`).
"""

from blockx.phases._registry import DuplicateName, PhaseFailed, Registry, UnknownName

__all__ = ["DuplicateName", "PhaseFailed", "Registry", "UnknownName"]
