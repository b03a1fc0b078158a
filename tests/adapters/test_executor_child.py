"""The executor child's side of the protocol, against a Trio server playing the worker.

Each test starts a real `python -m blockx.executors.child` (its exits are
`os._exit`, so it cannot run in-process) and speaks frames to it directly.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any

import pytest
import trio

from blockx.calls import (
    CallOutcome,
    FailureCode,
    decode_args,
    decode_value,
    encode_args,
    encode_value,
)
from blockx.executors import (
    PROTOCOL_VERSION,
    TOKEN_ENV,
    CallRequest,
    CallResults,
    CancelCall,
    CodeReply,
    CodeRequest,
    FrameDecoder,
    Heartbeat,
    Hello,
    Message,
    RevokeCall,
    RunCalls,
    Shutdown,
    Subcall,
    SubcallResult,
    Welcome,
    encode_frames,
)
from blockx.executors.child import (
    EXIT_CONNECTION_LOST,
    EXIT_PROTOCOL_ERROR,
    EXIT_REJECTED,
    EXIT_SHUTDOWN,
    EXIT_USAGE,
)

TOKEN = "0123456789abcdef"
EPOCH = "e1"
DEMO = """
import time

import blockx


def add(a, b):
    return a + b


def divide(a, b):
    return a / b


def flaky():
    raise blockx.RetryableError("try again later")


def unserializable():
    return object()


def big(n):
    return "x" * n


def sleepy(seconds):
    time.sleep(seconds)
    return "slept"


def spin():
    while True:
        pass


def parent(x):
    return blockx.subcall("demo.add", x, 1) * 10


def parent_of_missing():
    return blockx.subcall("demo.missing")


def catches_subcall_failure():
    try:
        blockx.subcall("demo.missing")
    except blockx.SubcallFailed as exc:
        return [exc.error_code, exc.retryable]
"""


def call(
    call_id: str, function: str, *args: Any, deadline_ms: int | None = None, attempt: int = 1
) -> CallRequest:
    return CallRequest(
        call_id=call_id,
        attempt=attempt,
        task_id="task-1",
        epoch=EPOCH,
        function=function,
        args=encode_args(args),
        deadline_ms_from_now=deadline_ms,
    )


class FakeWorker:
    """The worker's end of one executor connection.

    `receive` answers CodeRequests from `modules` (keyed by epoch and module) and
    records heartbeats, so tests see only the messages they are about.
    """

    def __init__(
        self, process: trio.Process, stream: trio.SocketStream, decoder: FrameDecoder
    ) -> None:
        self.process = process
        self.stream = stream
        self.decoder = decoder
        self.modules: dict[tuple[str, str], str] = {(EPOCH, "demo"): DEMO}
        self.code_errors: dict[tuple[str, str], str] = {}
        self.code_requests: list[CodeRequest] = []
        self.heartbeats: list[Heartbeat] = []

    async def send(self, *messages: Message) -> None:
        await self.stream.send_all(encode_frames(messages))

    async def receive_any(self) -> Message | None:
        """The next message, or None at end of file."""
        while True:
            for message in self.decoder:
                return message
            data = await self.stream.receive_some(65536)
            if not data:
                return None
            self.decoder.feed(data)

    async def _receive_answering_code_requests(self) -> Message:
        while True:
            message = await self.receive_any()
            assert message is not None, "the executor closed the connection"
            if not isinstance(message, CodeRequest):
                return message
            self.code_requests.append(message)
            key = (message.epoch, message.module)
            await self.send(
                CodeReply(
                    request_id=message.request_id,
                    source=self.modules.get(key),
                    error=self.code_errors.get(key),
                )
            )

    async def receive(self) -> Message:
        """The next message that is neither a CodeRequest nor a Heartbeat."""
        while True:
            message = await self._receive_answering_code_requests()
            if not isinstance(message, Heartbeat):
                return message
            self.heartbeats.append(message)

    async def heartbeat(self) -> Heartbeat:
        """The next Heartbeat; other messages (but CodeRequests) must not come first."""
        message = await self._receive_answering_code_requests()
        assert isinstance(message, Heartbeat), message
        return message

    async def results(self, count: int) -> list[CallResults]:
        """CallResults frames until `count` results have arrived."""
        frames: list[CallResults] = []
        while sum(len(f.outcomes()) for f in frames) < count:
            message = await self.receive()
            assert isinstance(message, CallResults), message
            frames.append(message)
        return frames

    async def results_by_id(self, count: int) -> dict[str, CallOutcome]:
        return {r.call_id: r for f in await self.results(count) for r in f.outcomes()}


@asynccontextmanager
async def executor_child(
    *, max_result_bytes: int = 1_000_000, heartbeat_interval_ms: int = 50, accept: bool = True
) -> AsyncIterator[FakeWorker]:
    """A child connected to a FakeWorker; `accept=False` closes on its Hello instead."""
    runtime_dir = tempfile.mkdtemp(prefix="bx-test-")
    path = os.path.join(runtime_dir, "s")
    sock = trio.socket.socket(trio.socket.AF_UNIX, trio.socket.SOCK_STREAM)
    await sock.bind(path)
    sock.listen(1)
    listener = trio.SocketListener(sock)
    command = [
        sys.executable,
        "-m",
        "blockx.executors.child",
        "--socket",
        path,
        "--executor-id",
        "ex-test",
    ]
    env = {**os.environ, TOKEN_ENV: TOKEN}
    process = await trio.lowlevel.open_process(command, env=env, stdin=subprocess.DEVNULL)
    stream: trio.SocketStream | None = None
    try:
        stream = await listener.accept()
        worker = FakeWorker(process, stream, FrameDecoder())
        hello = await worker.receive_any()
        assert hello == Hello(
            executor_id="ex-test", pid=process.pid, token=TOKEN, protocol_version=PROTOCOL_VERSION
        )
        if accept:
            await worker.send(
                Welcome(
                    heartbeat_interval_ms=heartbeat_interval_ms, max_result_bytes=max_result_bytes
                )
            )
        else:
            await stream.aclose()
        yield worker
    finally:
        with trio.CancelScope(shield=True):
            if process.returncode is None:
                process.kill()
            await process.wait()
            if stream is not None:
                await stream.aclose()
            await listener.aclose()
            shutil.rmtree(runtime_dir, ignore_errors=True)


async def wait_exit(process: trio.Process, seconds: float = 3.0) -> int:
    with trio.fail_after(seconds):
        return await process.wait()


def values(results: Sequence[CallOutcome]) -> list[Any]:
    return [decode_value(r.value) if r.ok else None for r in results]


async def test_hello_then_heartbeats_report_an_idle_executor() -> None:
    with trio.fail_after(10):
        async with executor_child() as worker:
            first = await worker.heartbeat()
            assert first.running_call_id is None
            assert first.calls_served == 0
            assert first.loop_progress_age_ms == 0  # idle waiting is not a stall
            assert first.rss_bytes > 1_000_000
            await worker.heartbeat()  # and they keep coming


async def test_a_batch_runs_in_order_and_its_results_come_back_batched() -> None:
    with trio.fail_after(10):
        async with executor_child() as worker:
            calls = [call(f"c{i}", "demo.add", i, 1) for i in range(50)]
            await worker.send(RunCalls(calls=tuple(calls)))
            frames = await worker.results(50)
            results = [r for f in frames for r in f.outcomes()]
            assert [(r.call_id, r.attempt) for r in results] == [(c.call_id, 1) for c in calls]
            assert values(results) == [i + 1 for i in range(50)]
            assert all(r.ok and r.error_code is None for r in results)
            assert len(frames) <= 5  # the queue stayed full, so results were batched
            # The module's code was fetched once (after asking whether it is a package).
            asked = [(r.epoch, r.module) for r in worker.code_requests]
            assert asked == [(EPOCH, "demo.__init__"), (EPOCH, "demo")]
            # A heartbeat built just before the results may still be on its way.
            while (await worker.heartbeat()).calls_served != 50:
                pass


async def test_every_outcome_has_its_stable_code_and_retryability() -> None:
    with trio.fail_after(10):
        async with executor_child(max_result_bytes=1_000) as worker:
            worker.code_errors[(EPOCH, "flaky_source.__init__")] = "redis is down"
            bad_args = CallRequest(
                call_id="bad-args",
                attempt=1,
                task_id="t",
                epoch=EPOCH,
                function="demo.add",
                args=b"\xc1",
            )
            batch = [
                call("raised", "demo.divide", 1, 0),
                call("retryable", "demo.flaky"),
                call("no-function", "demo.missing"),
                call("no-module", "nowhere.f"),
                call("no-dot", "add"),
                call("unserializable", "demo.unserializable"),
                call("too-large", "demo.big", 2_000),
                bad_args,
                call("code-unavailable", "flaky_source.f"),
                call("expired", "demo.add", 1, 2, deadline_ms=0),
                call("fine", "demo.big", 10, attempt=3),
            ]
            await worker.send(RunCalls(calls=tuple(batch)))
            results = await worker.results_by_id(len(batch))

    expected = {
        "raised": (FailureCode.CALL_RAISED, False),
        "retryable": (FailureCode.CALL_RAISED_RETRYABLE, True),
        "no-function": (FailureCode.UNKNOWN_FUNCTION, False),
        "no-module": (FailureCode.UNKNOWN_FUNCTION, False),
        "no-dot": (FailureCode.UNKNOWN_FUNCTION, False),
        "unserializable": (FailureCode.RESULT_NOT_SERIALIZABLE, False),
        "too-large": (FailureCode.RESULT_TOO_LARGE, False),
        "bad-args": (FailureCode.INVALID_ARGS, False),
        "code-unavailable": (FailureCode.CODE_UNAVAILABLE, True),
        "expired": (FailureCode.DEADLINE_EXCEEDED, True),
    }
    got = {
        call_id: (r.error_code, r.retryable) for call_id, r in results.items() if call_id != "fine"
    }
    assert got == expected
    assert all(not results[c].ok and results[c].value == b"" for c in expected)
    assert {r.attempt for c, r in results.items() if c != "fine"} == {1}
    assert (results["fine"].ok, results["fine"].attempt) == (True, 3)
    assert decode_value(results["fine"].value) == "x" * 10
    message = results["raised"].error_message
    assert message.startswith("ZeroDivisionError: division by zero")
    assert "in divide" in message  # the traceback of function code, not the executor's
    assert "try again later" in results["retryable"].error_message
    assert "missing" in results["no-function"].error_message
    assert "2003 bytes; the limit is 1000" in results["too-large"].error_message
    assert "redis is down" in results["code-unavailable"].error_message


async def test_a_subcall_round_trip_while_the_executor_keeps_running_calls() -> None:
    with trio.fail_after(10):
        async with executor_child() as worker:
            await worker.send(RunCalls(calls=(call("p", "demo.parent", 4, attempt=2),)))
            subcall = await worker.receive()
            assert isinstance(subcall, Subcall)
            assert (subcall.parent_call_id, subcall.parent_attempt, subcall.function) == (
                "p",
                2,
                "demo.add",
            )
            assert decode_args(subcall.args) == ([4, 1], {})

            # While "p" waits, the executor runs what else it is given.
            await worker.send(RunCalls(calls=(call("other", "demo.add", 2, 3),)))
            (other,) = (await worker.results(1))[0].outcomes()
            assert (other.call_id, other.attempt, decode_value(other.value)) == ("other", 1, 5)

            # Waiting on a subcall is no stall, however long it takes.
            await trio.sleep(0.3)
            beat = await worker.heartbeat()
            while beat.running_call_id != "p":  # one built while "other" ran may come first
                beat = await worker.heartbeat()
            assert beat.loop_progress_age_ms < 100

            await worker.send(
                SubcallResult(
                    outcome=CallOutcome.success(
                        call_id=subcall.subcall_id, attempt=1, value=b"\x05"
                    )
                )
            )
            (parent,) = (await worker.results(1))[0].outcomes()
            assert (parent.call_id, parent.attempt, decode_value(parent.value)) == ("p", 2, 50)


async def test_a_failed_subcall_fails_its_caller_with_the_same_retryability() -> None:
    with trio.fail_after(10):
        async with executor_child() as worker:
            await worker.send(
                RunCalls(
                    calls=(
                        call("lets-it-fail", "demo.parent_of_missing"),
                        call("catches", "demo.catches_subcall_failure"),
                    )
                )
            )
            for _ in range(2):
                subcall = await worker.receive()
                assert isinstance(subcall, Subcall)
                await worker.send(
                    SubcallResult(
                        outcome=CallOutcome.failure(
                            call_id=subcall.subcall_id,
                            attempt=1,
                            error_code=FailureCode.EXECUTOR_LOST,
                            error_message="its executor died",
                            retryable=True,
                        )
                    )
                )
            results = await worker.results_by_id(2)
    failed = results["lets-it-fail"]
    assert (failed.error_code, failed.retryable) == (FailureCode.CALL_RAISED_RETRYABLE, True)
    assert "EXECUTOR_LOST: its executor died" in failed.error_message
    assert decode_value(results["catches"].value) == ["EXECUTOR_LOST", True]


async def test_cancel_drops_a_queued_call_and_ends_a_subcall_wait() -> None:
    with trio.fail_after(10):
        async with executor_child() as worker:
            await worker.send(
                RunCalls(
                    calls=(call("busy", "demo.sleepy", 0.3), call("queued", "demo.add", 1, 2))
                ),
                CancelCall(call_id="queued", attempt=1),
            )
            cancelled, busy = await worker.results(2)
            assert [(r.call_id, r.attempt, r.error_code) for r in cancelled.outcomes()] == [
                ("queued", 1, FailureCode.CALL_CANCELLED)
            ]
            assert [(r.call_id, r.ok) for r in busy.outcomes()] == [("busy", True)]

            await worker.send(RunCalls(calls=(call("waiting", "demo.parent", 1),)))
            subcall = await worker.receive()
            assert isinstance(subcall, Subcall)
            await worker.send(CancelCall(call_id="waiting", attempt=1))
            (waiting,) = (await worker.results(1))[0].outcomes()
            assert (waiting.call_id, waiting.attempt, waiting.error_code, waiting.retryable) == (
                "waiting",
                1,
                FailureCode.CALL_CANCELLED,
                False,
            )
            # A late answer to the abandoned subcall is dropped; the executor carries on.
            await worker.send(
                SubcallResult(
                    outcome=CallOutcome.success(
                        call_id=subcall.subcall_id, attempt=1, value=b"\x02"
                    )
                ),
                RunCalls(calls=(call("after", "demo.add", 1, 1),)),
            )
            (after,) = (await worker.results(1))[0].outcomes()
            assert (after.call_id, decode_value(after.value)) == ("after", 2)


async def test_revoke_gives_back_a_queued_call_and_leaves_a_started_one_running() -> None:
    with trio.fail_after(10):
        async with executor_child() as worker:
            await worker.send(
                RunCalls(
                    calls=(call("busy", "demo.sleepy", 0.3), call("queued", "demo.add", 1, 2))
                ),
                RevokeCall(call_id="queued", attempt=1),
            )
            given_back, busy = await worker.results(2)
            assert [
                (r.call_id, r.attempt, r.error_code, r.retryable) for r in given_back.outcomes()
            ] == [("queued", 1, FailureCode.CALL_REVOKED, True)]
            assert [(r.call_id, r.ok) for r in busy.outcomes()] == [("busy", True)]

            # Once a call has started (here: it waits on its subcall), a revoke is ignored.
            await worker.send(RunCalls(calls=(call("started", "demo.parent", 1),)))
            subcall = await worker.receive()
            assert isinstance(subcall, Subcall)
            await worker.send(
                RevokeCall(call_id="started", attempt=1),
                SubcallResult(
                    outcome=CallOutcome.success(
                        call_id=subcall.subcall_id, attempt=1, value=encode_value(2)
                    )
                ),
            )
            (started,) = (await worker.results(1))[0].outcomes()
            assert (started.call_id, started.ok) == ("started", True)


async def test_cancel_names_one_attempt_of_a_call() -> None:
    with trio.fail_after(10):
        async with executor_child() as worker:
            await worker.send(
                RunCalls(
                    calls=(
                        call("busy", "demo.sleepy", 0.3),
                        call("c", "demo.add", 1, 2, attempt=2),
                        call("c", "demo.add", 2, 2, attempt=3),
                    )
                ),
                CancelCall(call_id="c", attempt=1),  # no such attempt: nothing happens
                CancelCall(call_id="c", attempt=3),
            )
            results = [r for f in await worker.results(3) for r in f.outcomes()]
    assert [(r.call_id, r.attempt, r.error_code) for r in results] == [
        ("c", 3, FailureCode.CALL_CANCELLED),
        ("busy", 1, None),
        ("c", 2, None),
    ]
    assert values(results) == [None, "slept", 3]


async def test_a_spinning_call_shows_a_growing_loop_age_and_end_of_file_ends_it() -> None:
    with trio.fail_after(10):
        async with executor_child() as worker:
            await worker.send(RunCalls(calls=(call("spin", "demo.spin"),)))
            while True:
                beat = await worker.heartbeat()
                if beat.running_call_id == "spin" and beat.loop_progress_age_ms >= 300:
                    break
            await worker.stream.aclose()  # the worker "dies" while the call spins
            assert await wait_exit(worker.process) == EXIT_CONNECTION_LOST


async def test_end_of_file_ends_an_idle_executor() -> None:
    with trio.fail_after(10):
        async with executor_child() as worker:
            await worker.heartbeat()
            await worker.stream.aclose()
            assert await wait_exit(worker.process) == EXIT_CONNECTION_LOST


async def test_shutdown_finishes_the_running_call_starts_nothing_new_and_exits() -> None:
    with trio.fail_after(10):
        async with executor_child() as worker:
            await worker.send(RunCalls(calls=(call("last", "demo.sleepy", 0.5),)))
            while (await worker.heartbeat()).running_call_id != "last":
                pass
            await worker.send(Shutdown(), RunCalls(calls=(call("never", "demo.add", 1, 1),)))
            (last,) = (await worker.results(1))[0].outcomes()
            assert (last.call_id, decode_value(last.value)) == ("last", "slept")
            rest: list[Message] = []
            while (message := await worker.receive_any()) is not None:
                rest.append(message)  # heartbeats until the executor closes its end
            assert await wait_exit(worker.process) == EXIT_SHUTDOWN
    assert [m for m in rest if not isinstance(m, Heartbeat)] == []  # "never" never ran


async def test_an_executor_the_worker_refuses_exits() -> None:
    with trio.fail_after(10):
        async with executor_child(accept=False) as worker:
            assert await wait_exit(worker.process) == EXIT_REJECTED


async def test_a_malformed_frame_from_the_worker_ends_the_executor() -> None:
    with trio.fail_after(10):
        async with executor_child() as worker:
            await worker.stream.send_all(b"\x00\x00\x00\x01\xc1")
            assert await wait_exit(worker.process) == EXIT_PROTOCOL_ERROR


async def test_each_epoch_runs_its_own_code() -> None:
    with trio.fail_after(10):
        async with executor_child() as worker:
            worker.modules[("e2", "demo")] = "def add(a, b):\n    return a - b\n"
            old = call("old", "demo.add", 5, 3)
            new = CallRequest(
                call_id="new",
                attempt=1,
                task_id="t",
                epoch="e2",
                function="demo.add",
                args=encode_args([5, 3]),
            )
            await worker.send(RunCalls(calls=(old, new)))
            results = await worker.results_by_id(2)
    assert {k: decode_value(r.value) for k, r in results.items()} == {"old": 8, "new": 2}


async def test_the_executor_refuses_to_start_without_a_token() -> None:
    env = {k: v for k, v in os.environ.items() if k != TOKEN_ENV}
    with trio.fail_after(10):
        done = await trio.run_process(
            [
                sys.executable,
                "-m",
                "blockx.executors.child",
                "--socket",
                "/nonexistent",
                "--executor-id",
                "x",
            ],
            env=env,
            check=False,
            capture_stderr=True,
            stdin=subprocess.DEVNULL,
        )
    assert done.returncode == EXIT_USAGE
    assert TOKEN_ENV.encode() in done.stderr


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
async def test_a_signal_from_outside_does_not_reach_a_running_call(signum: int) -> None:
    with trio.fail_after(10):
        async with executor_child() as worker:
            await worker.send(RunCalls(calls=(call("s", "demo.sleepy", 0.2),)))
            await trio.sleep(0.05)
            worker.process.send_signal(signum)
            (result,) = (await worker.results(1))[0].outcomes()
            assert result.ok, result


async def test_importing_the_executor_package_does_not_import_trio() -> None:
    probe = "import sys, blockx.executors; print('trio' in sys.modules)"
    with trio.fail_after(10):
        done = await trio.run_process(
            [sys.executable, "-c", probe], capture_stdout=True, stdin=subprocess.DEVNULL
        )
    assert done.stdout.strip() == b"False"
