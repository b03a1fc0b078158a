"""The bearer token of the gRPC port: every RPC but health needs it; the client and the
command line send it from the same variables the worker reads; it is never logged."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
import trio
import trio_asyncio
from grpclib.client import Channel
from grpclib.const import Status
from grpclib.exceptions import GRPCError
from grpclib.health.v1.health_grpc import HealthStub
from grpclib.health.v1.health_pb2 import HealthCheckRequest, HealthCheckResponse

from blockx._proto.blockx.worker import v1 as pb
from blockx.client import ClientSettings, WorkerClient
from blockx.config import load_config
from blockx.net.auth import bearer_token
from blockx.settings import ConfigError
from tests.e2e.serve_process import REPO, serve_process

TOKEN = "s3cret-token-for-tests"
TASK = pb.TaskSpec(
    task_id="t1",
    function_call=pb.FunctionCallConfig(type="call_list"),
    payload=b'[{"function": "demo.add", "args": [40, 2]}]',
    result_handler=pb.ResultHandler(type="result"),
)


async def refused_status(port: int, metadata: dict[str, str] | None) -> Status | None:
    """The status a bare submit gets with `metadata` (None: it was accepted)."""

    async def call() -> Status | None:
        channel = Channel("127.0.0.1", port)
        try:
            await pb.WorkerServiceStub(channel).submit_task(
                pb.SubmitTaskRequest(
                    task=pb.TaskSpec(task_id="probe", function_call=TASK.function_call)
                ),
                metadata=metadata,
            )
        except GRPCError as error:
            status: Status = error.status
            return status
        finally:
            channel.close()
        return None

    refused: Status | None = await trio_asyncio.aio_as_trio(call)()
    return refused


async def health(port: int) -> int:
    async def call() -> HealthCheckResponse:
        channel = Channel("127.0.0.1", port)
        try:
            return await HealthStub(channel).Check(HealthCheckRequest())
        finally:
            channel.close()

    answer: HealthCheckResponse = await trio_asyncio.aio_as_trio(call)()
    return int(answer.status)


@pytest.mark.parametrize("source", ["env", "file"])
async def test_every_rpc_but_health_needs_the_bearer_token(tmp_path: Path, source: str) -> None:
    if source == "env":
        env = {"WORKER_AUTH_TOKEN": TOKEN}
    else:
        (tmp_path / "token").write_text(TOKEN + "\n")
        env = {"WORKER_AUTH_TOKEN_FILE": str(tmp_path / "token")}
    with trio.fail_after(60):
        async with serve_process("--executors", "1", env=env) as worker:
            port = worker.port
            assert await refused_status(port, None) == Status.UNAUTHENTICATED
            wrong = {"authorization": "Bearer nope"}
            assert await refused_status(port, wrong) == Status.UNAUTHENTICATED
            assert await health(port) == HealthCheckResponse.SERVING  # open
            async with WorkerClient.connect(f"127.0.0.1:{port}", token=TOKEN) as client:
                await client.submit(TASK)
                updates = [u async for u in client.watch(["t1"])]
            cli = await trio.run_process(
                [sys.executable, "-m", "blockx", "status", "--worker", f"127.0.0.1:{port}"],
                cwd=REPO,
                env={**os.environ, **env},
                capture_stdout=True,
                capture_stderr=True,
                check=False,
            )
            bare = {k: v for k, v in os.environ.items() if not k.startswith("WORKER_AUTH")}
            refused = await trio.run_process(
                [sys.executable, "-m", "blockx", "status", "--worker", f"127.0.0.1:{port}"],
                cwd=REPO,
                env=bare,
                capture_stdout=True,
                capture_stderr=True,
                check=False,
            )
    [last] = [u for u in updates if u.is_terminal]
    assert last.result is not None
    assert json.loads(last.result.outputs_json) == [42]
    assert cli.returncode == 0, cli.stderr
    assert refused.returncode != 0
    assert b"UNAUTHENTICATED" in refused.stderr
    assert TOKEN not in "\n".join(worker.log)


def worker_token(env: dict[str, str]) -> str | None:
    grpc = load_config(env=env).grpc
    return bearer_token(grpc.auth_token, grpc.auth_token_file)


def test_the_token_comes_from_one_place_and_a_bad_file_is_named(tmp_path: Path) -> None:
    assert worker_token({}) is None
    assert worker_token({"WORKER_AUTH_TOKEN": "x"}) == "x"
    (tmp_path / "token").write_text("  y \n")
    token_file = str(tmp_path / "token")
    assert worker_token({"WORKER_AUTH_TOKEN_FILE": token_file}) == "y"
    with pytest.raises(ConfigError, match="either WORKER_AUTH_TOKEN or a token file"):
        worker_token({"WORKER_AUTH_TOKEN_FILE": token_file, "WORKER_AUTH_TOKEN": "x"})
    (tmp_path / "empty").write_text("\n")
    with pytest.raises(ConfigError, match="a non-empty file"):
        worker_token({"WORKER_AUTH_TOKEN_FILE": str(tmp_path / "empty")})
    with pytest.raises(ConfigError, match=r"grpcAuthTokenFile .*a readable file"):
        worker_token({"WORKER_AUTH_TOKEN_FILE": str(tmp_path / "missing")})
    client = ClientSettings.load({"WORKER_AUTH_TOKEN_FILE": str(tmp_path / "missing")})
    with pytest.raises(ConfigError, match=r"WORKER_AUTH_TOKEN_FILE .*a readable file"):
        client.token()
    assert ClientSettings.load({"WORKER_AUTH_TOKEN": "x"}).token() == "x"


def test_the_token_is_a_secret_no_file_holds_and_nothing_shows(tmp_path: Path) -> None:
    config = load_config(env={"WORKER_AUTH_TOKEN": TOKEN})
    assert config.grpc.auth_token == TOKEN
    assert TOKEN not in json.dumps(config.to_json_dict())
    assert TOKEN not in repr(config)
    assert TOKEN not in repr(ClientSettings.load({"WORKER_AUTH_TOKEN": TOKEN}))
    (tmp_path / "worker.json").write_text(json.dumps({"grpcAuthToken": TOKEN}))
    with pytest.raises(ConfigError) as refused:
        load_config(env={"WORKER_CONFIG": str(tmp_path / "worker.json")})
    assert "is a secret: set it with WORKER_AUTH_TOKEN, never in a file" in str(refused.value)
    assert TOKEN not in str(refused.value)
