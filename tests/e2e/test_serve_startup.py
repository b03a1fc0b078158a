"""`python -m blockx serve` failing to start, or stopped while starting, as a newcomer sees it.

Every start-up failure is one line on stderr and a non-zero exit, before any
executor is started; a signal at any point of start-up stops the worker.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import trio

from tests.e2e.serve_process import EXAMPLES, REPO, free_port, runtime_dir_config

FAIL_AFTER_S = 30


def serve_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    """The environment of a worker whose runtime directory is under `tmp_path/run`."""
    config, _ = runtime_dir_config(tmp_path)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("WORKER_", "METRICS_"))}
    env.update(
        WORKER_CONFIG=str(config),
        METRICS_LISTEN="127.0.0.1:0",
        ETCD_ENDPOINTS="none",
        EXECUTOR_COUNT="1",
    )
    env.update(extra)
    return env


def run_serve(
    *args: str, env: dict[str, str], cwd: Path = REPO
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "blockx", "serve", *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=cwd,
        check=False,
        timeout=FAIL_AFTER_S,
    )


@contextmanager
def taken_port() -> Iterator[int]:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        yield int(holder.getsockname()[1])


def test_a_busy_port_fails_at_once_in_one_line(tmp_path: Path) -> None:
    with taken_port() as port:
        done = run_serve(
            "--listen", f"127.0.0.1:{port}", "--functions", str(EXAMPLES), env=serve_env(tmp_path)
        )
    assert done.returncode == 1
    assert done.stderr.splitlines() == [
        f"blockx: cannot listen on 127.0.0.1:{port}: address already in use"
    ]
    assert list((tmp_path / "run").iterdir()) == []  # no executor was started


def test_a_busy_metrics_port_fails_at_once_naming_its_setting(tmp_path: Path) -> None:
    with taken_port() as port:
        env = serve_env(tmp_path, METRICS_LISTEN=f"127.0.0.1:{port}")
        done = run_serve(
            "--listen", f"127.0.0.1:{free_port()}", "--functions", str(EXAMPLES), env=env
        )
    assert done.returncode == 1
    assert done.stderr.splitlines() == [
        f"blockx: cannot listen on 127.0.0.1:{port}: address already in use "
        "(the metrics port: set METRICS_LISTEN to another address, or to none)"
    ]
    assert list((tmp_path / "run").iterdir()) == []


def test_an_executor_interpreter_that_cannot_run_fails_at_once(tmp_path: Path) -> None:
    config = tmp_path / "python.json"
    config.write_text(json.dumps({"executorPython": str(tmp_path / "no-python")}))
    env = serve_env(tmp_path)
    env["WORKER_CONFIG"] = str(config)
    done = run_serve("--listen", f"127.0.0.1:{free_port()}", "--functions", str(EXAMPLES), env=env)
    assert done.returncode == 1
    assert done.stderr.splitlines() == [
        f"blockx: cannot start executors: executorPython '{tmp_path}/no-python' is not an "
        "executable file"
    ]


def test_serve_outside_the_checkout_says_where_it_looked_for_function_code(
    tmp_path: Path,
) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = serve_env(tmp_path, PYTHONPATH=str(REPO))
    done = run_serve("--listen", f"127.0.0.1:{free_port()}", env=env, cwd=elsewhere)
    assert done.returncode == 1
    [line] = done.stderr.splitlines()
    assert line.startswith(f"blockx: cannot read function code from {elsewhere}/examples/functions")
    assert "not a directory" in line
    assert "--functions DIR" in line


def test_a_wrong_functions_flag_fails_at_once(tmp_path: Path) -> None:
    missing = tmp_path / "no-such-dir"
    done = run_serve(
        "--listen", f"127.0.0.1:{free_port()}", "--functions", str(missing), env=serve_env(tmp_path)
    )
    assert done.returncode == 1
    [line] = done.stderr.splitlines()
    assert line.startswith(f"blockx: cannot read function code from {missing}: ")


async def test_the_first_signal_stops_a_worker_still_waiting_for_its_code(tmp_path: Path) -> None:
    """Function code from a Redis that is not there yet: the worker waits for it, says so,
    and the first Ctrl-C stops it."""
    env = serve_env(
        tmp_path, FUNCTIONS_REDIS_URL=f"redis://127.0.0.1:{free_port()}/0", LOG_FORMAT="text"
    )
    command = [sys.executable, "-m", "blockx", "serve", "--listen", f"127.0.0.1:{free_port()}"]
    lines: list[str] = []
    waiting = trio.Event()

    async def read_lines(stream: trio.abc.ReceiveStream) -> None:
        buffer = b""
        async for chunk in stream:
            *complete, buffer = (buffer + chunk).split(b"\n")
            lines.extend(line.decode() for line in complete)
            if any("no function code yet" in line for line in lines):
                waiting.set()

    with trio.fail_after(FAIL_AFTER_S):
        process = await trio.lowlevel.open_process(
            command, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, env=env, cwd=REPO
        )
        assert process.stderr is not None
        async with trio.open_nursery() as nursery:
            nursery.start_soon(read_lines, process.stderr)
            await waiting.wait()
            process.send_signal(signal.SIGINT)
            code = await process.wait()
    assert code == 0, lines
    [waited] = [line for line in lines if "no function code yet" in line]
    assert "Redis at redis://127.0.0.1:" in waited, waited
    assert any("worker stopped during start-up" in line for line in lines), lines
    assert not any("exiting at once" in line for line in lines), lines
    assert list((tmp_path / "run").iterdir()) == []


def test_a_hub_the_node_cannot_use_stops_the_start_in_one_line_naming_its_setting(
    tmp_path: Path,
) -> None:
    token = tmp_path / "node.token"
    token.write_text("")
    cases = [
        (["--hub-credential-file", str(tmp_path / "missing")], "hubCredentialFile = "),
        (["--hub-credential-file", str(token)], "hubCredentialFile = "),
        (["--hub-queue", ""], "hubQueue = ''"),
    ]
    for flags, named in cases:
        base = ["--hub", "http://127.0.0.1:9", "--hub-queue", "q"]
        base += ["--hub-credential-file", str(token)]
        done = run_serve(
            "--listen",
            "127.0.0.1:0",
            "--functions",
            str(EXAMPLES),
            *base,
            *flags,
            env=serve_env(tmp_path),
        )
        assert done.returncode == 1, flags
        [line] = done.stderr.splitlines()
        assert line.startswith(f"blockx: error: {named}"), line
