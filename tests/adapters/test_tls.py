"""TLS and mutual TLS on the gRPC port, in-process: the worker serves TLS with the files its
settings name, a client trusting its CA runs a task, and whatever does not hold the right
certificate is refused. Certificates are made by `trustme` for each test.
"""

from __future__ import annotations

import logging
import ssl
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import attrs
import pytest
import trio
import trio_asyncio
from cryptography.hazmat.primitives import serialization
from grpclib.client import Channel
from grpclib.health.v1.health_grpc import HealthStub
from grpclib.health.v1.health_pb2 import HealthCheckRequest, HealthCheckResponse

from blockx._proto.blockx.worker import v1 as pb
from blockx.app import serve
from blockx.client import (
    ClientSettings,
    PlacementClient,
    WorkerCallError,
    WorkerClient,
    WorkerUnreachable,
)
from blockx.config import load_config
from blockx.discovery import WorkerDirectory, WorkerHeartbeat
from blockx.functions import MemorySource
from blockx.net.tls import ClientTls, server_context
from blockx.profiles import BLOCK
from blockx.settings import ConfigError
from tests.adapters.certificates import Pki, make_pki
from tests.adapters.test_shadow import forwarder_of
from tests.adapters.worker_harness import (
    FakeExecutors,
    call_list_task,
    running_worker,
    worker_config,
)
from tests.worker_results import result_once_there

FAIL_AFTER_S = 10


@pytest.fixture
def pki(tmp_path: Path) -> Pki:
    return make_pki(tmp_path / "pki")


@asynccontextmanager
async def tls_worker(pki: Pki, **settings: object) -> AsyncIterator[str]:
    """A worker serving TLS with `pki`'s certificate; yields its address."""
    config = worker_config(**pki.server_settings(), **settings)
    async with running_worker(config) as worker:
        yield f"127.0.0.1:{worker.serving.port}"


async def run_one(address: str, task_id: str, **connect: object) -> pb.TaskResult:
    """Submit a call_list task through `WorkerClient` and follow it to its result."""
    task = call_list_task(task_id, ("demo.add", [40, 2]), result_handler=pb.ResultHandler("result"))
    async with WorkerClient.connect(address, **connect) as client:  # type: ignore[arg-type]
        await client.submit(task)
        updates = [update async for update in client.watch([task_id])]
    [last] = [update for update in updates if update.is_terminal]
    assert last.result is not None
    return last.result


@pytest.mark.parametrize("loop", ["thread", "trio-asyncio"])
async def test_a_tls_client_runs_a_task_and_health_answers_over_tls(
    pki: Pki, caplog: pytest.LogCaptureFixture, loop: str
) -> None:
    caplog.set_level(logging.INFO, logger="blockx.app")
    with trio.fail_after(FAIL_AFTER_S):
        async with tls_worker(pki, grpcLoop=loop) as address:
            result = await run_one(address, "t1", tls=pki.client())
            status = await health(address, pki.client())
    assert result.state == pb.TaskState.SUCCEEDED
    assert result.outputs_json == "[42]"
    assert status == HealthCheckResponse.SERVING
    [line] = [record.getMessage() for record in caplog.records if "TLS" in record.getMessage()]
    assert line == (f"gRPC port serves TLS with {pki.cert_file}; client certificates not asked for")


async def test_a_plain_text_client_is_refused_and_told_why(pki: Pki) -> None:
    with trio.fail_after(FAIL_AFTER_S):
        async with tls_worker(pki) as address:
            with pytest.raises(WorkerUnreachable) as raised:
                await run_one(address, "t1")
    assert str(raised.value) == (
        f"cannot reach worker at {address}: the worker closed the connection before "
        "answering SubmitTask: a worker serving TLS does that to a plain-text client "
        "(give the client TLS settings: WORKER_TLS_CA_FILE)"
    )


async def test_a_tls_client_of_a_plain_text_worker_is_told_why(pki: Pki) -> None:
    with trio.fail_after(FAIL_AFTER_S):
        async with running_worker(worker_config()) as worker:
            address = f"127.0.0.1:{worker.serving.port}"
            with pytest.raises(WorkerUnreachable, match="WRONG_VERSION_NUMBER") as raised:
                await run_one(address, "t1", tls=pki.client())
    assert str(raised.value).endswith("(a worker serving plain text answers a TLS client so)")


@pytest.mark.parametrize(
    ("trusted", "refusal"),
    [
        ("another CA", "certificate verify failed: unable to get local issuer certificate"),
        ("another name", "Hostname mismatch, certificate is not valid for 'elsewhere'"),
    ],
)
async def test_a_client_checks_the_workers_certificate(
    pki: Pki, tmp_path: Path, trusted: str, refusal: str
) -> None:
    if trusted == "another CA":
        tls = make_pki(tmp_path / "other").client()
    else:
        tls = ClientTls(ca_file=pki.ca_file, server_name="elsewhere")
    with trio.fail_after(FAIL_AFTER_S):
        async with tls_worker(pki) as address:
            with pytest.raises(WorkerUnreachable, match=refusal):
                await run_one(address, "t1", tls=tls)
            named = ClientTls(ca_file=pki.ca_file, server_name="localhost")
            result = await run_one(address, "t2", tls=named)
    assert result.state == pb.TaskState.SUCCEEDED


async def test_mutual_tls_takes_only_a_client_certificate_of_its_ca(
    pki: Pki, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="blockx.app")
    other = make_pki(tmp_path / "other")
    foreign = ClientTls(
        ca_file=pki.ca_file, cert_file=other.client_cert_file, key_file=other.client_key_file
    )
    refused: list[str] = []
    with trio.fail_after(FAIL_AFTER_S):
        async with tls_worker(pki, grpcTlsClientCaFile=pki.ca_file) as address:
            for tls in (pki.client(), foreign):
                with pytest.raises(WorkerUnreachable) as raised:
                    await run_one(address, "t1", tls=tls)
                refused.append(str(raised.value))
            result = await run_one(address, "t1", tls=pki.client(with_cert=True))
            status = await health(address, pki.client(with_cert=True))
    hint = (
        "the worker closed the connection before answering SubmitTask: a worker asking for "
        "client certificates does that to a client without one it accepts "
        "(WORKER_TLS_CLIENT_CERT_FILE)"
    )
    assert refused == [f"cannot reach worker at {address}: {hint}"] * 2
    assert result.state == pb.TaskState.SUCCEEDED
    assert status == HealthCheckResponse.SERVING
    assert any(
        record.getMessage().endswith(
            f"client certificates required, signed by a CA of {pki.ca_file} (mutual TLS)"
        )
        for record in caplog.records
    )


async def test_the_bearer_token_is_checked_over_tls(pki: Pki, tmp_path: Path) -> None:
    (tmp_path / "token").write_text("s3cret\n")
    settings = {"grpcAuthTokenFile": str(tmp_path / "token")}
    with trio.fail_after(FAIL_AFTER_S):
        async with tls_worker(pki, **settings) as address:
            with pytest.raises(WorkerCallError) as raised:
                await run_one(address, "t1", tls=pki.client())
            result = await run_one(address, "t1", tls=pki.client(), token="s3cret")
    assert raised.value.status.name == "UNAUTHENTICATED"
    assert result.state == pb.TaskState.SUCCEEDED


async def test_placement_reaches_workers_over_tls_with_the_token(pki: Pki, tmp_path: Path) -> None:
    (tmp_path / "token").write_text("s3cret\n")
    settings = {"grpcAuthTokenFile": str(tmp_path / "token"), **pki.server_settings(mutual=True)}
    with trio.fail_after(FAIL_AFTER_S):
        async with running_worker(worker_config(**settings)) as worker:
            address = f"127.0.0.1:{worker.serving.port}"
            directory = WorkerDirectory(prefix="/w/")
            heartbeat = WorkerHeartbeat(
                address=address,
                deployment="block",
                slots_total=4,
                reserved_slots=0,
                running_tasks=0,
                free_slots=4,
                executors_healthy=1,
                draining=False,
                version="0.1.0",
                started_at_ms=1_700_000_000_000,
            )
            directory.reset(revision=1, entries=[(f"/w/{address}", heartbeat.to_json(), 1)])
            tls = pki.client(with_cert=True)
            async with PlacementClient.over(directory, token="s3cret", tls=tls) as placement:
                placed = await placement.place(call_list_task("t1", ("demo.add", [1, 2])))
    assert placed.worker_addr == address
    assert placed.response.state == pb.TaskState.RUNNING


async def health(address: str, tls: ClientTls) -> int:
    host, _, port = address.rpartition(":")

    async def check() -> HealthCheckResponse:
        channel = Channel(host, int(port), ssl=tls.context())
        try:
            return await HealthStub(channel).Check(HealthCheckRequest())
        finally:
            channel.close()

    answer: HealthCheckResponse = await trio_asyncio.aio_as_trio(check)()
    return int(answer.status)


# --- the files -------------------------------------------------------------------------------


def garbage(directory: Path) -> str:
    path = directory / "garbage.pem"
    path.write_text("-----BEGIN CERTIFICATE-----\nnot base64 at all\n-----END CERTIFICATE-----\n")
    return str(path)


def encrypted_key(pki: Pki, directory: Path) -> str:
    key = serialization.load_pem_private_key(Path(pki.key_file).read_bytes(), password=None)
    locked = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.BestAvailableEncryption(b"pass"),
    )
    path = directory / "locked.pem"
    path.write_bytes(locked)
    return str(path)


BadFiles = Callable[[Pki, Path], dict[str, str]]
"""The settings that replace the good ones, given the good files and a scratch directory."""

SERVER_CASES: list[tuple[BadFiles, str, str]] = [
    (
        lambda pki, tmp: {"grpcTlsCertFile": str(tmp / "missing.pem")},
        "grpcTlsCertFile",
        "must be a readable file (No such file or directory)",
    ),
    (lambda pki, tmp: {"grpcTlsCertFile": garbage(tmp)}, "grpcTlsCertFile", "must hold a PEM"),
    (
        lambda pki, tmp: {"grpcTlsCertFile": pki.key_file},
        "grpcTlsCertFile",
        "must hold a PEM certificate (chain)",
    ),
    (
        lambda pki, tmp: {"grpcTlsKeyFile": str(tmp)},
        "grpcTlsKeyFile",
        "must be a readable file (Is a directory)",
    ),
    (
        lambda pki, tmp: {"grpcTlsKeyFile": garbage(tmp)},
        "grpcTlsKeyFile",
        "must hold a PEM private key",
    ),
    (
        lambda pki, tmp: {"grpcTlsKeyFile": make_pki(tmp / "other").key_file},
        "grpcTlsKeyFile",
        "must hold the private key of the certificate in grpcTlsCertFile",
    ),
    (
        lambda pki, tmp: {"grpcTlsKeyFile": encrypted_key(pki, tmp)},
        "grpcTlsKeyFile",
        "must hold an unencrypted PEM private key",
    ),
    (
        lambda pki, tmp: {"grpcTlsClientCaFile": garbage(tmp)},
        "grpcTlsClientCaFile",
        "must hold PEM CA certificates",
    ),
    (
        lambda pki, tmp: {"grpcTlsClientCaFile": str(tmp / "missing.pem")},
        "grpcTlsClientCaFile",
        "must be a readable file (No such file or directory)",
    ),
]


@pytest.mark.parametrize(("bad", "field", "allowed"), SERVER_CASES)
def test_a_bad_server_file_is_a_config_error_naming_its_setting(
    pki: Pki, tmp_path: Path, bad: BadFiles, field: str, allowed: str
) -> None:
    settings = {**pki.server_settings(mutual=True), **bad(pki, tmp_path)}
    config = load_config(env={}, overrides=settings)
    with pytest.raises(ConfigError) as raised:
        server_context(*config.grpc.tls_files())
    assert raised.value.field == field
    assert raised.value.value == settings[field]
    assert raised.value.allowed.startswith(allowed)


def test_the_server_context_offers_h2_and_asks_for_certificates_only_with_a_client_ca(
    pki: Pki,
) -> None:
    assert server_context(*load_config(env={}).grpc.tls_files()) is None
    plain_tls = server_context(
        *load_config(env={}, overrides=pki.server_settings()).grpc.tls_files()
    )
    mutual_settings = pki.server_settings(mutual=True)
    mutual = server_context(*load_config(env={}, overrides=mutual_settings).grpc.tls_files())
    assert plain_tls is not None
    assert mutual is not None
    assert plain_tls.verify_mode == ssl.CERT_NONE
    assert mutual.verify_mode == ssl.CERT_REQUIRED
    # Only the client CA file is trusted for client certificates, not the system's CAs.
    assert [ca["subject"] for ca in mutual.get_ca_certs()] == [
        ca["subject"] for ca in ssl_ca_certs(pki.ca_file)
    ]


def ssl_ca_certs(ca_file: str) -> list[dict[str, object]]:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.load_verify_locations(cafile=ca_file)
    return list(context.get_ca_certs())  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("env", "field", "allowed"),
    [
        ({"WORKER_TLS_CA_FILE": "/nowhere/ca.pem"}, "WORKER_TLS_CA_FILE", "must be a readable"),
        (
            {"WORKER_TLS_CLIENT_CERT_FILE": "/c.pem"},
            "WORKER_TLS_CLIENT_CERT_FILE",
            "needs WORKER_TLS_CLIENT_KEY_FILE too",
        ),
        (
            {"WORKER_TLS_CLIENT_KEY_FILE": "/k.pem"},
            "WORKER_TLS_CLIENT_KEY_FILE",
            "needs WORKER_TLS_CLIENT_CERT_FILE too",
        ),
    ],
)
def test_a_bad_client_setting_names_its_variable(
    env: dict[str, str], field: str, allowed: str
) -> None:
    with pytest.raises(ConfigError) as raised:
        client_context(env)
    assert raised.value.field == field
    assert raised.value.allowed.startswith(allowed)


def client_context(env: dict[str, str]) -> ssl.SSLContext | None:
    tls = ClientSettings.load(env).tls()
    return None if tls is None else tls.context()


def test_the_client_settings_come_from_the_variables(pki: Pki) -> None:
    assert ClientSettings.load({}).tls() is None
    assert ClientSettings.load({"WORKER_TLS_CA_FILE": ""}).tls() is None
    env = {
        "WORKER_TLS_CA_FILE": pki.ca_file,
        "WORKER_TLS_CLIENT_CERT_FILE": pki.client_cert_file,
        "WORKER_TLS_CLIENT_KEY_FILE": pki.client_key_file,
        "WORKER_TLS_SERVER_NAME": "localhost",
    }
    tls = ClientSettings.load(env).tls()
    assert tls == attrs.evolve(pki.client(with_cert=True), server_name="localhost")
    context = tls.context()
    assert context.verify_mode == ssl.CERT_REQUIRED
    assert context.check_hostname
    assert ClientSettings.load({"WORKER_TLS_SERVER_NAME": "w1"}).tls() == ClientTls(
        server_name="w1"
    )


async def test_a_token_file_that_cannot_be_read_stops_the_start_before_any_executor(
    tmp_path: Path,
) -> None:
    spawned: list[object] = []

    def executors(*args: object) -> FakeExecutors:
        spawned.append(args)
        raise AssertionError("an executor pool was made")

    config = worker_config(grpcAuthTokenFile=str(tmp_path / "missing"))
    source = MemorySource()
    source.publish({"demo": "def add(a, b):\n    return a + b\n"})  # nothing else to wait for
    with (
        trio.fail_after(FAIL_AFTER_S),
        pytest.raises(ConfigError, match=r"grpcAuthTokenFile .*a readable file"),
    ):
        await serve(config, BLOCK, stop=trio.Event(), source=source, executors=executors)
    assert spawned == []


async def test_shadow_submits_reach_a_target_that_asks_for_the_token_and_mutual_tls(
    pki: Pki, tmp_path: Path
) -> None:
    (tmp_path / "token").write_text("s3cret\n")
    fleet = {"grpcAuthTokenFile": str(tmp_path / "token")}  # one token for the fleet
    # What the primary trusts the target with: the client variables, as the CLI reads them.
    primary_client = ClientSettings.load(pki.client_env(with_cert=True))
    with trio.fail_after(FAIL_AFTER_S):
        async with tls_worker(pki, grpcTlsClientCaFile=pki.ca_file, **fleet) as target:
            config = worker_config(
                shadowSubmitTargetAddr=target, shadowSubmitSampleRate=1.0, **fleet
            )
            async with running_worker(config, client=primary_client) as primary:
                address = f"127.0.0.1:{primary.serving.port}"
                result = await run_one(address, "t1", token="s3cret")
                tls = pki.client(with_cert=True)
                async with WorkerClient.connect(target, token="s3cret", tls=tls) as client:
                    shadow = await result_once_there(client, "t1", poll_s=0.05)
                forwarder = forwarder_of(primary)
    assert (result.state, shadow.state) == (pb.TaskState.SUCCEEDED, pb.TaskState.SUCCEEDED)
    assert (forwarder.sent, forwarder.failed) == (1, 0)


async def test_a_shadow_tls_file_that_cannot_be_read_stops_the_start(tmp_path: Path) -> None:
    client = ClientSettings.load({"WORKER_TLS_CA_FILE": str(tmp_path / "missing.pem")})
    config = worker_config(shadowSubmitTargetAddr="127.0.0.1:9", shadowSubmitSampleRate=1.0)
    with trio.fail_after(FAIL_AFTER_S), pytest.raises(ConfigError) as raised:
        await serve(config, BLOCK, stop=trio.Event(), source=MemorySource(), client=client)
    assert raised.value.field == "WORKER_TLS_CA_FILE"
