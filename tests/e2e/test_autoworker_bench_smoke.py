"""bench/autoworker.py with `--dashboard`, small, so that it cannot rot: it passes, checks
every task and the hub's metrics, and reports every figure, the dashboard's included.

The real run takes minutes; this only shows that it still starts a hub and two
automatic workers, runs tasks with and without an open dashboard (signed in, its
event stream ticking), and accounts for every task (it exits non-zero otherwise).
"""

from __future__ import annotations

import re
import subprocess
import sys

import trio

from tests.e2e.serve_process import REPO

RUN_TIMEOUT_S = 120
RESULT_LINE = re.compile(r"^RESULT name=(\w+) value=(-?[0-9.]+)$", re.MULTILINE)
SMALL = ("--tasks", "100", "--latency-tasks", "5", "--clients", "4", "--dashboard")


async def test_a_small_run_with_an_open_dashboard_accounts_for_every_task() -> None:
    with trio.fail_after(RUN_TIMEOUT_S):
        done: subprocess.CompletedProcess[bytes] = await trio.run_process(
            [sys.executable, "bench/autoworker.py", *SMALL],
            cwd=REPO,
            capture_stdout=True,
            capture_stderr=True,
            check=False,
        )
    output = done.stdout.decode()
    assert done.returncode == 0, output + done.stderr.decode()
    figures = {name: float(value) for name, value in RESULT_LINE.findall(output)}
    assert figures["metrics_agree"] == 1
    assert figures["auto_tasks_per_s"] > 0
    assert figures["dashboard_off_tasks_per_s"] > 0
    assert figures["dashboard_on_tasks_per_s"] > 0
    assert figures["dashboard_throughput_ratio"] > 0
    assert figures["dashboard_ticks"] >= 3  # at least the first tick of each open round
