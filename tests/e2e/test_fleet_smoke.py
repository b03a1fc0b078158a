"""bench/fleet.py --quick, so that it cannot rot: it passes and reports every figure.

The bench itself runs for about a minute; this only shows that it still starts a
hub and two nodes fed by it, runs tasks both ways, and accounts for every one
of them (it exits non-zero otherwise).
"""

from __future__ import annotations

import re
import subprocess
import sys

import trio

from tests.e2e.serve_process import REPO

RUN_TIMEOUT_S = 120
RESULT_LINE = re.compile(r"^RESULT name=(\w+) value=(-?[0-9.]+)$", re.MULTILINE)


async def test_a_quick_fleet_run_accounts_for_every_task() -> None:
    with trio.fail_after(RUN_TIMEOUT_S):
        done: subprocess.CompletedProcess[bytes] = await trio.run_process(
            [sys.executable, "-m", "bench.fleet", "--quick"],
            cwd=REPO,
            capture_stdout=True,
            capture_stderr=True,
            check=False,
        )
    output = done.stdout.decode()
    assert done.returncode == 0, output + done.stderr.decode()
    figures = {name: float(value) for name, value in RESULT_LINE.findall(output)}
    for way in ("hub_fed", "direct"):
        assert figures[f"{way}_tasks_per_s"] > 0
        assert 0 < figures[f"{way}_p50_ms"] <= figures[f"{way}_p99_ms"]
    assert figures["hub_fed_ratio"] > 0
    assert figures["hub_fed_to_direct_p50"] > 0
