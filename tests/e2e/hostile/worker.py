"""One `python -m blockx serve` process shared by a test module, driven from plain threads.

Blocking on purpose: the process outlives every test (and every Hypothesis example)
of its module, so a module fixture starts it with `subprocess.Popen`, a thread reads
its log, and requests go out through grpcio. Its executors' runtime directory is
under the test's temporary directory, to be found and attacked.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import attrs

from tests.e2e.hostile.strategies import WORKER_SETTINGS
from tests.e2e.serve_process import EXAMPLES, READY_LINE, REPO, START_TIMEOUT_S, free_port

STOP_TIMEOUT_S = 30


@attrs.define
class WorkerProcess:
    process: subprocess.Popen[bytes]
    port: int
    runtime_parent: Path
    """Where the worker makes its executors' private runtime directory."""
    log: list[str] = attrs.field(factory=list)
    changed: threading.Condition = attrs.field(factory=threading.Condition)
    """Notified with every line logged, and when the log ends."""
    ended: bool = False

    def wait_for_line(self, text: str, *, after: int = 0, timeout_s: float = 10.0) -> str:
        """The first line from index `after` on that contains `text`, once it is logged."""
        with self.changed:
            found = self.changed.wait_for(
                lambda: self.ended or any(text in line for line in self.log[after:]),
                timeout=timeout_s,
            )
            lines = [line for line in self.log[after:] if text in line]
        assert found, f"no line with {text!r} within {timeout_s} s"
        assert lines, f"the worker's log ended without a line with {text!r}"
        return lines[0]

    def bad_lines(self, after: int = 0) -> list[str]:
        """Lines from index `after` on logged at ERROR or above, or holding a traceback."""
        return [
            line
            for line in self.log[after:]
            if '"level": "ERROR"' in line or '"level": "CRITICAL"' in line or "Traceback" in line
        ]

    def rss_bytes(self) -> int:
        """The worker process's resident set size now (VmRSS)."""
        for line in Path(f"/proc/{self.process.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
        raise AssertionError("no VmRSS in /proc/<pid>/status")

    def runtime_dir(self) -> Path:
        """The executors' runtime directory: the one the worker made under `runtime_parent`."""
        (made,) = self.runtime_parent.iterdir()
        return made


def _read_log(worker: WorkerProcess) -> None:
    assert worker.process.stderr is not None
    for raw in worker.process.stderr:
        with worker.changed:
            worker.log.append(raw.decode(errors="replace").rstrip("\n"))
            worker.changed.notify_all()
    with worker.changed:
        worker.ended = True
        worker.changed.notify_all()


@contextmanager
def worker_process(directory: Path) -> Iterator[WorkerProcess]:
    """A worker with `WORKER_SETTINGS` on a free loopback port, ready; killed on exit."""
    runtime_parent = directory / "run"
    runtime_parent.mkdir()
    config = directory / "worker.json"
    config.write_text(json.dumps({**WORKER_SETTINGS, "executorRuntimeDir": str(runtime_parent)}))
    port = free_port()
    command = [sys.executable, "-m", "blockx", "serve", "--listen", f"127.0.0.1:{port}"]
    environment = {
        **os.environ,
        "WORKER_CONFIG": str(config),
        "FUNCTIONS_DIR": str(EXAMPLES),
        "METRICS_LISTEN": "127.0.0.1:0",
        "ETCD_ENDPOINTS": "none",
    }
    process = subprocess.Popen(
        command,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env=environment,
        cwd=REPO,
    )
    worker = WorkerProcess(process=process, port=port, runtime_parent=runtime_parent)
    reader = threading.Thread(target=_read_log, args=(worker,), name="worker-log", daemon=True)
    reader.start()
    try:
        worker.wait_for_line(READY_LINE, timeout_s=START_TIMEOUT_S)
        yield worker
        assert process.poll() is None, f"the worker exited with {process.returncode}"
    finally:
        process.terminate()  # a polite stop: it drains and exits
        try:
            process.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        reader.join(timeout=STOP_TIMEOUT_S)
        assert process.stderr is not None
        process.stderr.close()
