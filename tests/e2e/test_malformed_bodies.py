"""Request bodies that are not protobuf, sent raw over grpcio: INVALID_ARGUMENT and one
WARNING line each, never UNKNOWN or a traceback."""

from __future__ import annotations

import grpc
import pytest
import trio

from blockx._proto.blockx.worker import v1 as pb
from tests.e2e.serve_process import serve_process

SUBMIT = "/blockx.worker.v1.WorkerService/SubmitTask"
VALID = bytes(
    pb.SubmitTaskRequest(
        task=pb.TaskSpec(
            task_id="t1",
            function_call=pb.FunctionCallConfig(type="call_list"),
            payload=b'[{"function": "demo.add", "args": [1, 2]}]',
        )
    )
)


def send_raw(port: int, body: bytes) -> grpc.RpcError | bytes:
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        call = channel.unary_unary(SUBMIT)  # no serializers: the bytes go as they are
        try:
            answer: bytes = call(body, timeout=10)
        except grpc.RpcError as error:
            return error
        return answer


@pytest.mark.parametrize(
    ("body", "problem"),
    [
        (b"\xff" * 20, "a varint longer than 10 bytes"),
        (VALID[: len(VALID) - 5], "field 1 runs past the end of the"),
        (b"\x0f", "wire type 7 of field 1 is not supported"),
    ],
    ids=["garbage", "truncated", "bad-wire-type"],
)
async def test_a_malformed_body_is_invalid_argument_with_one_warning(
    body: bytes, problem: str
) -> None:
    async with serve_process("--executors", "1") as worker:
        error = await trio.to_thread.run_sync(send_raw, worker.port, body)
        assert isinstance(error, grpc.RpcError)
        assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
        details = error.details()
        assert details.startswith("malformed request body: ")
        assert problem in details
        # The worker goes on serving: the same bytes, whole, run a task.
        answer = await trio.to_thread.run_sync(send_raw, worker.port, VALID)
        assert isinstance(answer, bytes)
        assert pb.SubmitTaskResponse.parse(answer).task_id == "t1"
        with trio.fail_after(10):
            await worker.wait_for_line("malformed SubmitTaskRequest body refused")
    warnings = [line for line in worker.log if "malformed" in line]
    assert len(warnings) == 1
    assert '"level": "WARNING"' in warnings[0]
    assert "Traceback" not in "\n".join(worker.log)
    assert not any('"level": "ERROR"' in line for line in worker.log)
