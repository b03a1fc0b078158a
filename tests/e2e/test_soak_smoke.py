"""bench/soak.py for a few seconds, so that it cannot rot: it passes and reports its figures.

The real soak runs for minutes (`nox -s soak`); this only shows that the script
still drives a worker through every kind of operation and closes its books.
"""

from __future__ import annotations

import re
import subprocess
import sys

import trio

from tests.e2e.serve_process import REPO

RUN_TIMEOUT_S = 60
RESULT_LINE = re.compile(r"^RESULT name=(\w+) value=(-?[0-9.]+)$", re.MULTILINE)


async def test_a_short_soak_accounts_for_every_task() -> None:
    with trio.fail_after(RUN_TIMEOUT_S):
        done: subprocess.CompletedProcess[bytes] = await trio.run_process(
            [sys.executable, "bench/soak.py", "--duration", "5", "--clients", "4"],
            cwd=REPO,
            capture_stdout=True,
            capture_stderr=True,
            check=False,
        )
    output = done.stdout.decode()
    assert done.returncode == 0, output + done.stderr.decode()
    figures = {name: float(value) for name, value in RESULT_LINE.findall(output)}
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
    assert re.search(r"^SAMPLE t=\d+ tasks=\d+ tasks_per_s=[0-9.]+ rss_mb=[0-9.]+ ", output, re.M)
