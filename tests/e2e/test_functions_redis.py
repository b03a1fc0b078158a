"""Function code through a real `redis-server`: the publish command, `RedisSource`, the refresher.

Each test starts its own `redis-server` on a free loopback port with
persistence off and always stops it. A missing `redis-server` fails the test
(never skips it): CI installs it in `.ci/run`. Sleeps appear only while
polling a real process.
"""

from __future__ import annotations

import functools
import logging
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import attrs
import pytest
import redis
import trio

from blockx.config import default_config
from blockx.functions import (
    FunctionCodeView,
    FunctionSnapshot,
    NothingPublished,
    RedisSource,
    SourceUnavailable,
    content_epoch,
    run_code_refresher,
)

STARTUP_TIMEOUT_S = 10.0
V1 = {"demo": "def add(a, b):\n    return a + b\n", "text": "from . import demo\n"}
V2 = {"demo": "def add(a, b):\n    return a - b\n", "text": "from . import demo\n"}


@attrs.define
class RedisServer:
    process: subprocess.Popen[bytes]
    port: int
    log_path: Path

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def free_loopback_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def wait_until_ready(server: RedisServer) -> None:
    client = redis.Redis(port=server.port, socket_timeout=1, socket_connect_timeout=1)
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    try:
        while True:
            if server.process.poll() is not None:
                pytest.fail(f"redis-server exited at startup:\n{server.log_path.read_text()}")
            try:
                if client.ping():
                    return
            except redis.ConnectionError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"redis-server not ready after {STARTUP_TIMEOUT_S} s")
            time.sleep(0.05)
    finally:
        client.close()


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[RedisServer]:
    executable = shutil.which("redis-server")
    if executable is None:
        pytest.fail(
            "redis-server is not on PATH; the Redis function source is tested against a real "
            "server (apt-get install redis-server; CI installs it in .ci/run)"
        )
    port = free_loopback_port()
    log_path = tmp_path / "redis.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            [
                executable,
                "--port",
                str(port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--daemonize",
                "no",
                "--dir",
                str(tmp_path),
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
    server = RedisServer(process=process, port=port, log_path=log_path)
    try:
        wait_until_ready(server)
        yield server
    finally:
        server.stop()


def publish_command(directory: Path, url: str, *extra: str) -> list[str]:
    return [
        sys.executable, "-m", "blockx", "functions", "publish", str(directory),
        "--redis", url, *extra,
    ]  # fmt: skip


def publish(directory: Path, url: str, *extra: str) -> str:
    done = subprocess.run(
        publish_command(directory, url, *extra),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    return done.stdout.strip()


def write_modules(directory: Path, modules: dict[str, str]) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    for name, text in modules.items():
        (directory / f"{name}.py").write_text(text, encoding="utf-8")
    return directory


def test_published_directory_reads_back_through_redis_source(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    directory = write_modules(tmp_path / "functions", V1)
    source = RedisSource(redis_server.url)
    try:
        with pytest.raises(NothingPublished):
            source.current_epoch()

        old = publish(directory, redis_server.url)
        assert old == content_epoch(V1)
        assert source.current_epoch() == old
        assert dict(source.load(old).modules) == V1
        # Unchanged content: same epoch, nothing new.
        assert publish(directory, redis_server.url) == old

        write_modules(directory, V2)
        new = publish(directory, redis_server.url)

        assert new == content_epoch(V2)
        assert source.current_epoch() == new
        assert dict(source.load(new).modules) == V2
        assert dict(source.load(old).modules) == V1
    finally:
        source.close()

    raw = redis.Redis(port=redis_server.port, decode_responses=True)
    try:
        assert raw.get("blockx:functions:current") == new
        assert sorted(raw.keys("blockx:functions:*")) == sorted(
            [
                "blockx:functions:current",
                f"blockx:functions:snapshot:{old}",
                f"blockx:functions:snapshot:{new}",
            ]
        )
    finally:
        raw.close()


def test_publish_uses_the_given_prefix(redis_server: RedisServer, tmp_path: Path) -> None:
    directory = write_modules(tmp_path / "functions", V1)
    epoch = publish(directory, redis_server.url, "--prefix", "team-a:")
    source = RedisSource(redis_server.url, prefix="team-a:")
    default = RedisSource(redis_server.url)
    try:
        assert source.current_epoch() == epoch
        with pytest.raises(NothingPublished):
            default.current_epoch()
    finally:
        source.close()
        default.close()


def test_publish_reports_an_unreachable_redis_in_one_line(tmp_path: Path) -> None:
    directory = write_modules(tmp_path / "functions", V1)
    url = f"redis://127.0.0.1:{free_loopback_port()}/0"
    done = subprocess.run(
        publish_command(directory, url), capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 1
    assert done.stdout == ""
    assert len(done.stderr.splitlines()) == 1
    assert url in done.stderr


@pytest.mark.parametrize(
    "args",
    [
        ["functions", "publish"],
        ["functions", "publish", "DIR"],
        ["functions", "publish", "DIR", "--redis", "redis://x", "--bogus"],
        ["functions", "unpublish", "DIR"],
        [],
    ],
)
def test_publish_usage_errors_exit_2(args: list[str]) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "blockx", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2
    assert "usage:" in done.stderr


async def test_refresher_follows_redis_and_survives_its_outage(
    redis_server: RedisServer, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="blockx.functions")
    directory = write_modules(tmp_path / "functions", V1)
    old = publish(directory, redis_server.url)
    view = FunctionCodeView(default_config().code_view_config())
    source = RedisSource(redis_server.url, timeout_s=1.0)

    def clock_ms() -> int:
        return round(trio.current_time() * 1000)

    delivered: list[FunctionSnapshot] = []

    def deliver(snapshot: FunctionSnapshot) -> None:
        # As the slot table does with what the refresher delivers.
        delivered.append(snapshot)
        view.observe(snapshot, clock_ms())

    async def poll_until(condition_holds: Callable[[], bool]) -> None:
        while not condition_holds():
            await trio.sleep(0.02)

    try:
        with trio.fail_after(30):
            async with trio.open_nursery() as nursery:
                started: FunctionSnapshot = await nursery.start(
                    functools.partial(run_code_refresher, source, deliver, interval_s=0.05)
                )
                assert started.epoch == old
                assert started.modules == V1
                view.observe(started, clock_ms())
                assert view.pin("task-1", clock_ms()) == old

                write_modules(directory, V2)
                await trio.run_process(publish_command(directory, redis_server.url))
                new = content_epoch(V2)
                await poll_until(lambda: view.current_epoch == new)
                assert [snapshot.epoch for snapshot in delivered] == [new]

                # The task pinned before the change still reads the code it started with.
                assert view.pinned_epoch("task-1") == old
                assert view.module_source(old, "demo") == V1["demo"]
                assert view.module_source(new, "demo") == V2["demo"]

                redis_server.stop()
                await poll_until(lambda: bool(caplog.records))
                assert view.current_epoch == new
                assert [snapshot.epoch for snapshot in delivered] == [new]
                assert "keeping epoch" in caplog.records[0].getMessage()
                nursery.cancel_scope.cancel()
    finally:
        source.close()
    view.check_invariants()


def test_redis_source_reports_an_unreachable_server() -> None:
    source = RedisSource(f"redis://127.0.0.1:{free_loopback_port()}/0", timeout_s=1.0)
    try:
        with pytest.raises(SourceUnavailable) as caught:
            source.current_epoch()
        assert "127.0.0.1" in caught.value.source
    finally:
        source.close()
