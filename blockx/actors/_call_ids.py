"""Call ids as the dispatch core knows them, and back.

Executors answer by call id, so the core needs ids unique across every task
it runs, while builders number each task's calls from 0. A task's calls are
known to the core as `<task id>#<run>:<call id>`, the run counting up, so even
a later run of the same task id never meets a late answer of an earlier one;
the dispatcher hands the core that prefix with the calls (`CallsAdded.id_prefix`),
which puts it before each id as it books the call.
Subcall ids an executor makes are unique only within that process: the core
knows them as `<executor>#<pid>:<subcall id>` and they go back to the
executor as they came.
"""

from __future__ import annotations

import itertools


class CallIds:
    def __init__(self) -> None:
        self._runs = itertools.count()
        self._subcalls: dict[str, str] = {}  # core id -> the executor's subcall id

    def run_prefix(self, task_id: str) -> str:
        """What the core's ids of the calls of a new run of `task_id` start with."""
        return f"{task_id}#{next(self._runs)}:"

    def subcall(self, executor_id: str, pid: int, subcall_id: str) -> str:
        """The core's id of subcall `subcall_id` that process `pid` of `executor_id` made."""
        core_id = f"{executor_id}#{pid}:{subcall_id}"
        self._subcalls[core_id] = subcall_id
        return core_id

    def executor_subcall_id(self, core_id: str) -> str:
        """The executor's own id of a subcall, for its result (once: the mapping ends)."""
        return self._subcalls.pop(core_id, core_id)

    def forget_executor(self, executor_id: str, pid: int) -> None:
        """Process `pid` of `executor_id` is gone: its subcalls will never be answered."""
        stale = f"{executor_id}#{pid}:"
        for core_id in [core_id for core_id in self._subcalls if core_id.startswith(stale)]:
            del self._subcalls[core_id]
