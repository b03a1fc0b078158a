"""bench/fleet.py --quick, so that it cannot rot: it passes and reports every figure.

The bench itself runs for about a minute; this only shows that it still starts a
hub and two nodes fed by it, runs tasks both ways, and accounts for every one
of them (it exits non-zero otherwise).
"""

from __future__ import annotations

from tests.e2e.processes import run_bench

RUN_TIMEOUT_S = 120


async def test_a_quick_fleet_run_accounts_for_every_task() -> None:
    run = await run_bench("-m", "bench.fleet", "--quick", timeout_s=RUN_TIMEOUT_S)
    figures = run.figures
    for way in ("hub_fed", "direct"):
        assert figures[f"{way}_tasks_per_s"] > 0
        assert 0 < figures[f"{way}_p50_ms"] <= figures[f"{way}_p99_ms"]
    assert figures["hub_fed_ratio"] > 0
    assert figures["hub_fed_to_direct_p50"] > 0
