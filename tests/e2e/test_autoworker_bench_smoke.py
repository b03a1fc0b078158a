"""bench/autoworker.py with `--dashboard`, small, so that it cannot rot: it passes, checks
every task and the hub's metrics, and reports every figure, the dashboard's included.

The real run takes minutes; this only shows that it still starts a hub and two
automatic workers, runs tasks with and without an open dashboard (signed in, its
event stream ticking), and accounts for every task (it exits non-zero otherwise).
"""

from __future__ import annotations

from tests.e2e.processes import run_bench

RUN_TIMEOUT_S = 120
SMALL = ("--tasks", "100", "--latency-tasks", "5", "--clients", "4", "--dashboard")


async def test_a_small_run_with_an_open_dashboard_accounts_for_every_task() -> None:
    run = await run_bench("bench/autoworker.py", *SMALL, timeout_s=RUN_TIMEOUT_S)
    figures = run.figures
    assert figures["metrics_agree"] == 1
    assert figures["auto_tasks_per_s"] > 0
    assert figures["dashboard_off_tasks_per_s"] > 0
    assert figures["dashboard_on_tasks_per_s"] > 0
    assert figures["dashboard_throughput_ratio"] > 0
    assert figures["dashboard_ticks"] >= 3  # at least the first tick of each open round
