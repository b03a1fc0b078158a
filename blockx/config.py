"""The worker's configuration: every setting, where it comes from, and its checks.

Owns `WorkerConfig`, its loading and its conversion into the lower-level
configs (`SlotConfig`, `ExecutorPoolConfig`, `CodeViewConfig`). Must never be
imported by a pure core, and never start anything: it reads the environment
and one file, and that is all.

Each setting is declared once, with `blockx.settings.setting`, as a field of
one of `WorkerConfig`'s sections: its JSON name and its environment variable
beside its default, the only place a default is written (the lower-level
configs have none). Loading in layers (defaults -> the profile's defaults ->
the JSON file named by `WORKER_CONFIG` -> environment variables -> flags),
rendering and errors are `blockx.settings`'s, shared with the hub. Sections are
JSON objects (`worker.*`, `admission.*`) or, where the file names its settings
with a prefix instead (`executorCount`, `etcdEndpoints`, `grpcKeepaliveTimeMs`:
the names the Go worker's configuration uses), groups of top-level JSON names
that the code still reads as one section (`config.executor.count`). Empty text
in a variable means something for text settings: no etcd, derive the address,
read functions from the directory.

A `WorkerConfig` checks itself when it is made, including by building the
lower-level configs, so a value that exists always converts. Every failure is
a `ConfigError` naming the setting by its JSON path.
"""

from __future__ import annotations

import socket
import sys
from collections.abc import Callable, Mapping
from typing import Any, Final

import attrs

from blockx import settings
from blockx.calls import RetryPolicy
from blockx.errors import InvalidValue
from blockx.executors import ExecutorPoolConfig
from blockx.functions import DEFAULT_REDIS_PREFIX, CodeViewConfig
from blockx.settings import (
    BOOL,
    DURATION_MS,
    FLOAT,
    LOG_FORMATS,
    STR,
    ConfigError,
    Kind,
    check_choice,
    check_listen_addr,
    check_positive,
    check_tls_files,
    parse_listen_addr,
    section,
    setting,
)
from blockx.slots import SlotConfig

CONFIG_FILE_ENV = "WORKER_CONFIG"
"""Names the JSON file of the file layer."""

_WILDCARD_HOSTS = frozenset({"", "0.0.0.0", "::"})
_OUTBOUND_PROBE = ("8.8.8.8", 80)
"""Connecting a UDP socket only picks a route; no packet is sent."""


# --- the worker's own kind of value ------------------------------------------------------


def _endpoints_from_text(text: str) -> tuple[str, ...]:
    if text.strip().lower() == "none":
        return ()
    return tuple(part.strip() for part in text.split(",") if part.strip())


def _endpoints_from_json(value: object) -> tuple[str, ...]:
    if isinstance(value, str):
        return _endpoints_from_text(value)
    if isinstance(value, list | tuple) and all(isinstance(item, str) for item in value):
        return tuple(item.strip() for item in value if item.strip())
    raise ValueError('must be a string ("host:port,host:port" or "none") or a list of strings')


_ENDPOINTS = Kind(
    from_json=_endpoints_from_json,
    from_text=_endpoints_from_text,
    to_json=",".join,
    empty_text_is_unset=False,
)
# --- declarations --------------------------------------------------------------------------


@attrs.frozen(kw_only=True)
class WorkerSection:
    """`worker.*`: the slot table's settings."""

    task_slots: int = setting(50, "taskSlots", "TASK_SLOTS")
    default_ttl_ms: int = setting(5_000, "defaultTTLMs")
    task_deadline_ms: int = setting(300_000, "taskDeadlineMs", "TASK_DEADLINE_MS")
    max_task_timeout_ms: int = setting(28_800_000, "maxTaskTimeoutMs", "MAX_TASK_TIMEOUT_MS")
    result_retention_ms: int = setting(300_000, "resultRetentionMs", "RESULT_RETENTION_MS")
    result_retention_bytes: int = setting(
        256 * 1024 * 1024, "resultRetentionBytes", "RESULT_RETENTION_BYTES"
    )
    watch_disconnect_grace_ms: int = setting(
        0, "watchDisconnectGraceMs", "WATCH_DISCONNECT_GRACE_MS"
    )
    default_max_attempts: int = setting(3, "defaultMaxAttempts", "CALL_RETRY_MAX_ATTEMPTS")
    default_base_backoff_ms: int = setting(10, "defaultBaseBackoffMs", "CALL_RETRY_BASE_BACKOFF_MS")
    default_retry_jitter_percent: int = setting(
        5, "defaultRetryJitterPercent", "CALL_RETRY_JITTER_PERCENT"
    )

    def slot_config(self) -> SlotConfig:
        return SlotConfig(
            task_slots=self.task_slots,
            default_ttl_ms=self.default_ttl_ms,
            task_deadline_ms=self.task_deadline_ms,
            max_task_timeout_ms=self.max_task_timeout_ms,
            result_retention_ms=self.result_retention_ms,
            result_retention_bytes=self.result_retention_bytes,
            watch_disconnect_grace_ms=self.watch_disconnect_grace_ms,
            default_retry_policy=RetryPolicy(
                max_attempts=self.default_max_attempts,
                base_backoff_ms=self.default_base_backoff_ms,
                jitter_percent=self.default_retry_jitter_percent,
            ),
        )


@attrs.frozen(kw_only=True)
class AdmissionSection:
    """`admission.*`: how many tasks may be in each phase at once."""

    builder_slots: int = setting(16, "builderSlots", positive=True)
    executor_task_slots: int = setting(
        32, "executorTaskSlots", "EXECUTOR_TASK_SLOTS", positive=True
    )
    plugin_slots: int = setting(16, "pluginSlots", positive=True)
    scan_slots: int = setting(8, "scanSlots", "SCAN_SLOTS", positive=True)


@attrs.frozen(kw_only=True)
class IOSection:
    """`io.*`: how many connections each IO backend may have open at once, worker-wide
    (tasks wait for a free one; see `blockx.io`)."""

    sqlite_connections: int = setting(
        16, "sqliteConnections", "IO_SQLITE_CONNECTIONS", positive=True
    )
    duckdb_connections: int = setting(
        4, "duckdbConnections", "IO_DUCKDB_CONNECTIONS", positive=True
    )
    postgres_connections: int = setting(
        8, "postgresConnections", "IO_POSTGRES_CONNECTIONS", positive=True
    )
    table_database: str = setting("", "tableDatabase", "TABLE_UPSERTS_DATABASE", STR)
    """Where table_upserts writes when a task names no database (a SQLite file,
    duckdb:PATH or a postgresql:// URL); "" for none."""
    bundle_root: str = setting("", "bundleRoot", "BUNDLE_ROOT", STR)
    """The directory bundle_scan reads and bundle_write writes under: a task's bundle path
    is taken relative to it and may not leave it. "" takes paths as given."""

    def limits(self) -> dict[str, int]:
        """The limits by backend name (`blockx.io.BACKENDS`)."""
        return {
            "sqlite": self.sqlite_connections,
            "duckdb": self.duckdb_connections,
            "postgres": self.postgres_connections,
        }


@attrs.frozen(kw_only=True)
class StreamBuildSection:
    """`streamBuild.*`: whether a streaming builder's calls run while it reads (see
    `blockx.phases.builders.StreamingBuilder`), and how far its reads may run ahead."""

    enabled: bool = setting(False, "enabled", "STREAM_BUILD_ENABLED", BOOL)
    pending_calls: int = setting(128, "pendingCalls", "STREAM_BUILD_PENDING_CALLS", positive=True)
    """Calls of one streamed task sent to the dispatcher and not ended, at most: the
    scan waits for room, so its rows in memory stay bounded (pendingCalls x rows per call)."""


@attrs.frozen(kw_only=True)
class DispatcherSection:
    """`dispatcher.*`: how a task's calls are spread over the executors."""

    call_window: int = setting(512, "callWindow", positive=True)
    """Calls of one task in flight at once: enough for one task of short calls to keep
    the queues of its executors deep, so its results come back in large frames (a
    window of 64 cost the worker 8.5-9.2 us of CPU a call on 2 executors, 512 cost
    7.0-7.1). Tasks still take turns for every free place (round robin)."""
    call_deadline_ms: int = setting(60_000, "callDeadlineMs", "CALL_DEADLINE_MS", positive=True)
    executor_capacity: int = setting(512, "executorCapacity", positive=True)
    """The most calls queued on one executor at once (64 until the pace of its results is
    known)."""
    executor_queue_ms: int = setting(50, "executorQueueMs", positive=True)
    """How much work an executor's queue holds, at the pace its results come back: what a
    call of another task may wait behind. Short calls travel in deep batches (up to
    executorCapacity), long ones two at a time (one running, one waiting)."""
    cancel_grace_ms: int = setting(
        2_000, "cancelGraceMs", "EXECUTOR_CANCEL_GRACE_MS", positive=True
    )
    """How long an executor may take to stop a cancelled call (it is interrupted at once)
    before it is killed and replaced; meanwhile it is given no new calls."""


@attrs.frozen(kw_only=True)
class FunctionCodeSection:
    """`functionCode.*` (and `functionSnapshotRetentionMs`): where function code comes from."""

    dir: str = setting("examples/functions", "dir", "FUNCTIONS_DIR", STR)
    """Read when `redis_url` is empty; relative paths are from the current directory."""
    redis_url: str = setting("", "redisUrl", "FUNCTIONS_REDIS_URL", STR)
    redis_prefix: str = setting(DEFAULT_REDIS_PREFIX, "redisPrefix", "FUNCTIONS_REDIS_PREFIX", STR)
    refresh_ms: int = setting(1_000, "refreshMs", "FUNCTIONS_REFRESH_MS", positive=True)


GRPC_LOOPS: Final = ("thread", "trio-asyncio")
"""Where the gRPC server's loop may run (`grpcLoop`; see `blockx.api`)."""

STALL_FLOOR_MS: Final = 30_000
"""The shortest derived stall timeout: GC pauses and a busy host are not wedges."""
STALL_MARGIN_MS: Final = 10_000
"""How long past its call deadline a call may keep its executor's loop still."""


def stall_timeout_for(call_deadline_ms: int) -> int:
    """The derived executor stall timeout: the call deadline plus a margin, at least the floor."""
    return max(call_deadline_ms + STALL_MARGIN_MS, STALL_FLOOR_MS)


@attrs.frozen(kw_only=True)
class ExecutorSection:
    """`executor*`: the executor processes."""

    count: int = setting(8, "executorCount", "EXECUTOR_COUNT")
    restart_enabled: bool = setting(
        True, "executorRestartEnabled", "EXECUTOR_RESTART_ENABLED", BOOL
    )
    restart_delay_ms: int = setting(1_000, "executorRestartDelayMs", "EXECUTOR_RESTART_DELAY_MS")
    max_restarts: int = setting(10, "executorMaxRestarts", "EXECUTOR_MAX_RESTARTS")
    restart_window_ms: int = setting(
        60_000, "executorRestartWindowMs", "EXECUTOR_RESTART_WINDOW_MS"
    )
    restart_backoff_ms: int = setting(
        30_000, "executorRestartBackoffMs", "EXECUTOR_RESTART_BACKOFF_MS"
    )
    heartbeat_interval_ms: int = setting(500, "executorHeartbeatIntervalMs")
    heartbeat_timeout_ms: int = setting(5_000, "executorHeartbeatTimeoutMs")
    stall_timeout_ms: int = setting(0, "executorStallTimeoutMs", "EXECUTOR_STALL_TIMEOUT_MS")
    """How long an executor's loop may stand still with a call running before it is killed
    as wedged. 0 = derived from `dispatcher.callDeadlineMs` (`stall_timeout_for`); a value
    set must exceed the call deadline, or long calls would be killed as wedged."""
    health_check_interval_ms: int = setting(250, "executorHealthCheckIntervalMs")
    start_timeout_ms: int = setting(30_000, "executorStartTimeoutMs")
    """From spawn to an accepted Hello."""
    stop_grace_ms: int = setting(5_000, "executorStopGraceMs")
    max_result_bytes: int = setting(16 * 1024 * 1024, "executorMaxResultBytes")
    send_queue_frames: int = setting(1_024, "executorSendQueueFrames")
    python: str = setting("", "executorPython", kind=STR)
    """The interpreter executors run on; empty = the worker's own."""
    runtime_dir: str = setting("", "executorRuntimeDir", kind=STR)
    """Where the private socket directory is made; empty = the system's temporary directory."""

    def pool_config(self, call_deadline_ms: int) -> ExecutorPoolConfig:
        """The pool's config for calls that may run up to `call_deadline_ms`."""
        return ExecutorPoolConfig(
            executor_count=self.count,
            heartbeat_interval_ms=self.heartbeat_interval_ms,
            heartbeat_timeout_ms=self.heartbeat_timeout_ms,
            stall_timeout_ms=self.stall_timeout_ms or stall_timeout_for(call_deadline_ms),
            health_check_interval_ms=self.health_check_interval_ms,
            start_timeout_ms=self.start_timeout_ms,
            restart_enabled=self.restart_enabled,
            restart_delay_ms=self.restart_delay_ms,
            max_restarts=self.max_restarts,
            restart_window_ms=self.restart_window_ms,
            restart_backoff_ms=self.restart_backoff_ms,
            grace_ms=self.stop_grace_ms,
            max_result_bytes=self.max_result_bytes,
            send_queue_frames=self.send_queue_frames,
            python_executable=self.python or sys.executable,
            runtime_dir_parent=self.runtime_dir or None,
        )


@attrs.frozen(kw_only=True)
class EtcdSection:
    """`etcd*`: registration in etcd and the heartbeat published there."""

    endpoints: tuple[str, ...] = setting(
        ("localhost:2379",), "etcdEndpoints", "ETCD_ENDPOINTS", _ENDPOINTS
    )
    """Empty = no registration (the text forms "" and "none" both give this)."""
    registry_prefix: str = setting(
        "/blockx/workers/", "workerRegistryPrefix", "WORKER_REGISTRY_PREFIX", STR
    )
    """The block profile's prefix; other profiles set theirs in their defaults."""
    lease_ttl_ms: int = setting(10_000, "etcdLeaseTtlMs", "ETCD_LEASE_TTL_MS", positive=True)
    """TTL of the registration lease; etcd raises very short ones to its minimum."""
    heartbeat_interval_ms: int = setting(
        200, "heartbeatIntervalMs", "WORKER_HEARTBEAT_INTERVAL", DURATION_MS, positive=True
    )
    """How often the heartbeat is read and, if it changed, put again: the most its key lags
    behind the worker. 2000 is the usual production value."""
    heartbeat_refresh_ms: int = setting(
        10_000, "heartbeatRefreshMs", "WORKER_HEARTBEAT_REFRESH", DURATION_MS, positive=True
    )
    """How often an unchanged heartbeat is put again anyway; at least `heartbeat_interval_ms`.
    Every put is an etcd revision that each watcher of the fleet receives, so an idle worker
    puts only this often; that it is alive is its lease's to say, not the puts'."""

    @property
    def enabled(self) -> bool:
        return bool(self.endpoints)


@attrs.frozen(kw_only=True)
class HubSection:
    """`hub*`: taking tasks from a hub's queue too, alongside the gRPC API."""

    url: str = setting("", "hubUrl", "WORKER_HUB_URL", STR)
    """The hub (http:// or https://); empty or "none" = the node takes no hub tasks."""
    queue: str = setting("", "hubQueue", "WORKER_HUB_QUEUE", STR)
    """The queue whose tasks the node runs (required with `url`)."""
    credential_file: str = setting("", "hubCredentialFile", "WORKER_HUB_CREDENTIAL_FILE", STR)
    """A file holding the node's worker credential for the hub (required with `url`)."""
    ca_file: str = setting("", "hubCaFile", "WORKER_HUB_CA_FILE", STR)
    """PEM CA certificates to trust for an https hub; empty = the system's."""

    @property
    def enabled(self) -> bool:
        return self.url.lower() not in ("", "none")


@attrs.frozen(kw_only=True)
class GrpcSection:
    """`grpc*`: the gRPC server's transport settings."""

    keepalive_time_ms: int = setting(
        30_000, "grpcKeepaliveTimeMs", "WORKER_GRPC_KEEPALIVE_TIME_MS", positive=True
    )
    keepalive_timeout_ms: int = setting(
        10_000, "grpcKeepaliveTimeoutMs", "WORKER_GRPC_KEEPALIVE_TIMEOUT_MS", positive=True
    )
    max_message_bytes: int = setting(
        16 * 1024 * 1024, "grpcMaxMessageBytes", "WORKER_GRPC_MAX_MESSAGE_BYTES", positive=True
    )
    max_concurrent_streams: int = setting(
        100, "grpcMaxConcurrentStreams", "WORKER_GRPC_MAX_CONCURRENT_STREAMS", positive=True
    )
    """Streams one connection may have open at once: advertised in its SETTINGS, and a
    stream beyond it is refused (RST_STREAM REFUSED_STREAM; see `blockx.api._grpclib`)."""
    max_connections: int = setting(
        500, "grpcMaxConnections", "WORKER_GRPC_MAX_CONNECTIONS", positive=True
    )
    """Connections open at once; one beyond it is closed at once (GOAWAY)."""
    idle_timeout_ms: int = setting(
        600_000, "grpcIdleTimeoutMs", "WORKER_GRPC_IDLE_TIMEOUT_MS", positive=True
    )
    """A connection with no open stream for this long is closed (GOAWAY NO_ERROR)."""
    max_resets: int = setting(200, "grpcMaxResets", "WORKER_GRPC_MAX_RESETS", positive=True)
    """Streams a client may reset within `reset_window_ms` on one connection; one more and
    the connection is closed (GOAWAY ENHANCE_YOUR_CALM): the rapid-reset defence."""
    reset_window_ms: int = setting(
        10_000, "grpcResetWindowMs", "WORKER_GRPC_RESET_WINDOW_MS", positive=True
    )
    """The window `max_resets` counts in, from the first reset in it."""
    loop: str = setting("thread", "grpcLoop", "WORKER_GRPC_LOOP", STR)
    """"thread": the server on uvloop in a thread of its own (faster); "trio-asyncio": on
    trio-asyncio's loop in the worker's one thread (see `blockx.api._bridge`)."""
    pin_loop_threads: bool = setting(True, "pinLoopThreads", "WORKER_PIN_LOOP_THREADS", BOOL)
    """With `loop` "thread": keep Trio's and the server's loop threads on one CPU (they take
    turns holding the GIL; see `blockx.api._affinity`). Other threads and the executors keep
    every CPU the worker was given."""
    auth_token: str = setting("", "grpcAuthToken", "WORKER_AUTH_TOKEN", STR, secret=True)
    """The bearer token every RPC but health must carry (`blockx.net.auth`): a secret,
    from the environment only, never shown. "" and no `auth_token_file`: no token."""
    auth_token_file: str = setting("", "grpcAuthTokenFile", "WORKER_AUTH_TOKEN_FILE", STR)
    """A file holding the bearer token every RPC but health must carry (`blockx.net.auth`;
    the token may also come from WORKER_AUTH_TOKEN). "" and no variable: no token."""
    tls_cert_file: str = setting("", "grpcTlsCertFile", "WORKER_TLS_CERT_FILE", STR)
    """The PEM certificate (chain) the port serves TLS with (`blockx.net.tls`); set with
    `tls_key_file`, or neither (plain text)."""
    tls_key_file: str = setting("", "grpcTlsKeyFile", "WORKER_TLS_KEY_FILE", STR)
    """The certificate's unencrypted PEM private key."""
    tls_client_ca_file: str = setting("", "grpcTlsClientCaFile", "WORKER_TLS_CLIENT_CA_FILE", STR)
    """PEM CA certificates a client's certificate must be signed by (mutual TLS); "" asks
    clients for no certificate. Only with `tls_cert_file`."""

    @property
    def tls_enabled(self) -> bool:
        return bool(self.tls_cert_file)

    def tls_files(self) -> tuple[tuple[str, str], tuple[str, str], tuple[str, str]]:
        """The certificate, key and client CA files, each (path, setting name), as
        `blockx.net.tls.server_context` reads them."""
        return (
            (self.tls_cert_file, "grpcTlsCertFile"),
            (self.tls_key_file, "grpcTlsKeyFile"),
            (self.tls_client_ca_file, "grpcTlsClientCaFile"),
        )


@attrs.frozen(kw_only=True)
class ObservabilitySection:
    """Metrics, the status page, logs and traces."""

    metrics_listen_addr: str = setting(":9464", "metricsListenAddr", "METRICS_LISTEN", STR)
    """Prometheus metrics and the live status page; empty or "none" = off."""
    log_format: str = setting("auto", "logFormat", "LOG_FORMAT", STR)
    """"json" (one object per line), "text", or "auto": text when stderr is a terminal,
    JSON lines otherwise."""
    otel_exporter_endpoint: str = setting(
        "", "otelExporterEndpoint", "OTEL_EXPORTER_OTLP_ENDPOINT", STR
    )
    """OTLP/HTTP endpoint for trace spans; empty = tracing is a no-op."""
    memory_diagnostics_interval_ms: int = setting(
        60_000, "memoryDiagnosticsIntervalMs", "MEMORY_DIAGNOSTICS_INTERVAL_MS", positive=True
    )

    @property
    def metrics_enabled(self) -> bool:
        return self.metrics_listen_addr.lower() not in ("", "none")

    def metrics_host_port(self) -> tuple[str, int]:
        """(host, port) of the metrics and status-page listener."""
        return parse_listen_addr(self.metrics_listen_addr)


@attrs.frozen(kw_only=True)
class ShadowSection:
    """`shadowSubmit*`: mirroring a sample of accepted submits to another worker."""

    target_addr: str = setting("", "shadowSubmitTargetAddr", "SHADOW_SUBMIT_TARGET_ADDR", STR)
    """host:port of a worker that receives a sample of accepted submits; empty = off."""
    sample_rate: float = setting(0.0, "shadowSubmitSampleRate", "SHADOW_SUBMIT_SAMPLE_RATE", FLOAT)
    """Fraction (0..1) of accepted submits mirrored to the shadow target."""

    @property
    def enabled(self) -> bool:
        return (
            bool(self.target_addr) and self.target_addr.lower() != "none" and self.sample_rate > 0
        )


@attrs.frozen(kw_only=True)
class WorkerConfig:
    """Everything a worker process is configured with. Checked when made."""

    listen_addr: str = setting(":8081", "listenAddr", "WORKER_LISTEN", STR)
    worker_addr: str = setting("", "workerAddr", "WORKER_ADDR", STR)
    """Advertised address and etcd key suffix; empty = derived at start."""
    drain_timeout_ms: int = setting(30_000, "drainTimeoutMs", "DRAIN_TIMEOUT_MS", positive=True)
    gc_collect_interval_ms: int = setting(
        60_000, "gcCollectIntervalMs", "GC_COLLECT_INTERVAL_MS", positive=True
    )
    """How often the worker process runs a full garbage collection (see `blockx.app`)."""
    phase_io_timeout_ms: int = setting(
        10_000, "phaseIoTimeoutMs", "PHASE_IO_TIMEOUT_MS", positive=True
    )
    function_snapshot_retention_ms: int = setting(
        0, "functionSnapshotRetentionMs", "FUNCTION_SNAPSHOT_RETENTION_MS"
    )
    """0 = `worker.maxTaskTimeoutMs` + 10 s."""

    worker: WorkerSection = section(WorkerSection, "worker")
    admission: AdmissionSection = section(AdmissionSection, "admission")
    stream_build: StreamBuildSection = section(StreamBuildSection, "streamBuild")
    io: IOSection = section(IOSection, "io")
    dispatcher: DispatcherSection = section(DispatcherSection, "dispatcher")
    function_code: FunctionCodeSection = section(FunctionCodeSection, "functionCode")
    executor: ExecutorSection = section(ExecutorSection)
    etcd: EtcdSection = section(EtcdSection)
    hub: HubSection = section(HubSection)
    grpc: GrpcSection = section(GrpcSection)
    observability: ObservabilitySection = section(ObservabilitySection)
    shadow: ShadowSection = section(ShadowSection)

    def __attrs_post_init__(self) -> None:
        check_positive(self)
        self._check_addresses()
        self._check_choices()
        check_tls_files(*self.grpc.tls_files())
        # The lower-level configs own the rest of the rules (slot table, pool,
        # code retention); building them here keeps one copy of each rule.
        self._check_stall_timeout()
        for convert in (self.worker.slot_config, self.pool_config, self.code_view_config):
            try:
                convert()
            except InvalidValue as error:
                field = _LOWER_LEVEL_ALIASES.get(error.field, error.field)
                raise ConfigError(field=field, value=error.value, allowed=error.allowed) from error

    def _check_stall_timeout(self) -> None:
        stall_ms, deadline_ms = self.executor.stall_timeout_ms, self.dispatcher.call_deadline_ms
        ConfigError.check(
            stall_ms >= 0,
            field="executorStallTimeoutMs",
            value=stall_ms,
            allowed="must be >= 0 (0 derives it from dispatcher.callDeadlineMs)",
        )
        ConfigError.check(
            stall_ms == 0 or stall_ms > deadline_ms,
            field="executorStallTimeoutMs",
            value=stall_ms,
            allowed=f"must be greater than dispatcher.callDeadlineMs ({deadline_ms}), or a "
            "call computing that long is killed as wedged; 0 derives it "
            f"(the call deadline + {STALL_MARGIN_MS} ms, at least {STALL_FLOOR_MS} ms)",
        )

    def _check_addresses(self) -> None:
        for field, addr, optional in (
            ("listenAddr", self.listen_addr, False),
            ("metricsListenAddr", self.observability.metrics_listen_addr, True),
            ("shadowSubmitTargetAddr", self.shadow.target_addr, True),
        ):
            if not optional or addr.lower() not in ("", "none"):
                check_listen_addr(addr, field=field)

    def _check_choices(self) -> None:
        check = ConfigError.check
        check(
            bool(self.etcd.registry_prefix),
            field="workerRegistryPrefix",
            value=self.etcd.registry_prefix,
            allowed="must not be empty",
        )
        check(
            0.0 <= self.shadow.sample_rate <= 1.0,
            field="shadowSubmitSampleRate",
            value=self.shadow.sample_rate,
            allowed="must be between 0 and 1",
        )
        self._check_hub()
        interval_ms = self.etcd.heartbeat_interval_ms
        check(
            self.etcd.heartbeat_refresh_ms >= interval_ms,
            field="heartbeatRefreshMs",
            value=self.etcd.heartbeat_refresh_ms,
            allowed=f"must be >= heartbeatIntervalMs ({interval_ms}): an unchanged heartbeat "
            "cannot be put again more often than the heartbeat is read",
        )
        check_choice(self.grpc.loop, GRPC_LOOPS, field="grpcLoop")
        check_choice(self.observability.log_format, LOG_FORMATS, field="logFormat")
        check(
            bool(self.function_code.redis_url or self.function_code.dir),
            field="functionCode.dir",
            value=self.function_code.dir,
            allowed="must name a directory when functionCode.redisUrl is empty",
        )

    def _check_hub(self) -> None:
        for field, value in (
            ("hubQueue", self.hub.queue),
            ("hubCredentialFile", self.hub.credential_file),
        ):
            ConfigError.check(
                bool(value) or not self.hub.enabled,
                field=field,
                value=value,
                allowed=f"must be set with hubUrl ({self.hub.url})",
            )

    # --- conversions -----------------------------------------------------------------------

    def pool_config(self) -> ExecutorPoolConfig:
        """The executor pool's config, its stall timeout derived if not set."""
        return self.executor.pool_config(self.dispatcher.call_deadline_ms)

    def code_view_config(self) -> CodeViewConfig:
        return CodeViewConfig(
            max_task_timeout_ms=self.worker.max_task_timeout_ms,
            retention_ms=self.function_snapshot_retention_ms,
        )

    def listen_host_port(self) -> tuple[str, int]:
        """(host, port) to bind; ":8081" binds every IPv4 interface."""
        return parse_listen_addr(self.listen_addr)

    def resolve_worker_addr(
        self, bound_port: int, *, outbound_ip: Callable[[], str] | None = None
    ) -> str:
        """The address to advertise once the server is bound to `bound_port`.

        `workerAddr` if set. Otherwise the listen host when it is a specific
        address (advertising another interface would be unreachable), else the
        outbound IPv4 address (`outbound_ipv4`, or `outbound_ip` in tests).
        """
        if self.worker_addr:
            return self.worker_addr
        host, _ = self.listen_host_port()
        if host in _WILDCARD_HOSTS:
            host = (outbound_ip or outbound_ipv4)()
        if ":" in host:
            host = f"[{host}]"
        return f"{host}:{bound_port}"

    def to_json_dict(self) -> dict[str, Any]:
        """The effective configuration under its JSON names (secrets left out); loads back
        to an equal value when no secret is set."""
        return settings.to_json_dict(self)


def default_config() -> WorkerConfig:
    """Every setting at its built-in default."""
    return _DEFAULTS


def outbound_ipv4() -> str:
    """This host's IPv4 address on its default route, or 127.0.0.1 if it has none."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect(_OUTBOUND_PROBE)
            address = str(probe.getsockname()[0])
    except OSError:
        return "127.0.0.1"
    return address if address != "0.0.0.0" else "127.0.0.1"


_LOWER_LEVEL_ALIASES = {"maxTaskTimeoutMs": "worker.maxTaskTimeoutMs"}
"""Lower-level error fields that are not already JSON paths."""

_DEFAULTS = WorkerConfig()


def load_config(
    *,
    profile: Mapping[str, object] | None = None,
    env: Mapping[str, str] | None = None,
    overrides: Mapping[str, object] | None = None,
    flags: Mapping[str, str] | None = None,
    file: str | None = None,
) -> WorkerConfig:
    """Defaults, then `profile` (a profile's defaults), the file (`file`, else the one
    `WORKER_CONFIG` names), `env`, `overrides` (see `blockx.settings.load`)."""
    return settings.load(
        WorkerConfig,
        env=env,
        file_env=CONFIG_FILE_ENV,
        file=file,
        defaults=profile,
        overrides=overrides,
        flags=flags,
    )


__all__ = [
    "CONFIG_FILE_ENV",
    "AdmissionSection",
    "DispatcherSection",
    "EtcdSection",
    "ExecutorSection",
    "FunctionCodeSection",
    "GrpcSection",
    "IOSection",
    "ObservabilitySection",
    "ShadowSection",
    "StreamBuildSection",
    "WorkerConfig",
    "WorkerSection",
    "default_config",
    "load_config",
    "outbound_ipv4",
    "stall_timeout_for",
]
