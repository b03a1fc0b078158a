"""Process-wide settings that blockx's own processes apply at start, and their RSS.

Only entry points call `tune_gc` (the executor child, the worker command, the
benches): a library must never change its host process's settings.
"""

import gc
import os
import resource

# Calls allocate many short-lived, acyclic objects; the default collects the
# young generation every 700 allocations, which costs blockx's processes a
# large share of their time at high call rates.
YOUNG_GENERATION_THRESHOLD = 20_000


def tune_gc() -> None:
    """Collect the young generation far less often than the default."""
    gc.set_threshold(YOUNG_GENERATION_THRESHOLD, 20, 20)


def rss_bytes() -> int:
    """This process's resident set size; its peak where there is no procfs."""
    try:
        with open("/proc/self/statm", "rb") as statm:
            resident_pages = int(statm.read().split()[1])
        return resident_pages * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):  # no procfs: the peak is the best we have
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
