"""The hub's settings, declared once with `blockx.settings` (as the worker's are).

`HubConfig.load`: built-in defaults, then the JSON file named by `--config` or
`HUB_CONFIG`, then the environment, then command-line flags; a bad value is a
`ConfigError` naming the setting and where the value came from.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

import attrs

from blockx import settings
from blockx.hub._rules import Timing
from blockx.settings import (
    BOOL,
    LOG_FORMATS,
    STR,
    ConfigError,
    check_choice,
    check_listen_addr,
    check_positive,
    check_tls_files,
    parse_listen_addr,
    setting,
)

CONFIG_FILE_ENV: Final = "HUB_CONFIG"
"""Names the JSON file of the file layer (a `--config` flag wins over it)."""


@attrs.frozen(kw_only=True)
class HubConfig:
    listen_addr: str = setting(":8090", "listenAddr", "HUB_LISTEN", STR)
    """host:port of the worker WebSocket (/v1/worker) and the producer API (/v1/...)."""
    db: str = setting("hub.sqlite3", "db", "HUB_DB", STR)
    """A SQLite file path, or a postgresql:// URL (several hubs may share one database)."""
    lease_ms: int = setting(30_000, "leaseMs", "HUB_LEASE_MS", positive=True)
    """How long a start or a renewal lets an attempt run."""
    offer_ttl_ms: int = setting(10_000, "offerTtlMs", "HUB_OFFER_TTL_MS", positive=True)
    """How long an offered attempt waits for its start."""
    session_ttl_ms: int = setting(15_000, "sessionTtlMs", "HUB_SESSION_TTL_MS", positive=True)
    """A worker connection that says nothing for this long is closed."""
    retry_backoff_ms: int = setting(1_000, "retryBackoffMs", "HUB_RETRY_BACKOFF_MS", positive=True)
    """The wait before a retry, doubling with each attempt."""
    max_retry_backoff_ms: int = setting(
        60_000, "maxRetryBackoffMs", "HUB_MAX_RETRY_BACKOFF_MS", positive=True
    )
    commit_connections: int = setting(
        2, "commitConnections", "HUB_COMMIT_CONNECTIONS", positive=True
    )
    """PostgreSQL: how many connections commit batches at once (a worker session's
    operations are committed in order on one at a time). SQLite commits on one."""
    poll_ms: int = setting(200, "pollMs", "HUB_POLL_MS", positive=True)
    """How often sessions with room look for work other hubs or commands queued (on
    PostgreSQL a safety net: commits that queue work notify every hub at once)."""
    receipt_retention_ms: int = setting(
        86_400_000, "receiptRetentionMs", "HUB_RECEIPT_RETENTION_MS", positive=True
    )
    """How long an answer is kept for a resent message id."""
    task_retention_ms: int = setting(
        7 * 86_400_000, "taskRetentionMs", "HUB_TASK_RETENTION_MS", positive=True
    )
    """How long a task that ended (succeeded, failed; not one that needs review) is kept
    after its end, with its attempts, evidence and history, before it is deleted."""
    drain_timeout_ms: int = setting(10_000, "drainTimeoutMs", "HUB_DRAIN_TIMEOUT_MS", positive=True)
    """At the first SIGINT/SIGTERM: how long commits in flight may take to finish before the
    hub stops anyway (a second signal exits at once)."""
    tls_cert_file: str = setting("", "tlsCertFile", "HUB_TLS_CERT_FILE", STR)
    """The PEM certificate (chain) the port serves HTTPS and WSS with (`blockx.net.tls`);
    set with `tls_key_file`, or neither (plain HTTP and WS)."""
    tls_key_file: str = setting("", "tlsKeyFile", "HUB_TLS_KEY_FILE", STR)
    """The PEM private key of `tls_cert_file`, unencrypted."""
    tls_client_ca_file: str = setting("", "tlsClientCaFile", "HUB_TLS_CLIENT_CA_FILE", STR)
    """PEM CA certificates a client's certificate must be signed by (mutual TLS); "" asks
    clients for no certificate. Only with `tls_cert_file`."""
    metrics_admin_only: bool = setting(False, "metricsAdminOnly", "HUB_METRICS_ADMIN_ONLY", BOOL)
    """Whether `GET /metrics` needs an admin credential (`Authorization: Bearer`); without,
    anyone who reaches the port reads it: queue names and counts, nothing of tasks."""
    log_format: str = setting("auto", "logFormat", "LOG_FORMAT", STR)
    """"json" (one object per line), "text", or "auto": text on a terminal, else JSON."""

    def __attrs_post_init__(self) -> None:
        check_positive(self)
        check_listen_addr(self.listen_addr, field="listenAddr")
        ConfigError.check(bool(self.db), field="db", value=self.db, allowed="must not be empty")
        ConfigError.check(
            self.max_retry_backoff_ms >= self.retry_backoff_ms,
            field="maxRetryBackoffMs",
            value=self.max_retry_backoff_ms,
            allowed=f"must be >= retryBackoffMs ({self.retry_backoff_ms})",
        )
        check_choice(self.log_format, LOG_FORMATS, field="logFormat")
        check_tls_files(*self.tls_files())

    def listen_host_port(self) -> tuple[str, int]:
        return parse_listen_addr(self.listen_addr)

    def tls_files(self) -> tuple[tuple[str, str], tuple[str, str], tuple[str, str]]:
        """Certificate, key and client CA, each (path, setting name), as
        `blockx.net.tls.server_context` reads them."""
        return (
            (self.tls_cert_file, "tlsCertFile"),
            (self.tls_key_file, "tlsKeyFile"),
            (self.tls_client_ca_file, "tlsClientCaFile"),
        )

    @property
    def retention_sweep_ms(self) -> int:
        """How often the hub deletes what outlived its retention: a tenth of the shorter
        retention, from 10 ms to a minute."""
        shorter = min(self.task_retention_ms, self.receipt_retention_ms)
        return min(max(shorter // 10, 10), 60_000)

    @property
    def timing(self) -> Timing:
        return Timing(
            lease_ms=self.lease_ms,
            offer_ttl_ms=self.offer_ttl_ms,
            retry_backoff_ms=self.retry_backoff_ms,
            max_retry_backoff_ms=self.max_retry_backoff_ms,
        )

    @classmethod
    def load(
        cls,
        env: Mapping[str, str] | None = None,
        overrides: Mapping[str, object] | None = None,
        *,
        flags: Mapping[str, str] | None = None,
        file: str | None = None,
    ) -> HubConfig:
        """Defaults, then the file (`file`, else the one `HUB_CONFIG` names), `env` (default
        `os.environ`), `overrides` (JSON path -> value; None = not given; `flags` names the
        flag of each, for errors)."""
        return settings.load(
            cls, env=env, file_env=CONFIG_FILE_ENV, file=file, overrides=overrides, flags=flags
        )
