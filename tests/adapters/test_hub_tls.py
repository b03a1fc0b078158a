"""HTTPS and WSS on the hub's port, in-process over loopback TCP: the hub serves TLS with the
files its settings name, a producer and an automatic worker trusting its CA (`HubClient`'s
`ca_file`) submit, run and read a task, and whatever does not hold the right certificate is
refused without disturbing anyone else. Certificates are made by `trustme` for each test.
"""

from __future__ import annotations

import logging
import ssl
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, Final

import attrs
import pytest
import trio

from blockx.autoworker import HubCertificateRejected, HubClient, Worker, WorkerRunError
from blockx.errors import InvalidValue
from blockx.hub import Hub, HubConfig, Right, Store, create_credential, create_queue
from blockx.hub import _server as hub_server
from blockx.settings import ConfigError
from tests.adapters.autoworker_rig import options
from tests.adapters.certificates import Pki, make_pki
from tests.adapters.hub_harness import CAPABILITY, QUEUE

FAIL_AFTER_S: Final = 10


@pytest.fixture
def pki(tmp_path: Path) -> Pki:
    return make_pki(tmp_path / "pki")


@attrs.frozen
class TlsHub:
    port: int
    token: str
    pki: Pki

    def client(self, scheme: str = "https", **tls: Any) -> HubClient:
        """A client of this hub trusting its CA (unless `tls` says otherwise)."""
        tls.setdefault("ca_file", self.pki.ca_file)
        return HubClient(url=f"{scheme}://127.0.0.1:{self.port}", credential=self.token, **tls)

    async def works(self, client: HubClient) -> dict[str, Any]:
        """`client` submits a task and reads it back."""
        task = await client.submit(QUEUE, CAPABILITY, {"n": 1})
        return await client.task(task["task_id"])


@asynccontextmanager
async def tls_hub(tmp_path: Path, pki: Pki, *, mutual: bool = False) -> AsyncIterator[TlsHub]:
    """A hub on a loopback port, serving TLS with `pki`'s certificate (its settings given by
    the environment variables), with queue `QUEUE` and a producer's and worker's token."""
    store = Store(str(tmp_path / "hub.sqlite3"))
    try:
        hub = Hub(HubConfig.load(env=pki.hub_env(mutual=mutual)), store)
        create_queue(store, QUEUE, hub.now_ms())
        rights = frozenset({Right.PRODUCER, Right.WORKER})
        token = create_credential(store, QUEUE, rights, hub.now_ms())
        async with trio.open_nursery() as nursery:
            port = await nursery.start(hub.run, "127.0.0.1", 0)
            yield TlsHub(port=port, token=token, pki=pki)
            nursery.cancel_scope.cancel()
    finally:
        store.close()


def logged(caplog: pytest.LogCaptureFixture, text: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if text in r.getMessage()]


async def test_a_task_submitted_over_https_is_run_by_a_worker_over_wss_and_read_back(
    tmp_path: Path, pki: Pki, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="blockx.hub")
    with trio.fail_after(FAIL_AFTER_S):
        async with tls_hub(tmp_path, pki) as hub, trio.open_nursery() as nursery:
            worker = Worker(hub.client("wss"), options())
            nursery.start_soon(worker.run)
            producer = hub.client()
            task = await producer.submit(QUEUE, CAPABILITY, {"n": 7})
            while task["state"] != "SUCCEEDED":
                task = await producer.task(task["task_id"], wait_ms=1_000)
            nursery.cancel_scope.cancel()
    assert task["result"] == {"n": 7}
    assert worker.stats().reports_confirmed == 1
    [line] = logged(caplog, "listening on")
    assert line.endswith(f"listening on 127.0.0.1:{hub.port} (https and wss)")


async def test_with_client_certificates_asked_for_only_a_client_with_one_is_served(
    tmp_path: Path, pki: Pki, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="blockx.hub")
    with trio.fail_after(FAIL_AFTER_S):
        async with tls_hub(tmp_path, pki, mutual=True) as hub:
            # TLS 1.3: the client's handshake ends before the hub has seen it has no
            # certificate; the hub's refusal is the end of the connection.
            with pytest.raises(trio.BrokenResourceError) as refused:
                await hub.works(hub.client())
            task = await hub.works(
                hub.client(cert_file=pki.client_cert_file, key_file=pki.client_key_file)
            )
    assert str(refused.value) == (
        "the hub closed the connection before answering (a hub that asks for client "
        "certificates does so when it accepts none: see cert_file and key_file)"
    )
    assert task["state"] == "QUEUED"
    assert logged(caplog, "listening on")[0].endswith(
        f"(https and wss; client certificates signed by a CA of {pki.ca_file})"
    )
    [failed] = logged(caplog, "TLS handshake failed")
    assert "PEER_DID_NOT_RETURN_A_CERTIFICATE" in failed


async def test_a_client_trusting_another_ca_fails_at_once_naming_its_ca_file(
    tmp_path: Path, pki: Pki
) -> None:
    other = make_pki(tmp_path / "other")
    with trio.fail_after(FAIL_AFTER_S):
        async with tls_hub(tmp_path, pki) as hub:
            doubtful = hub.client("wss", ca_file=other.ca_file)
            with pytest.raises(HubCertificateRejected) as rejected:
                await doubtful.open_stream()
            with pytest.raises(HubCertificateRejected):
                await hub.works(doubtful)
            task = await hub.works(hub.client())
    assert str(rejected.value) == (
        f"the hub's certificate at wss://127.0.0.1:{hub.port} did not verify against the CAs "
        f"of ca_file {other.ca_file}: unable to get local issuer certificate"
    )
    assert isinstance(rejected.value.__cause__, ssl.SSLCertVerificationError)
    assert isinstance(rejected.value, trio.BrokenResourceError)
    assert task["state"] == "QUEUED"


async def test_a_worker_trusting_another_ca_ends_its_run_at_once_naming_its_ca_file(
    tmp_path: Path, pki: Pki
) -> None:
    other = make_pki(tmp_path / "other")
    with trio.fail_after(FAIL_AFTER_S):
        async with tls_hub(tmp_path, pki) as hub:
            worker = Worker(hub.client("wss", ca_file=other.ca_file), options())
            with pytest.raises(WorkerRunError) as ended:
                await worker.run()
    assert ended.value.code == "TLS_CERTIFICATE"
    assert str(ended.value) == (
        f"wss://127.0.0.1:{hub.port}: TLS certificate verification failed against the CAs "
        f"of ca_file {other.ca_file}: unable to get local issuer certificate "
        "(unconfirmed results: 0, running: 0)"
    )


async def test_plain_text_and_silent_clients_are_dropped_and_the_hub_serves_on(
    tmp_path: Path, pki: Pki, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A plain-text request gets no answer; a client that says nothing is dropped once
    the handshake's time is up, and meanwhile everyone else is served."""
    caplog.set_level(logging.INFO, logger="blockx.hub")
    monkeypatch.setattr(hub_server, "TLS_HANDSHAKE_TIMEOUT_S", 0.5)
    with trio.fail_after(FAIL_AFTER_S):
        async with (
            tls_hub(tmp_path, pki) as hub,
            await trio.open_tcp_stream("127.0.0.1", hub.port) as silent,
        ):
            with pytest.raises(trio.BrokenResourceError):
                await hub.works(hub.client("http", ca_file=""))
            task = await hub.works(hub.client())
            assert await silent.receive_some() == b""  # the hub closed it
    assert task["state"] == "QUEUED"
    [plain] = logged(caplog, "TLS handshake failed")
    assert "HTTP_REQUEST" in plain
    assert logged(caplog, "TLS handshake took over 0.5 s")


@pytest.mark.parametrize("setting", ["tlsCertFile", "tlsKeyFile", "tlsClientCaFile"])
async def test_a_tls_file_that_cannot_be_used_stops_the_hub_naming_its_setting(
    tmp_path: Path, pki: Pki, setting: str
) -> None:
    files = {"tlsCertFile": pki.cert_file, "tlsKeyFile": pki.key_file}
    files[setting] = pki.ca_file if setting == "tlsKeyFile" else str(tmp_path / "none.pem")
    config = HubConfig.load(env={}, overrides=files)
    store = Store(str(tmp_path / "hub.sqlite3"))
    try:
        with trio.fail_after(FAIL_AFTER_S), pytest.raises(ConfigError) as raised:
            await Hub(config, store).run("127.0.0.1", 0)
    finally:
        store.close()
    assert raised.value.field == setting
    assert raised.value.value == files[setting]


@pytest.mark.parametrize(
    ("env", "error"),
    [
        (
            {"HUB_TLS_CERT_FILE": "hub.pem"},
            "tlsCertFile = 'hub.pem' (from env HUB_TLS_CERT_FILE): needs tlsKeyFile too",
        ),
        (
            {"HUB_TLS_KEY_FILE": "hub.key"},
            "tlsKeyFile = 'hub.key' (from env HUB_TLS_KEY_FILE): needs tlsCertFile too",
        ),
        (
            {"HUB_TLS_CLIENT_CA_FILE": "ca.pem"},
            "tlsClientCaFile = 'ca.pem' (from env HUB_TLS_CLIENT_CA_FILE): needs tlsCertFile "
            "and tlsKeyFile",
        ),
    ],
)
def test_the_tls_settings_go_together(env: dict[str, str], error: str) -> None:
    with pytest.raises(ConfigError) as raised:
        HubConfig.load(env=env)
    assert str(raised.value).startswith(error)


def test_a_client_ca_file_that_cannot_be_read_fails_when_the_client_is_made(
    tmp_path: Path,
) -> None:
    missing = str(tmp_path / "ca.pem")
    with pytest.raises(ConfigError) as raised:
        HubClient(url="wss://hub.example", credential="bxc_x", ca_file=missing)
    assert str(raised.value) == (
        f"ca_file = '{missing}': must be a readable file (No such file or directory)"
    )


@pytest.mark.parametrize(
    ("url", "tls", "error"),
    [
        ("ws://hub.example", {"ca_file": "ca.pem"}, "ca_file='ca.pem' is invalid: only for an"),
        ("http://hub.example", {"ssl_context": ssl.create_default_context()}, "ssl_context="),
        (
            "https://hub.example",
            {"ssl_context": ssl.create_default_context(), "cert_file": "me.pem"},
            "cert_file='me.pem' is invalid: not with ssl_context",
        ),
    ],
)
def test_tls_fields_a_client_cannot_use_are_refused(
    url: str, tls: dict[str, Any], error: str
) -> None:
    with pytest.raises(InvalidValue, match=error):
        HubClient(url=url, credential="bxc_x", **tls)
