"""Requests no well-behaved gRPC client sends, to an in-process worker over real gRPC.

Each is answered with a precise status and a message (never UNKNOWN, a traceback
or silence), the worker goes on serving, and nothing is logged at ERROR. Bodies go
out raw through grpcio, headers and frames raw through h2 (`tests.raw_http2`).
"""

from __future__ import annotations

import logging
from urllib.parse import unquote

import attrs
import grpc
import pytest
import trio
import trio_asyncio

from blockx._proto.blockx.worker import v1 as pb
from blockx.api import STATUS_MESSAGE_CHARS, grpc_error
from blockx.slots import MAX_TASK_ID_CHARS, NoSlot
from tests.adapters.worker_harness import Harness, call_list_task, running_worker, worker_config
from tests.raw_http2 import (
    WORKER_SERVICE,
    after_abandoned_uploads,
    exchange,
    framed,
    grpc_headers,
)

TIMEOUT_S = 20
MAX_MESSAGE_BYTES = 64 * 1024


def send(
    port: int, method: str, *bodies: bytes, streaming: bool = False
) -> tuple[grpc.StatusCode, list[bytes], str]:
    """Call `method` with `bodies` as they are: (status, reply bodies, status message)."""
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        path = WORKER_SERVICE + method
        try:
            if method == "RunTasks":
                replies = list(channel.stream_stream(path)(iter(bodies), timeout=TIMEOUT_S))
            elif streaming:
                replies = list(channel.unary_stream(path)(bodies[0], timeout=TIMEOUT_S))
            else:
                replies = [channel.unary_unary(path)(bodies[0], timeout=TIMEOUT_S)]
        except grpc.RpcError as error:
            return error.code(), [], error.details() or ""
    return grpc.StatusCode.OK, replies, ""


async def sent(
    worker: Harness, method: str, *bodies: bytes, streaming: bool = False
) -> tuple[grpc.StatusCode, list[bytes], str]:
    return await trio.to_thread.run_sync(
        lambda: send(worker.serving.port, method, *bodies, streaming=streaming)
    )


async def still_serves(worker: Harness) -> None:
    """A task submitted now runs to success."""
    task = call_list_task("after", ("demo.add", [1, 2]))
    await worker.call(worker.stub.submit_task, pb.SubmitTaskRequest(task=task))
    stream = worker.stub.watch_tasks(pb.WatchTasksRequest(task_ids=["after"]))
    updates = [update async for update in trio_asyncio.aio_as_trio(stream)]
    assert updates[-1].state == pb.TaskState.SUCCEEDED


def errors_logged(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]


async def test_a_string_field_that_arrives_as_a_number_is_an_unknown_field(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # task_id (field 1) as the varint 5: protobuf reads it as an unknown field. The
    # worker once handed the int to its slot table, which died of it, and the worker
    # with it.
    with trio.fail_after(TIMEOUT_S):
        async with running_worker() as worker:
            status, _, message = await sent(worker, "RequestTaskSlot", b"\x08\x05")
            assert status is grpc.StatusCode.INVALID_ARGUMENT
            assert message.startswith("task_id='' is invalid")
            status, replies, _ = await sent(worker, "GetWorkerStatus", b"\x08\x05")
            assert status is grpc.StatusCode.OK
            assert pb.GetWorkerStatusResponse.parse(replies[0]).slots_total == 4
            await still_serves(worker)
    assert errors_logged(caplog) == []


@pytest.mark.parametrize("length", [MAX_TASK_ID_CHARS + 1, 1_000_000])
async def test_an_overlong_task_id_is_refused_in_a_short_message_by_every_rpc(
    length: int, caplog: pytest.LogCaptureFixture
) -> None:
    # Quoted whole, a megabyte id made the status header take minutes to encode (HPACK
    # is quadratic in a value's length) and broke grpcio's metadata limit.
    task_id = "t" * length
    requests = {
        "RequestTaskSlot": bytes(pb.RequestTaskSlotRequest(task_id=task_id)),
        "SubmitTask": bytes(pb.SubmitTaskRequest(task=call_list_task(task_id))),
        "GetTaskResult": bytes(pb.GetTaskResultRequest(task_id=task_id)),
        "WatchTasks": bytes(pb.WatchTasksRequest(task_ids=["ok", task_id])),
    }
    with trio.fail_after(TIMEOUT_S):
        async with running_worker(worker_config(grpcMaxMessageBytes=2_000_000)) as worker:
            for method, body in requests.items():
                status, _, message = await sent(
                    worker, method, body, streaming=method == "WatchTasks"
                )
                field = "task_ids[1]" if method == "WatchTasks" else "task_id"
                assert (method, status) == (method, grpc.StatusCode.INVALID_ARGUMENT)
                assert message.startswith(f"{field}='{'t' * 76}...")
                assert len(message) < 200
            longest = "t" * MAX_TASK_ID_CHARS
            reply = await worker.call(
                worker.stub.request_task_slot, pb.RequestTaskSlotRequest(task_id=longest)
            )
            assert reply.task_id == longest
    assert errors_logged(caplog) == []


async def test_an_undefined_call_failure_policy_is_refused_naming_the_field() -> None:
    task = call_list_task("policy", ("demo.add", [1, 2]), call_failure_policy=7)
    with trio.fail_after(TIMEOUT_S):
        async with running_worker() as worker:
            status, _, message = await sent(
                worker, "SubmitTask", bytes(pb.SubmitTaskRequest(task=task))
            )
            assert status is grpc.StatusCode.INVALID_ARGUMENT
            assert message.startswith("task.call_failure_policy=7 is invalid")
            request = bytes(pb.RunTasksRequest(task=task))
            status, replies, _ = await sent(worker, "RunTasks", request)
            assert status is grpc.StatusCode.OK
            (event,) = pb.RunTasksResponse.parse(replies[0]).events
            assert event.refused is not None
            assert (event.refused.task_id, event.refused.status) == ("policy", 3)
            assert event.refused.message.startswith("task.call_failure_policy=7 is invalid")
            assert worker.calls.started == []


async def test_the_health_of_a_service_this_port_does_not_serve_is_not_found_in_words() -> None:
    with trio.fail_after(TIMEOUT_S):
        async with running_worker() as worker:
            answer = await trio.to_thread.run_sync(
                lambda: exchange(
                    worker.serving.port,
                    replaced(":path", "/grpc.health.v1.Health/Check"),
                    framed(b"\x0a\x04nope"),  # HealthCheckRequest(service="nope")
                )
            )
    assert answer.grpc_status == NOT_FOUND
    assert unquote(answer.headers["grpc-message"]) == (
        "no health status for service 'nope'; known: '', 'blockx.worker.v1.WorkerService'"
    )


def test_a_status_message_is_never_longer_than_its_bound() -> None:
    error = grpc_error(NoSlot(task_id="t" * 10_000, task_slots=4))
    assert error.message is not None
    assert len(error.message) == STATUS_MESSAGE_CHARS
    assert error.message.endswith("...")


GET_RESULT = framed(bytes(pb.GetTaskResultRequest(task_id="nobody")))
NOT_FOUND = 5


def without(name: str) -> list[tuple[str, str]]:
    return [(k, v) for k, v in grpc_headers("GetTaskResult") if k != name]


def replaced(name: str, value: str) -> list[tuple[str, str]]:
    return [(k, value if k == name else v) for k, v in grpc_headers("GetTaskResult")]


@attrs.frozen
class Raw:
    """A request as h2 sends it, and the HTTP status, gRPC status and start of the
    message it must be answered with."""

    headers: list[tuple[str, str]]
    body: bytes
    http_status: int
    grpc_status: int
    message: str


RAW_REQUESTS = {
    "no :path": Raw(without(":path"), GET_RESULT, 400, 3, "the request has no :path header"),
    "no :method": Raw(without(":method"), GET_RESULT, 400, 3, "the request has no :method header"),
    "GET": Raw(replaced(":method", "GET"), GET_RESULT, 405, 3, "method 'GET' is not POST"),
    "no te": Raw(without("te"), GET_RESULT, 400, 3, 'the request lacks the header "te: trailers"'),
    "html": Raw(
        replaced("content-type", "text/html"), GET_RESULT, 415, 3, "content-type 'text/html'"
    ),
    "unknown method": Raw(
        replaced(":path", WORKER_SERVICE + "ReleaseTaskSlot"),
        GET_RESULT,
        200,
        12,
        f"no method '{WORKER_SERVICE}ReleaseTaskSlot' on this port",
    ),
    "timeout in words": Raw(
        grpc_headers("GetTaskResult", grpc_timeout="soon"),
        GET_RESULT,
        200,
        3,
        "grpc-timeout 'soon' is not a gRPC timeout",
    ),
    "negative timeout": Raw(
        grpc_headers("GetTaskResult", grpc_timeout="-5S"),
        GET_RESULT,
        200,
        3,
        "grpc-timeout '-5S' is not a gRPC timeout",
    ),
    "nine-digit timeout": Raw(
        grpc_headers("GetTaskResult", grpc_timeout="999999999H"),
        GET_RESULT,
        200,
        3,
        "grpc-timeout '999999999H' is not a gRPC timeout",
    ),
    "zero timeout": Raw(
        grpc_headers("GetTaskResult", grpc_timeout="0n"),
        GET_RESULT,
        200,
        4,
        "the call's deadline passed",
    ),
    "nanosecond timeout": Raw(
        grpc_headers("GetTaskResult", grpc_timeout="1n"),
        GET_RESULT,
        200,
        4,
        "the call's deadline passed",
    ),
    "longest timeout": Raw(
        grpc_headers("GetTaskResult", grpc_timeout="99999999H"),
        GET_RESULT,
        200,
        NOT_FOUND,
        "task 'nobody' is unknown",
    ),
    "gzip": Raw(
        grpc_headers("GetTaskResult", grpc_encoding="gzip"),
        framed(b"\x1f\x8b", flag=1),
        200,
        12,
        "grpc-encoding 'gzip' is not supported",
    ),
    "bin metadata not base64": Raw(
        grpc_headers("GetTaskResult", x_trace_bin="abcde"),
        GET_RESULT,
        200,
        3,
        "metadata 'x-trace-bin' is not base64",
    ),
    "compressed flag": Raw(
        grpc_headers("GetTaskResult"),
        b"\x01" + GET_RESULT[1:],
        200,
        3,
        "malformed request: message 1 is marked compressed",
    ),
    "flag 7": Raw(
        grpc_headers("GetTaskResult"),
        b"\x07" + GET_RESULT[1:],
        200,
        3,
        "malformed request: message 1 has compressed flag 7",
    ),
    "cut in the prefix": Raw(
        grpc_headers("GetTaskResult"),
        GET_RESULT[:3],
        200,
        3,
        "malformed request: the request ends inside the prefix of message 1",
    ),
    "cut in the body": Raw(
        grpc_headers("GetTaskResult"),
        GET_RESULT[:-2],
        200,
        3,
        "malformed request: the request ends inside the body of message 1",
    ),
    "health check without its request": Raw(
        replaced(":path", "/grpc.health.v1.Health/Check"),
        b"",
        200,
        3,
        "the call ended without its request message",
    ),
    "over the limit": Raw(
        grpc_headers("GetTaskResult"),
        framed(b"", length=MAX_MESSAGE_BYTES + 1),
        200,
        8,
        f"request of {MAX_MESSAGE_BYTES + 1} bytes exceeds grpcMaxMessageBytes",
    ),
}


@pytest.mark.parametrize("raw", RAW_REQUESTS.values(), ids=RAW_REQUESTS.keys())
async def test_a_request_grpclib_would_mishandle_gets_a_precise_status(
    raw: Raw, caplog: pytest.LogCaptureFixture
) -> None:
    config = worker_config(grpcMaxMessageBytes=MAX_MESSAGE_BYTES)
    with trio.fail_after(TIMEOUT_S):
        async with running_worker(config) as worker:
            answer = await trio.to_thread.run_sync(
                lambda: exchange(worker.serving.port, raw.headers, raw.body)
            )
            assert answer.headers[":status"] == str(raw.http_status)
            assert answer.grpc_status == raw.grpc_status
            assert unquote(answer.headers["grpc-message"]).startswith(raw.message)
            await still_serves(worker)
    assert errors_logged(caplog) == []


async def test_a_message_over_the_limit_is_refused_before_its_bytes_are_sent() -> None:
    # The prefix announces 4 GiB and nothing follows, the stream still open: grpclib
    # waited for (and buffered) all of it.
    config = worker_config(grpcMaxMessageBytes=MAX_MESSAGE_BYTES)
    headers = grpc_headers("SubmitTask")
    with trio.fail_after(TIMEOUT_S):
        async with running_worker(config) as worker:
            answer = await trio.to_thread.run_sync(
                lambda: exchange(
                    worker.serving.port,
                    headers,
                    framed(b"", length=2**32 - 1),
                    end_stream=False,
                )
            )
            assert answer.grpc_status == 8
            assert unquote(answer.headers["grpc-message"]) == (
                f"request of {2**32 - 1} bytes exceeds grpcMaxMessageBytes ({MAX_MESSAGE_BYTES})"
            )


async def test_a_frame_of_a_type_http2_does_not_define_is_ignored(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Type 0xfa on stream 0, five bytes of payload: RFC 9113 says to ignore it. grpclib
    # raised NotImplementedError out of the transport and dropped the connection.
    unknown = (5).to_bytes(3, "big") + b"\xfa\x00" + (0).to_bytes(4, "big") + b"hello"
    with trio.fail_after(TIMEOUT_S):
        async with running_worker() as worker:
            answer = await trio.to_thread.run_sync(
                lambda: exchange(
                    worker.serving.port, grpc_headers("GetTaskResult"), GET_RESULT, before=unknown
                )
            )
            assert (answer.grpc_status, answer.closed) == (NOT_FOUND, False)
    assert errors_logged(caplog) == []


async def test_a_call_its_client_gives_up_on_is_no_error(caplog: pytest.LogCaptureFixture) -> None:
    # A watch of a reservation sends its first update and waits: the client then
    # resets the stream, which ends the handler with StreamTerminatedError.
    body = framed(bytes(pb.WatchTasksRequest(task_ids=["held"])))
    with trio.fail_after(TIMEOUT_S):
        async with running_worker() as worker:
            reserve = pb.RequestTaskSlotRequest(task_id="held", ttl_ms=60_000)
            await worker.call(worker.stub.request_task_slot, reserve)
            answer = await trio.to_thread.run_sync(
                lambda: exchange(
                    worker.serving.port, grpc_headers("WatchTasks"), body, cancel_at_data=True
                )
            )
            assert answer.data
            await still_serves(worker)
    assert errors_logged(caplog) == []


async def test_uploads_abandoned_at_once_give_the_connection_its_window_back() -> None:
    # A client that sends a large message and resets the stream in the same breath:
    # the request's task was cancelled before its first step, so it never reached the
    # `finally` that gives the unread bytes back to the connection's flow-control
    # window (4 MiB). After a few such uploads the connection carried nothing more.
    with trio.fail_after(TIMEOUT_S):
        async with running_worker() as worker:
            answer = await trio.to_thread.run_sync(
                lambda: after_abandoned_uploads(
                    worker.serving.port,
                    grpc_headers("GetTaskResult"),
                    GET_RESULT,
                    uploads=100,
                    upload_bytes=60_000,
                )
            )
    assert answer.grpc_status == NOT_FOUND


async def test_a_header_that_is_not_ascii_closes_its_connection_with_a_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    headers = [(k.encode(), v.encode()) for k, v in grpc_headers("GetTaskResult")]
    headers.append((b"x-name", b"\xff\xfe"))
    with trio.fail_after(TIMEOUT_S):
        async with running_worker() as worker:
            answer = await trio.to_thread.run_sync(
                lambda: exchange(worker.serving.port, headers, GET_RESULT)
            )
            assert answer.closed
            await still_serves(worker)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("closed: it sent what is not HTTP/2 (UnicodeDecodeError" in w for w in warnings)
    assert errors_logged(caplog) == []
