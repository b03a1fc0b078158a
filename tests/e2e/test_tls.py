"""TLS and mutual TLS on a real worker's gRPC port: the worker reads its files from the
environment, the command line reaches it with the client's variables and is refused
without them, a bad file stops the start with one line naming its setting (the hub's
too), and no key ever reaches the log or `--print-config`. Certificates are made by
`trustme` per test.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import trio

from blockx._proto.blockx.worker import v1 as pb
from blockx.client import WorkerClient
from tests.adapters.certificates import Pki, make_pki
from tests.e2e.serve_process import EXAMPLES, REPO, serve_process

TOKEN = "s3cret-token-for-tests"
TASK = pb.TaskSpec(
    task_id="t1",
    function_call=pb.FunctionCallConfig(type="call_list"),
    payload=b'[{"function": "demo.add", "args": [40, 2]}]',
    result_handler=pb.ResultHandler(type="result"),
)
BARE_ENV = {
    key: value
    for key, value in os.environ.items()
    if not key.startswith(("WORKER_TLS", "WORKER_AUTH", "WORKER_CONFIG", "HUB_"))
}
"""The test run's environment without any TLS, token or config-file setting."""


async def blockx(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[bytes]:
    """`python -m blockx ARGS` with `env` added to the bare environment; never raises for
    its exit status."""
    return await trio.run_process(
        [sys.executable, "-m", "blockx", *args],
        cwd=REPO,
        env={**BARE_ENV, **env},
        capture_stdout=True,
        capture_stderr=True,
        check=False,
    )


def secrets(pki: Pki) -> list[str]:
    """The base64 body of each private key (what a leak would show of it)."""
    bodies = []
    for key_file in (pki.key_file, pki.client_key_file):
        lines = Path(key_file).read_text().splitlines()
        bodies.append("".join(line for line in lines if not line.startswith("-----")))
    return bodies


async def test_the_cli_and_client_reach_a_mutual_tls_worker_with_the_token(
    tmp_path: Path,
) -> None:
    pki = make_pki(tmp_path / "pki")
    env = {**pki.server_env(mutual=True), "WORKER_AUTH_TOKEN": TOKEN}
    client_env = {**pki.client_env(with_cert=True), "WORKER_AUTH_TOKEN": TOKEN}
    with trio.fail_after(60):
        async with serve_process("--executors", "1", env=env) as worker:
            address = f"127.0.0.1:{worker.port}"
            tls = pki.client(with_cert=True)
            async with WorkerClient.connect(address, token=TOKEN, tls=tls) as client:
                await client.submit(TASK)
                updates = [u async for u in client.watch(["t1"])]
            status = await blockx("status", "--worker", address, env=client_env)
            result = await blockx("result", "t1", "--worker", address, env=client_env)
            plain = await blockx("status", "--worker", address, env={"WORKER_AUTH_TOKEN": TOKEN})
            no_cert = {**pki.client_env(), "WORKER_AUTH_TOKEN": TOKEN}
            without_cert = await blockx("status", "--worker", address, env=no_cert)
    [last] = [u for u in updates if u.is_terminal]
    assert last.result is not None
    assert json.loads(last.result.outputs_json) == [42]
    assert status.returncode == 0, status.stderr
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["result"]["outputs"] == [42]
    assert plain.returncode == 1
    assert b"a worker serving TLS does that to a plain-text client" in plain.stderr
    assert without_cert.returncode == 1
    assert b"a worker asking for client certificates does that" in without_cert.stderr
    log = "\n".join(worker.log)
    assert f"client certificates required, signed by a CA of {pki.ca_file}" in log
    assert TOKEN not in log
    for body in secrets(pki):
        assert body[:64] not in log


async def test_print_config_shows_the_tls_paths_and_never_a_key(tmp_path: Path) -> None:
    pki = make_pki(tmp_path / "pki")
    printed = await blockx("serve", "--print-config", env=pki.server_env(mutual=True))
    assert printed.returncode == 0, printed.stderr
    shown = json.loads(printed.stdout)
    assert (shown["grpcTlsCertFile"], shown["grpcTlsKeyFile"], shown["grpcTlsClientCaFile"]) == (
        pki.cert_file,
        pki.key_file,
        pki.ca_file,
    )
    for body in secrets(pki):
        assert body[:64] not in printed.stdout.decode()


async def test_a_bad_tls_file_stops_the_start_with_one_line_naming_it(tmp_path: Path) -> None:
    pki = make_pki(tmp_path / "pki")
    missing = str(tmp_path / "missing.pem")
    env = {**pki.server_env(), "WORKER_TLS_KEY_FILE": missing, "ETCD_ENDPOINTS": "none"}
    with trio.fail_after(60):
        started = await blockx(
            "serve", "--listen", "127.0.0.1:0", "--functions", str(EXAMPLES), env=env
        )
    assert started.returncode == 1
    lines = started.stderr.decode().splitlines()
    assert lines[-1] == (
        f"blockx: error: grpcTlsKeyFile = {missing!r}: "
        "must be a readable file (No such file or directory)"
    )
    assert "Traceback" not in started.stderr.decode()
    assert "worker ready" not in started.stderr.decode()


async def test_a_hub_with_a_bad_tls_file_exits_at_start_with_one_line_naming_it(
    tmp_path: Path,
) -> None:
    pki = make_pki(tmp_path / "pki")
    env = {**pki.hub_env(), "HUB_TLS_KEY_FILE": pki.ca_file, "LOG_FORMAT": "text"}
    db = str(tmp_path / "hub.sqlite3")
    with trio.fail_after(60):
        started = await blockx("hub", "--listen", "127.0.0.1:0", "--db", db, env=env)
    assert started.returncode == 1
    assert started.stderr.decode() == (
        f"blockx: error: tlsKeyFile = {pki.ca_file!r}: must hold a PEM private key\n"
    )


async def test_a_bad_client_file_is_one_line_naming_its_variable(tmp_path: Path) -> None:
    missing = str(tmp_path / "ca.pem")
    refused = await blockx("status", env={"WORKER_TLS_CA_FILE": missing})
    assert refused.returncode == 1
    assert refused.stderr.decode() == (
        f"blockx: error: WORKER_TLS_CA_FILE = {missing!r}: "
        "must be a readable file (No such file or directory)\n"
    )
