"""What a client of workers is configured with: its bearer token and its TLS settings.

The command line's client commands and a worker's shadow sender read the same
variables, declared once here with `blockx.settings` (no file, no flags: a
client is configured by its environment). The token is a secret: never shown.
"""

from __future__ import annotations

from collections.abc import Mapping

import attrs

from blockx import settings
from blockx.net.auth import TOKEN_ENV, TOKEN_FILE_ENV, bearer_token
from blockx.net.tls import (
    CA_FILE_ENV,
    CLIENT_CERT_FILE_ENV,
    CLIENT_KEY_FILE_ENV,
    SERVER_NAME_ENV,
    ClientTls,
)
from blockx.settings import STR, setting


@attrs.frozen(kw_only=True)
class ClientSettings:
    auth_token: str = setting("", "authToken", TOKEN_ENV, STR, secret=True)
    """The bearer token the workers require, if they do."""
    auth_token_file: str = setting("", "authTokenFile", TOKEN_FILE_ENV, STR)
    """A file holding that token, instead."""
    tls_ca_file: str = setting("", "tlsCaFile", CA_FILE_ENV, STR)
    """PEM CA certificates to trust for the workers' certificates ("": the system's)."""
    tls_client_cert_file: str = setting("", "tlsClientCertFile", CLIENT_CERT_FILE_ENV, STR)
    """The certificate (chain) to present to a worker that asks for one."""
    tls_client_key_file: str = setting("", "tlsClientKeyFile", CLIENT_KEY_FILE_ENV, STR)
    tls_server_name: str = setting("", "tlsServerName", SERVER_NAME_ENV, STR)
    """The name the workers' certificates carry, when it is not the host dialled."""

    @classmethod
    def load(cls, env: Mapping[str, str] | None = None) -> ClientSettings:
        """The settings `env` (default: the process's environment) gives."""
        return settings.load(cls, env=env)

    def token(self) -> str | None:
        """The bearer token, or None; ConfigError if both forms are set or the file is bad."""
        return bearer_token(self.auth_token, self.auth_token_file, file_setting=TOKEN_FILE_ENV)

    def tls(self) -> ClientTls | None:
        """How to reach workers over TLS, or None (plain text) when no TLS setting is set."""
        files = (self.tls_ca_file, self.tls_client_cert_file, self.tls_client_key_file)
        if not any((*files, self.tls_server_name)):
            return None
        return ClientTls(
            ca_file=self.tls_ca_file,
            cert_file=self.tls_client_cert_file,
            key_file=self.tls_client_key_file,
            server_name=self.tls_server_name,
        )
