"""An HTTP/2 rapid-reset flood (CVE-2023-44487) on a real worker, with and without its
connection limits.

    uv run python -m bench.rapid_reset [--pairs 20000] [--linger 5]

Each arm starts `python -m blockx serve` (1 executor), lets it idle for a second,
then writes `--pairs` HEADERS + RST_STREAM pairs on one raw HTTP/2 connection as fast
as it can (`tests.raw_http2.reset_flood`) and waits up to `--linger` seconds for the
worker to end the connection. The baseline arm lifts the limits (grpcMaxResets and
grpcMaxConcurrentStreams at 10**9: the worker as it was before it had them); the
other runs the defaults. Per arm:

* <arm>_kept_s: the first pair written -> the connection's end as the flood saw it;
  the whole flood and the lingering if the worker never ended it (then <arm>_dropped 0).
* <arm>_pairs_written: pairs written before the end was seen (the socket's buffers
  hold what the worker never read).
* <arm>_cpu_s: the worker's CPU from before the flood until its CPU stops rising.
* <arm>_rss_before_mb / <arm>_rss_after_mb: the worker's RSS then, in MiB.
"""

from __future__ import annotations

import argparse
import subprocess
import threading
import time

from bench.serve import READY_LINE, REPO, WORKER_ENV, cpu_s, free_port, result, rss_mib
from bench.serve import worker_command as serve_command
from tests.raw_http2 import reset_flood

LIFTED = {"WORKER_GRPC_MAX_RESETS": str(10**9), "WORKER_GRPC_MAX_CONCURRENT_STREAMS": str(10**9)}
IDLE_S = 1.0
SETTLE_S = 0.5
"""The worker's CPU is read again until it has not risen for this long."""


def start_worker(env: dict[str, str]) -> tuple[subprocess.Popen[bytes], int]:
    port = free_port()
    process = subprocess.Popen(
        serve_command(port, executors=1),
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        cwd=REPO,
        env={**WORKER_ENV, **env},
    )
    assert process.stderr is not None
    for line in process.stderr:
        if READY_LINE.encode() in line:
            break
    else:
        raise SystemExit("the worker exited before it was ready")
    drain = threading.Thread(target=process.stderr.read, daemon=True)  # never a full pipe
    drain.start()
    return process, port


def cpu_now(pid: int) -> float:
    used = cpu_s(pid)
    assert used is not None, "the worker exited"
    return used


def settled_cpu(pid: int) -> float:
    """The worker's CPU once it has stopped rising."""
    last = cpu_now(pid)
    while True:
        time.sleep(SETTLE_S)
        now = cpu_now(pid)
        if now == last:
            return now
        last = now


def arm(name: str, env: dict[str, str], pairs: int, linger_s: float) -> None:
    process, port = start_worker(env)
    try:
        time.sleep(IDLE_S)
        cpu_before, rss_before = cpu_now(process.pid), rss_mib(process.pid)
        flood = reset_flood(port, pairs, linger_s=linger_s)
        cpu_used = settled_cpu(process.pid) - cpu_before
        result(f"{name}_dropped", float(flood.end is not None), 0)
        result(f"{name}_kept_s", flood.seconds, 3)
        result(f"{name}_pairs_written", flood.sent, 0)
        result(f"{name}_cpu_s", cpu_used, 2)
        result(f"{name}_rss_before_mb", rss_before, 1)
        result(f"{name}_rss_after_mb", rss_mib(process.pid), 1)
    finally:
        process.kill()
        process.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", type=int, default=20_000)
    parser.add_argument("--linger", type=float, default=5.0, help="seconds")
    args = parser.parse_args()
    arm("baseline", LIFTED, args.pairs, args.linger)
    arm("limits", {}, args.pairs, args.linger)


if __name__ == "__main__":
    main()
