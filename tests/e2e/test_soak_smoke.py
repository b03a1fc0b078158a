"""bench/soak.py for a few seconds, so that it cannot rot: it passes and reports its figures.

The real soak runs for minutes (`nox -s soak`); this only shows that the script
still drives a worker through every kind of operation and closes its books.
"""

from __future__ import annotations

import re

from tests.e2e.processes import run_bench

RUN_TIMEOUT_S = 60


async def test_a_short_soak_accounts_for_every_task() -> None:
    run = await run_bench(
        "bench/soak.py", "--duration", "5", "--clients", "4", timeout_s=RUN_TIMEOUT_S
    )
    figures = run.figures
    assert figures["tasks_total"] > 0
    assert figures["tasks_per_s"] > 0
    for name in ("unaccounted_tasks", "leaked_slots", "errors_unexpected", "executor_restarts"):
        assert figures[name] == 0, name
    assert figures["errors_total"] == sum(
        figures[f"errors_{kind}"]
        for kind in (
            "lapsed_lease",
            "lapsed_lease_reclaiming",
            "watch_cancelled",
            "stream_abandoned",
        )
    )
    for name in ("rss_start_mb", "rss_end_mb", "rss_growth_mb", "rss_slope_mb_per_min"):
        assert name in figures
    assert re.search(
        r"^SAMPLE t=\d+ tasks=\d+ tasks_per_s=[0-9.]+ rss_mb=[0-9.]+ ", run.output, re.M
    )
