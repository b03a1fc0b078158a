"""Process-wide matters: settings blockx's own processes apply at start, their RSS, the
private directories to remove even on an exit at once, and unwrapping a lone error.

Only entry points call `tune_gc` (the executor child, the worker command, the
benches): a library must never change its host process's settings.
"""

import compileall
import contextlib
import gc
import os
import resource
import shutil
import sys
from collections.abc import Iterator

# Calls allocate many short-lived, acyclic objects; the default collects the
# young generation every 700 allocations, which costs blockx's processes a
# large share of their time at high call rates.
YOUNG_GENERATION_THRESHOLD = 20_000


def cache_own_bytecode(root: str | None = None) -> None:
    """Write blockx's own bytecode cache when Python will not (PYTHONDONTWRITEBYTECODE).

    Without a cache every start compiles every module again, the worker's and each
    executor's: about half a second of a start. `uv sync --compile-bytecode`
    caches the installed packages; blockx runs from its checkout, which no install
    step compiles, so the entry point does (about 4 ms when the cache is current; a
    tree that cannot be written is left as it is). `root`: another tree (tests)."""
    if sys.dont_write_bytecode:
        package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # blockx/
        compileall.compile_dir(root or package, quiet=2)


def tune_gc() -> None:
    """Collect the young generation far less often than the default, and leave what exists
    now (the modules, classes and functions imported at start) out of every later
    collection: they live as long as the process, and a full collection then only walks
    what was made since (`blockx.app` runs one on a clock)."""
    gc.set_threshold(YOUNG_GENERATION_THRESHOLD, 20, 20)
    gc.freeze()


def rss_bytes() -> int:
    """This process's resident set size; its peak where there is no procfs."""
    try:
        with open("/proc/self/statm", "rb") as statm:
            resident_pages = int(statm.read().split()[1])
        return resident_pages * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):  # no procfs: the peak is the best we have
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


_private_dirs: set[str] = set()
"""Directories this process made for itself (the executors' runtime directory). Module
state on purpose, like `atexit`: the exit-at-once path has no other way to reach them."""


def add_private_dir(path: str) -> None:
    """Remember `path` so that `remove_private_dirs` removes it."""
    _private_dirs.add(path)


def discard_private_dir(path: str) -> None:
    """Forget `path` (its owner removed it)."""
    _private_dirs.discard(path)


def remove_private_dirs() -> None:
    """Remove every remembered directory: the last thing before `os._exit`."""
    for path in list(_private_dirs):
        shutil.rmtree(path, ignore_errors=True)
    _private_dirs.clear()


@contextlib.contextmanager
def lone_errors(kind: type[BaseException] = BaseException) -> Iterator[None]:
    """Re-raise an exception group that holds one exception of `kind` (nested groups
    included) as that exception: `trio.run` wraps what a nursery raised, and an error
    meant for the user (a BlockxError) must still end as one line."""
    try:
        yield
    except BaseExceptionGroup as group:
        error: BaseException = group
        while isinstance(error, BaseExceptionGroup) and len(error.exceptions) == 1:
            error = error.exceptions[0]
        if isinstance(error, BaseExceptionGroup) or not isinstance(error, kind):
            raise
        # `from` its own cause: the group is no context worth showing, but the
        # error a translated one was raised from is.
        raise error from error.__cause__
