"""Certificates made at test time with `trustme`: a CA, a server's certificate for
127.0.0.1 and localhost (a worker's or a hub's), and a client's, as PEM files, with the
settings that name them."""

from __future__ import annotations

import ssl
from pathlib import Path

import attrs
import trustme

from blockx.net.tls import HTTP1_ALPN, ClientTls, client_context, server_context


@attrs.frozen
class Pki:
    """A CA, the worker's certificate and key, and a client's, as files under one directory."""

    ca_file: str
    cert_file: str
    key_file: str
    client_cert_file: str
    client_key_file: str

    def server_settings(self, *, mutual: bool = False) -> dict[str, object]:
        settings: dict[str, object] = {
            "grpcTlsCertFile": self.cert_file,
            "grpcTlsKeyFile": self.key_file,
        }
        if mutual:
            settings["grpcTlsClientCaFile"] = self.ca_file
        return settings

    def server_env(self, *, mutual: bool = False) -> dict[str, str]:
        """The worker's variables that name the same files as `server_settings`."""
        env = {"WORKER_TLS_CERT_FILE": self.cert_file, "WORKER_TLS_KEY_FILE": self.key_file}
        if mutual:
            env["WORKER_TLS_CLIENT_CA_FILE"] = self.ca_file
        return env

    def client_env(self, *, with_cert: bool = False) -> dict[str, str]:
        """The client's variables that give the same settings as `client`."""
        env = {"WORKER_TLS_CA_FILE": self.ca_file}
        if with_cert:
            env["WORKER_TLS_CLIENT_CERT_FILE"] = self.client_cert_file
            env["WORKER_TLS_CLIENT_KEY_FILE"] = self.client_key_file
        return env

    def hub_env(self, *, mutual: bool = False) -> dict[str, str]:
        """The hub's variables that serve HTTPS and WSS with the server certificate."""
        env = {"HUB_TLS_CERT_FILE": self.cert_file, "HUB_TLS_KEY_FILE": self.key_file}
        if mutual:
            env["HUB_TLS_CLIENT_CA_FILE"] = self.ca_file
        return env

    def hub_server_context(self) -> ssl.SSLContext:
        """A context serving HTTPS and WSS with the server certificate, as a hub's."""
        context = server_context((self.cert_file, "cert"), (self.key_file, "key"), alpn=HTTP1_ALPN)
        assert context is not None
        return context

    def hub_client_context(self) -> ssl.SSLContext:
        """A context of an HTTPS and WSS client trusting this CA, as `HubClient`'s."""
        return client_context((self.ca_file, "ca"), alpn=HTTP1_ALPN)

    def client(self, *, with_cert: bool = False) -> ClientTls:
        if with_cert:
            return ClientTls(
                ca_file=self.ca_file, cert_file=self.client_cert_file, key_file=self.client_key_file
            )
        return ClientTls(ca_file=self.ca_file)


def make_pki(directory: Path) -> Pki:
    """A fresh CA under `directory`, a worker certificate for 127.0.0.1 and localhost, and
    a client certificate."""
    directory.mkdir(parents=True, exist_ok=True)
    ca = trustme.CA()
    server = ca.issue_cert("127.0.0.1", "localhost")
    client = ca.issue_cert("client@blockx.test")
    files = {
        "ca_file": ca.cert_pem,
        "cert_file": server.cert_chain_pems[0],
        "key_file": server.private_key_pem,
        "client_cert_file": client.cert_chain_pems[0],
        "client_key_file": client.private_key_pem,
    }
    for name, blob in files.items():
        blob.write_to_path(str(directory / f"{name}.pem"))
    return Pki(**{name: str(directory / f"{name}.pem") for name in files})
