"""TLS contexts from certificate files: the worker's gRPC port and the hub's port, and their
clients.

The worker serves TLS when `grpcTlsCertFile` and `grpcTlsKeyFile` are set
(`WORKER_TLS_CERT_FILE`, `WORKER_TLS_KEY_FILE`), and mutual TLS when
`grpcTlsClientCaFile` (`WORKER_TLS_CLIENT_CA_FILE`) is set too: then a client
must present a certificate signed by a CA of that file, and no other CA is
trusted for it (`server_context`). A client (`ClientTls`, made from the
settings `blockx.client.ClientSettings` reads: `WORKER_TLS_CA_FILE`,
`WORKER_TLS_CLIENT_CERT_FILE`, `WORKER_TLS_CLIENT_KEY_FILE`,
`WORKER_TLS_SERVER_NAME`) trusts the CAs of its CA file, or the system's when
it names none, and presents its own certificate if it has one. Reads no
environment itself: the settings arrive as values.

The hub takes the same files from its own settings (`tlsCertFile`,
`tlsKeyFile`, `tlsClientCaFile`, see `blockx.hub.HubConfig`), and the automatic
worker's `HubClient` from its `ca_file`, `cert_file` and `key_file`: both name
their fields, and offer HTTP/1.1, by the `alpn` argument.

Both sides speak TLS 1.2 or later and, unless told otherwise, offer only
HTTP/2 by ALPN (`h2`), which gRPC clients such as grpcio require. A file that
cannot be read or is not what its setting needs is a ConfigError naming the
setting, raised when the context is made (at the start of the worker or the
hub; when a client connects, or a `HubClient` is made). Must never log a
file's contents, nor put them into an error: errors carry paths.
"""

from __future__ import annotations

import ssl
from collections.abc import Sequence
from typing import Final

import attrs

from blockx.settings import ConfigError, check_paired

CA_FILE_ENV: Final = "WORKER_TLS_CA_FILE"
CLIENT_CERT_FILE_ENV: Final = "WORKER_TLS_CLIENT_CERT_FILE"
CLIENT_KEY_FILE_ENV: Final = "WORKER_TLS_CLIENT_KEY_FILE"
SERVER_NAME_ENV: Final = "WORKER_TLS_SERVER_NAME"

ALPN_PROTOCOLS: Final = ("h2",)
HTTP1_ALPN: Final = ("http/1.1",)
"""What the hub's port speaks (HTTP/1.1 and its WebSocket upgrade), offered by ALPN."""
TLS12_CIPHERS: Final = "ECDHE+AESGCM:ECDHE+CHACHA20:DHE+AESGCM:DHE+CHACHA20"
"""The TLS 1.2 suites HTTP/2 allows (RFC 7540, 9.2.2) that grpclib's own client offers;
TLS 1.3 suites are not affected by this list."""


def server_context(
    cert: tuple[str, str],
    key: tuple[str, str],
    client_ca: tuple[str, str] = ("", ""),
    *,
    alpn: Sequence[str] = ALPN_PROTOCOLS,
) -> ssl.SSLContext | None:
    """A server's TLS context, from the files of its settings, each (path, setting name),
    or None when no certificate is set (it serves plain text). With a client CA, clients
    must present a certificate it signed. ConfigError naming the setting whose file cannot
    be read or holds the wrong thing."""
    if not cert[0]:
        return None
    context = _context(ssl.PROTOCOL_TLS_SERVER, alpn)
    _load_identity(context, cert, key)
    if client_ca[0]:
        # Only this file's CAs: a server context trusts nothing else for client certificates.
        _load_cas(context, *client_ca)
        context.verify_mode = ssl.CERT_REQUIRED
    return context


@attrs.frozen(kw_only=True)
class ClientTls:
    """How a client reaches a worker over TLS. Errors name each field by its variable:

    `ca_file` (`WORKER_TLS_CA_FILE`): PEM CA certificates to trust for the worker's
    certificate; "" trusts the system's CAs. `cert_file` and `key_file`
    (`WORKER_TLS_CLIENT_CERT_FILE`, `WORKER_TLS_CLIENT_KEY_FILE`): the certificate
    (chain) and key to present to a worker that asks for one, both or neither.
    `server_name` (`WORKER_TLS_SERVER_NAME`): the name the worker's certificate must
    carry, when it is not the host dialled (an IP address, a load balancer's name).
    """

    ca_file: str = ""
    cert_file: str = ""
    key_file: str = ""
    server_name: str = ""

    def __attrs_post_init__(self) -> None:
        check_paired((self.cert_file, CLIENT_CERT_FILE_ENV), (self.key_file, CLIENT_KEY_FILE_ENV))

    def context(self) -> ssl.SSLContext:
        """A context checking the worker's certificate and name, with the files read now."""
        return client_context(
            (self.ca_file, CA_FILE_ENV),
            (self.cert_file, CLIENT_CERT_FILE_ENV),
            (self.key_file, CLIENT_KEY_FILE_ENV),
        )


def client_context(
    ca: tuple[str, str],
    cert: tuple[str, str] = ("", ""),
    key: tuple[str, str] = ("", ""),
    *,
    alpn: Sequence[str] = ALPN_PROTOCOLS,
) -> ssl.SSLContext:
    """A client's TLS context checking the server's certificate and name, from files, each
    (path, the name of the setting or field that gave it): the CAs of `ca`, else the
    system's, and the client's own certificate and key, if given (both or neither).
    ConfigError naming the field whose file cannot be read or holds the wrong thing."""
    check_paired(cert, key)
    context = _context(ssl.PROTOCOL_TLS_CLIENT, alpn)  # verifies the certificate and its name
    if ca[0]:
        _load_cas(context, *ca)
    else:
        context.load_default_certs(ssl.Purpose.SERVER_AUTH)
    if cert[0]:
        _load_identity(context, cert, key)
    return context


def _context(protocol: int, alpn: Sequence[str]) -> ssl.SSLContext:
    context = ssl.SSLContext(protocol)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.set_ciphers(TLS12_CIPHERS)
    context.set_alpn_protocols(list(alpn))
    return context


def _check_readable(path: str, field: str) -> None:
    """ConfigError naming `field` unless `path` can be read: OpenSSL's own error would not
    say which file it could not open."""
    try:
        with open(path, "rb") as file:
            file.read(1)
    except OSError as error:
        reason = error.strerror or type(error).__name__
        raise ConfigError(
            field=field, value=path, allowed=f"must be a readable file ({reason})"
        ) from error


def _load_cas(context: ssl.SSLContext, path: str, field: str) -> None:
    _check_readable(path, field)
    try:
        context.load_verify_locations(cafile=path)
    except ssl.SSLError as error:
        raise ConfigError(
            field=field, value=path, allowed="must hold PEM CA certificates"
        ) from error


class _EncryptedKey(Exception):
    """The key file asked for a password (OpenSSL would otherwise prompt on the terminal)."""


def _no_password() -> str:
    raise _EncryptedKey


def _load_identity(context: ssl.SSLContext, cert: tuple[str, str], key: tuple[str, str]) -> None:
    """Load the certificate (chain) and its key, each (path, setting), naming the setting
    at fault: the certificate is checked on its own first, so a failure of the pair after
    that is the key's."""
    (cert_path, cert_field), (key_path, key_field) = cert, key
    _check_readable(cert_path, cert_field)
    try:
        ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT).load_verify_locations(cafile=cert_path)
    except ssl.SSLError as error:
        raise ConfigError(
            field=cert_field, value=cert_path, allowed="must hold a PEM certificate (chain)"
        ) from error
    _check_readable(key_path, key_field)
    try:
        context.load_cert_chain(cert_path, key_path, password=_no_password)
    except _EncryptedKey as error:
        raise ConfigError(
            field=key_field, value=key_path, allowed="must hold an unencrypted PEM private key"
        ) from error
    except ssl.SSLError as error:
        allowed = (
            f"must hold the private key of the certificate in {cert_field}"
            if error.reason == "KEY_VALUES_MISMATCH"
            else "must hold a PEM private key"
        )
        raise ConfigError(field=key_field, value=key_path, allowed=allowed) from error
    except OSError as error:  # a file went away since it was checked
        reason = error.strerror or type(error).__name__
        raise ConfigError(
            field=key_field, value=key_path, allowed=f"must be a readable file ({reason})"
        ) from error
