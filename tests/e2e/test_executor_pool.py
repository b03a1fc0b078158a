"""The executor pool manager with real executor processes.

Short timeouts (heartbeat 50 ms, stall 300 ms) keep these quick; every test
stops its pool and checks that no process it started is left behind.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import math
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, TypeVar

import attrs
import pytest
import trio

from blockx.calls import decode_value, encode_args
from blockx.config import default_config
from blockx.executors import (
    PROTOCOL_VERSION,
    CallRequest,
    CallResults,
    CodeReply,
    CodeRequest,
    DownReason,
    ExecutorDown,
    ExecutorMessage,
    ExecutorPoolConfig,
    ExecutorPoolManager,
    ExecutorState,
    ExecutorUnavailable,
    ExecutorUp,
    Heartbeat,
    Hello,
    PoolEvent,
    RunCalls,
    UnknownExecutor,
    encode_frame,
)
from blockx.process.clock import EpochClock
from tests.e2e.processes import alive

FAST: dict[str, Any] = {
    "heartbeat_interval_ms": 50,
    "heartbeat_timeout_ms": 1_000,
    "stall_timeout_ms": 300,
    "health_check_interval_ms": 20,
    "restart_delay_ms": 50,
    "grace_ms": 2_000,
}
SOURCES = {
    "demo": "import os\nimport time\n\n\ndef add(a, b):\n    return a + b\n\n\n"
    "def spin():\n    while True:\n        pass\n\n\n"
    "def wait_for(path):\n    while not os.path.exists(path):\n        time.sleep(0.005)\n",
}
HOST_SCRIPT = Path(__file__).with_name("pool_host.py")

E = TypeVar("E", ExecutorUp, ExecutorDown, ExecutorMessage)


def call(call_id: str, function: str, *args: object) -> CallRequest:
    return CallRequest(
        call_id=call_id,
        attempt=1,
        task_id="t",
        epoch="e1",
        function=function,
        args=encode_args(args),
    )


def pool_config(**overrides: Any) -> ExecutorPoolConfig:
    return attrs.evolve(default_config().pool_config(), **{**FAST, **overrides})


def new_pool(
    **overrides: Any,
) -> tuple[ExecutorPoolManager, trio.MemoryReceiveChannel[PoolEvent]]:
    """A pool manager and the receiving end of the channel its events go to."""
    send, receive = trio.open_memory_channel[PoolEvent](math.inf)
    return ExecutorPoolManager(pool_config(**overrides), send, EpochClock()), receive


async def run_pool(
    pool: ExecutorPoolManager,
    returned: trio.Event,
    *,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """`pool.run`, and `returned` set once it has returned."""
    await pool.run(task_status=task_status)
    returned.set()


class Dispatcher:
    """Plays the dispatcher: answers CodeRequests, hands the test every other event."""

    def __init__(
        self, pool: ExecutorPoolManager, events: trio.MemoryReceiveChannel[PoolEvent]
    ) -> None:
        self.pool = pool
        self.events = events
        self.pool_returned = trio.Event()
        self.seen: list[PoolEvent] = []
        self._send, self._receive = trio.open_memory_channel[PoolEvent](math.inf)

    async def pump(self) -> None:
        async for event in self.events:
            if isinstance(event, ExecutorMessage):
                message = event.message
                if isinstance(message, CodeRequest):
                    self.pool.send(
                        event.executor_id,
                        CodeReply(
                            request_id=message.request_id, source=SOURCES.get(message.module)
                        ),
                    )
                    continue
                if isinstance(message, Heartbeat):
                    continue
            self.seen.append(event)
            self._send.send_nowait(event)
        self._send.close()

    async def expect(self, kind: type[E], executor_id: str | None = None) -> E:
        """The next event of `kind` (for `executor_id`), skipping others."""
        async for event in self._receive:
            if isinstance(event, kind) and executor_id in (None, event.executor_id):
                return event
        raise AssertionError(f"the pool ended before a {kind.__name__} arrived")


@asynccontextmanager
async def running_pool(**overrides: Any) -> AsyncIterator[tuple[ExecutorPoolManager, Dispatcher]]:
    pool, events = new_pool(**overrides)
    dispatcher = Dispatcher(pool, events)
    started: list[int] = []
    async with trio.open_nursery() as nursery:
        await nursery.start(run_pool, pool, dispatcher.pool_returned)
        nursery.start_soon(dispatcher.pump)
        try:
            yield pool, dispatcher
        finally:
            started = [e.pid for e in dispatcher.seen if isinstance(e, ExecutorUp)]
            with trio.CancelScope(shield=True), trio.fail_after(10):
                await pool.stop()
            # The pool is done once stop() returns: nothing is left to send an event.
            assert dispatcher.pool_returned.is_set()
            nursery.cancel_scope.cancel()  # the pump: the events channel is never closed
    # Every process the pool ever started is dead and reaped: not even a zombie.
    assert [pid for pid in started if Path(f"/proc/{pid}").exists()] == []
    assert pool.runtime_dir is not None
    assert not Path(pool.runtime_dir).exists()


async def all_up(dispatcher: Dispatcher, count: int) -> dict[str, int]:
    pids: dict[str, int] = {}
    while len(pids) < count:
        up = await dispatcher.expect(ExecutorUp)
        pids[up.executor_id] = up.pid
    return pids


def state_of(pool: ExecutorPoolManager, executor_id: str) -> ExecutorState:
    (view,) = (v for v in pool.snapshot() if v.executor_id == executor_id)
    return view.state


async def test_executors_become_ready_and_serve_calls() -> None:
    with trio.fail_after(20):
        async with running_pool(executor_count=3) as (pool, dispatcher):
            pids = await all_up(dispatcher, 3)
            assert pool.first_healthy.is_set()
            assert sorted(pids) == ["executor-0", "executor-1", "executor-2"]
            views = {v.executor_id: v for v in pool.snapshot()}
            assert {v.state for v in views.values()} <= {ExecutorState.READY, ExecutorState.BUSY}
            assert {k: v.pid for k, v in views.items()} == pids
            assert all(alive(pid) for pid in pids.values())

            pool.send("executor-1", RunCalls(calls=(call("c1", "demo.add", 2, 3),)))
            message = (await dispatcher.expect(ExecutorMessage, "executor-1")).message
            assert isinstance(message, CallResults)
            (result,) = message.outcomes()
            assert (result.call_id, result.attempt, decode_value(result.value)) == ("c1", 1, 5)
            views = {v.executor_id: v for v in pool.snapshot()}
            assert views["executor-1"].calls_served == 1
            with trio.fail_after(2):
                while not views["executor-1"].rss_bytes:
                    await trio.sleep(0.02)
                    views = {v.executor_id: v for v in pool.snapshot()}


async def test_a_call_no_longer_shows_running_once_its_results_are_in(tmp_path: Path) -> None:
    # Heartbeats 1 s apart: the one after the results comes long after them, so only the
    # results can have taken the call off (a stall timeout far off: the call waits).
    release = tmp_path / "release"
    config = {
        "executor_count": 1,
        "heartbeat_interval_ms": 1_000,
        "heartbeat_timeout_ms": 5_000,
        "stall_timeout_ms": 10_000,
    }
    with trio.fail_after(20):
        async with running_pool(**config) as (pool, dispatcher):
            await all_up(dispatcher, 1)
            pool.send("executor-0", RunCalls(calls=(call("slow", "demo.wait_for", str(release)),)))
            with trio.fail_after(5):
                while (busy := pool.snapshot()[0]).running_call_id != "slow":
                    await trio.sleep(0.01)
            assert busy.state is ExecutorState.BUSY
            release.touch()
            message = (await dispatcher.expect(ExecutorMessage, "executor-0")).message
            assert isinstance(message, CallResults)
            assert message.outcomes()[0].call_id == "slow"
            (view,) = pool.snapshot()
            assert (view.state, view.running_call_id, view.calls_served) == (
                ExecutorState.READY,
                None,
                1,
            )


async def test_first_healthy_is_set_by_the_first_ready_executor() -> None:
    with trio.fail_after(20):
        async with running_pool(executor_count=2) as (pool, dispatcher):
            await pool.first_healthy.wait()
            assert any(v.state is not ExecutorState.STARTING for v in pool.snapshot())
            await all_up(dispatcher, 2)


async def test_a_killed_executor_is_reported_down_and_restarted() -> None:
    with trio.fail_after(20):
        async with running_pool(executor_count=2) as (pool, dispatcher):
            pids = await all_up(dispatcher, 2)
            os.kill(pids["executor-0"], signal.SIGKILL)
            down = await dispatcher.expect(ExecutorDown, "executor-0")
            assert (down.pid, down.reason, down.running_call_id) == (
                pids["executor-0"],
                DownReason.EXITED,
                None,
            )
            assert not alive(pids["executor-0"])  # reported only once reaped
            again = await dispatcher.expect(ExecutorUp, "executor-0")
            assert again.pid != pids["executor-0"]
            views = {v.executor_id: v for v in pool.snapshot()}
            assert (views["executor-0"].restarts, views["executor-1"].restarts) == (1, 0)
            assert views["executor-1"].pid == pids["executor-1"]  # the other one carried on


async def test_an_executor_whose_heartbeats_stop_is_lost_and_replaced() -> None:
    with trio.fail_after(20):
        async with running_pool(executor_count=1, heartbeat_timeout_ms=400) as (_, dispatcher):
            pids = await all_up(dispatcher, 1)
            stopped_at = trio.current_time()
            os.kill(pids["executor-0"], signal.SIGSTOP)  # alive, but silent
            down = await dispatcher.expect(ExecutorDown, "executor-0")
            assert (down.reason, down.pid) == (DownReason.LOST, pids["executor-0"])
            # Silent for over 400 ms since its last heartbeat, which came at most one
            # heartbeat interval (50 ms) before it stopped.
            assert trio.current_time() - stopped_at >= 0.35
            assert (await dispatcher.expect(ExecutorUp, "executor-0")).pid != down.pid


async def test_an_executor_spinning_in_a_call_is_wedged_killed_and_replaced() -> None:
    with trio.fail_after(20):
        async with running_pool(executor_count=2) as (pool, dispatcher):
            pids = await all_up(dispatcher, 2)
            sent_at = trio.current_time()
            pool.send("executor-0", RunCalls(calls=(call("spin", "demo.spin"),)))
            with trio.fail_after(5):
                while state_of(pool, "executor-0") is not ExecutorState.BUSY:
                    await trio.sleep(0.01)
            down = await dispatcher.expect(ExecutorDown, "executor-0")
            elapsed = trio.current_time() - sent_at
            assert (down.reason, down.running_call_id, down.pid) == (
                DownReason.WEDGED,
                "spin",
                pids["executor-0"],
            )
            assert 0.3 <= elapsed < 2.0  # past the stall timeout, and soon after it
            assert not alive(down.pid)
            assert (await dispatcher.expect(ExecutorUp, "executor-0")).pid != down.pid
            # The healthy executor is untouched and still serves.
            pool.send("executor-1", RunCalls(calls=(call("ok", "demo.add", 1, 1),)))
            assert isinstance(
                (await dispatcher.expect(ExecutorMessage, "executor-1")).message, CallResults
            )
            assert {v.executor_id: v.pid for v in pool.snapshot()}["executor-1"] == pids[
                "executor-1"
            ]


async def test_a_dispatcher_that_reads_slowly_does_not_make_executors_look_lost() -> None:
    pool, receive = new_pool(executor_count=2)
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            await nursery.start(pool.run)
            await pool.first_healthy.wait()
            # Nobody reads events for longer than the heartbeat timeout (1 s): the
            # executors' heartbeats pile up in the dispatcher's inbox.
            await trio.sleep(1.5)
            assert [v.restarts for v in pool.snapshot()] == [0, 0]
            events = []
            with trio.move_on_after(0.5):
                async for event in receive:
                    events.append(event)
            assert sum(isinstance(e, ExecutorUp) for e in events) == 2
            assert not any(isinstance(e, ExecutorDown) for e in events)
            assert [v.restarts for v in pool.snapshot()] == [0, 0]
            await pool.stop()


async def test_restarts_back_off_after_max_restarts_in_the_window() -> None:
    config = {"executor_count": 1, "max_restarts": 2, "restart_backoff_ms": 1_500}
    with trio.fail_after(30):
        async with running_pool(**config) as (pool, dispatcher):
            (pid,) = (await all_up(dispatcher, 1)).values()
            gaps = []
            for _ in range(3):
                os.kill(pid, signal.SIGKILL)
                await dispatcher.expect(ExecutorDown)
                down_at = trio.current_time()
                await trio.sleep(0.02)
                waiting_state = state_of(pool, "executor-0")
                pid = (await dispatcher.expect(ExecutorUp)).pid
                gaps.append(trio.current_time() - down_at)
            first, second, third = gaps
            assert first < 1.0  # the 50 ms restart delay
            assert second < 1.0
            assert third >= 1.5  # two restarts in the window: the back-off applies
            assert waiting_state is ExecutorState.RESTARTING
            assert [v.restarts for v in pool.snapshot()] == [3]


async def test_without_restarts_a_dead_executor_stays_down() -> None:
    with trio.fail_after(20):
        async with running_pool(executor_count=1, restart_enabled=False) as (pool, dispatcher):
            (pid,) = (await all_up(dispatcher, 1)).values()
            os.kill(pid, signal.SIGKILL)
            await dispatcher.expect(ExecutorDown)
            await trio.sleep(0.3)
            (view,) = pool.snapshot()
            assert (view.state, view.pid, view.restarts) == (ExecutorState.EXITED, None, 0)
            with pytest.raises(ExecutorUnavailable) as caught:
                pool.send("executor-0", RunCalls(calls=()))
            assert caught.value.state == "EXITED"


async def test_send_names_unknown_executors() -> None:
    with trio.fail_after(20):
        async with running_pool(executor_count=1) as (pool, dispatcher):
            await all_up(dispatcher, 1)
            with pytest.raises(UnknownExecutor) as caught:
                pool.send("executor-9", RunCalls(calls=()))
            assert caught.value.known == ("executor-0",)


async def test_stop_is_polite_then_kills_and_leaves_no_process() -> None:
    with trio.fail_after(20):
        async with running_pool(executor_count=2, grace_ms=300, stall_timeout_ms=10_000) as (
            pool,
            dispatcher,
        ):
            pids = await all_up(dispatcher, 2)
            pool.send("executor-0", RunCalls(calls=(call("spin", "demo.spin"),)))
            with trio.fail_after(5):
                while state_of(pool, "executor-0") is not ExecutorState.BUSY:
                    await trio.sleep(0.01)
            stop_at = trio.current_time()
            await pool.stop()
            # The idle one left on Shutdown; the spinning one was killed after the grace.
            assert 0.3 <= trio.current_time() - stop_at < 3.0
            assert [p for p in pids.values() if Path(f"/proc/{p}").exists()] == []
            for pid in pids.values():
                with pytest.raises(ChildProcessError):
                    os.waitpid(pid, os.WNOHANG)  # already reaped by the pool
            assert {v.state for v in pool.snapshot()} == {ExecutorState.STOPPED}
            assert not any(isinstance(e, ExecutorDown) for e in dispatcher.seen)
            # The pool has finished: nothing of it is left to send another event.
            assert dispatcher.pool_returned.is_set()


async def test_cancelling_the_pool_kills_and_reaps_everything() -> None:
    pool, events = new_pool(executor_count=2)
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            await nursery.start(pool.run)
            dispatcher = Dispatcher(pool, events)
            nursery.start_soon(dispatcher.pump)
            pids = await all_up(dispatcher, 2)
            nursery.cancel_scope.cancel()
    assert [p for p in pids.values() if Path(f"/proc/{p}").exists()] == []
    assert pool.runtime_dir is not None
    assert not Path(pool.runtime_dir).exists()


@pytest.mark.parametrize(
    ("executor_id", "token", "protocol_version", "logged"),
    [
        (
            "executor-0",
            "guess",
            PROTOCOL_VERSION,
            "executor_id='executor-0' pid={pid}: wrong token",
        ),
        (
            "executor-7",
            "guess",
            PROTOCOL_VERSION,
            "executor_id='executor-7' pid={pid}: no such executor",
        ),
        (
            "executor-0",
            "guess",
            1,
            f"executor_id='executor-0' pid={{pid}} speaks protocol 1, "
            f"this worker {PROTOCOL_VERSION}",
        ),
    ],
)
async def test_a_connection_that_fails_authentication_is_refused(
    executor_id: str,
    token: str,
    protocol_version: int,
    logged: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    with trio.fail_after(20):
        async with running_pool(executor_count=1) as (pool, dispatcher):
            pids = await all_up(dispatcher, 1)
            assert pool.runtime_dir is not None
            assert os.stat(pool.runtime_dir).st_mode & 0o777 == 0o700
            stream = await trio.open_unix_socket(os.path.join(pool.runtime_dir, "executors.sock"))
            hello = Hello(
                executor_id=executor_id,
                pid=os.getpid(),
                token=token,
                protocol_version=protocol_version,
            )
            await stream.send_all(encode_frame(hello))
            assert await stream.receive_some(100) == b""  # closed without a word
            await stream.aclose()
            (view,) = pool.snapshot()
            assert view.pid == pids["executor-0"]  # the real executor is unaffected
            assert view.state in (ExecutorState.READY, ExecutorState.BUSY)
    refusals = [r.getMessage() for r in caplog.records if "refused" in r.getMessage()]
    assert refusals == [f"executor connection refused: {logged.format(pid=os.getpid())}"]
    assert token not in refusals[0].replace("wrong token", "")  # never log a token


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="uses prctl and /proc")
async def test_executors_exit_when_their_worker_is_killed() -> None:
    # As a subreaper this test process inherits the executors once their worker
    # dies, so it can reap them and tell "exited" from "still running".
    libc = ctypes.CDLL(None, use_errno=True)
    pr_set_child_subreaper = 36
    assert libc.prctl(pr_set_child_subreaper, 1, 0, 0, 0) == 0
    pids: list[int] = []
    runtime_dir = ""
    try:
        with trio.fail_after(20):
            host = await trio.lowlevel.open_process(
                [sys.executable, str(HOST_SCRIPT), "2"],
                stdout=subprocess.PIPE,
                stdin=subprocess.DEVNULL,
            )
            assert host.stdout is not None
            line = b""
            while not line.endswith(b"\n"):
                chunk = await host.stdout.receive_some(4096)
                assert chunk, "the host exited before its executors were up"
                line += chunk
            report = json.loads(line)
            pids, runtime_dir = report["pids"], report["runtime_dir"]
            assert len(pids) == 2
            assert all(alive(pid) for pid in pids)

            host.send_signal(signal.SIGKILL)
            await host.wait()
            await host.stdout.aclose()

            remaining = set(pids)
            with trio.fail_after(3):
                while remaining:
                    for pid in list(remaining):
                        reaped, _status = os.waitpid(pid, os.WNOHANG)
                        if reaped == pid:
                            remaining.discard(pid)
                    await trio.sleep(0.02)
    finally:
        libc.prctl(pr_set_child_subreaper, 0, 0, 0, 0)
        for pid in pids:  # only if the test failed: leave nothing behind
            with contextlib.suppress(ProcessLookupError, ChildProcessError):
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
        if runtime_dir:
            shutil.rmtree(runtime_dir, ignore_errors=True)  # a killed worker cannot tidy up
