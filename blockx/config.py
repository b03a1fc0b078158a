"""The worker's configuration: every setting, where it comes from, and its checks.

Owns `WorkerConfig`, its loading and its conversion into the lower-level
configs (`SlotConfig`, `ExecutorPoolConfig`, `CodeViewConfig`). Must never be
imported by a pure core, and never start anything: it reads the environment
and one file, and that is all.

Theory of operation:

* Each setting is declared once, as a field of one of `WorkerConfig`'s
  sections, with its JSON name and its environment variable beside its
  default; this is the only place a default is written (the lower-level
  configs have none). `_SETTINGS` is the flat table walked from those
  declarations; the file, the environment, the overrides and `to_json_dict`
  all work from it.
* A section is a JSON object (`worker.*`, `admission.*`) or, where the file
  names its settings with a prefix instead (`executorCount`, `etcdEndpoints`,
  `grpcKeepaliveTimeMs`: the names the Go worker's configuration uses), a group
  of top-level JSON names that the code still reads as one section
  (`config.executor.count`).
* Layers, later ones win: built-in defaults -> the profile's defaults -> the
  JSON file named by `WORKER_CONFIG` (only the keys it holds) -> environment
  variables -> explicit overrides (command-line flags). The loader records
  which layer gave each value, so an error can say where a bad value came from.
* An empty environment variable counts as unset for numbers, booleans and
  durations (a templated `TASK_SLOTS=` should not break the worker) but as a
  value for text settings, where empty means something: no etcd, derive the
  address, read functions from the directory.
* A `WorkerConfig` checks itself when it is made, including by building the
  lower-level configs, so a value that exists always converts. Every failure
  is a `ConfigError` naming the setting by its JSON path.
"""

from __future__ import annotations

import decimal
import difflib
import functools
import json
import os
import re
import socket
import sys
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Final, TypeVar

import attrs

from blockx.calls import RetryPolicy
from blockx.errors import InvalidValue, shown
from blockx.executors import ExecutorPoolConfig
from blockx.functions import DEFAULT_REDIS_PREFIX, CodeViewConfig
from blockx.slots import SlotConfig

CONFIG_FILE_ENV = "WORKER_CONFIG"
"""Names the JSON file of the file layer."""

_WILDCARD_HOSTS = frozenset({"", "0.0.0.0", "::"})
_OUTBOUND_PROBE = ("8.8.8.8", 80)
"""Connecting a UDP socket only picks a route; no packet is sent."""


class ConfigError(InvalidValue):
    """A setting is missing its form or out of range. `field` is its JSON path.

    `source` says which layer gave the value ("default", "profile",
    "file /etc/worker.json", "env TASK_SLOTS", "override") when that is known.
    """

    def __init__(
        self, *, field: str, value: object, allowed: str, source: str | None = None
    ) -> None:
        self.source = source
        super().__init__(field=field, value=value, allowed=allowed)

    def describe(self) -> str:
        where = f" (from {self.source})" if self.source else ""
        return f"{self.field} = {shown(self.value)}{where}: {self.allowed}"

    def from_source(self, source: str | None) -> ConfigError:
        return ConfigError(field=self.field, value=self.value, allowed=self.allowed, source=source)


# --- kinds of value ------------------------------------------------------------------------
#
# A kind reads a value from JSON (or an override) and from environment text,
# and renders it back to JSON. Readers raise ValueError("must be ...") which
# the loader turns into a ConfigError carrying the path and the source.


def _int_from_json(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError("must be an integer")
    return value


def _int_from_text(text: str) -> int:
    if not re.fullmatch(r"[+-]?[0-9]+", text.strip()):
        raise ValueError("must be an integer")
    return int(text)


def _bool_from_json(value: object) -> bool:
    if not isinstance(value, bool):
        raise ValueError("must be true or false")
    return value


_TRUE_TEXTS = frozenset({"1", "t", "true", "yes", "on"})
_FALSE_TEXTS = frozenset({"0", "f", "false", "no", "off"})


def _bool_from_text(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in _TRUE_TEXTS:
        return True
    if lowered in _FALSE_TEXTS:
        return False
    raise ValueError("must be true or false (also 1/0, yes/no, on/off)")


def _str_from_json(value: object) -> str:
    if not isinstance(value, str):
        raise ValueError("must be a string")
    return value


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


_DURATION_UNITS_NS = {
    "ns": 1,
    "us": 1_000,
    "\u00b5s": 1_000,  # micro sign, as Go accepts
    "\u03bcs": 1_000,  # Greek mu, as Go accepts
    "ms": 1_000_000,
    "s": 1_000_000_000,
    "m": 60_000_000_000,
    "h": 3_600_000_000_000,
}
_DURATION_PART = re.compile(r"([0-9]+(?:\.[0-9]*)?|\.[0-9]+)(ns|us|\u00b5s|\u03bcs|ms|s|m|h)")
_DURATION_FORM = "must be a Go duration such as 2s, 200ms or 1m30s"


def parse_duration_ms(text: str) -> int:
    """Whole milliseconds of a Go duration ("2s", "1m30s", "1.5h", "0"), truncated like Go's.

    Raises ValueError for anything Go's `time.ParseDuration` refuses.
    """
    body = text.strip()
    sign = -1 if body.startswith("-") else 1
    if body.startswith(("-", "+")):
        body = body[1:]
    if body == "0":
        return 0
    total_ns = decimal.Decimal(0)
    position = 0
    while position < len(body):
        part = _DURATION_PART.match(body, position)
        if part is None:
            raise ValueError(_DURATION_FORM)
        total_ns += decimal.Decimal(part[1]) * _DURATION_UNITS_NS[part[2]]
        position = part.end()
    if position == 0:
        raise ValueError(_DURATION_FORM)
    return sign * int(total_ns / 1_000_000)


@attrs.frozen
class _Kind:
    from_json: Callable[[object], object]
    from_text: Callable[[str], object]
    to_json: Callable[[Any], object] = lambda value: value
    empty_text_is_unset: bool = True


_INT = _Kind(from_json=_int_from_json, from_text=_int_from_text)
_BOOL = _Kind(from_json=_bool_from_json, from_text=_bool_from_text)
_STR = _Kind(from_json=_str_from_json, from_text=str, empty_text_is_unset=False)
_ENDPOINTS = _Kind(
    from_json=_endpoints_from_json,
    from_text=_endpoints_from_text,
    to_json=",".join,
    empty_text_is_unset=False,
)
_DURATION_MS = _Kind(from_json=_int_from_json, from_text=parse_duration_ms)
"""Milliseconds in JSON, a Go duration in the environment."""


def _float_from_json(value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError("must be a number")
    return float(value)


def _float_from_text(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise ValueError("must be a number") from None


_FLOAT = _Kind(from_json=_float_from_json, from_text=_float_from_text)


# --- declarations --------------------------------------------------------------------------

_SETTING_KEY = "blockx.config.setting"
_GROUP_KEY = "blockx.config.group"


@attrs.frozen
class _Declared:
    json_name: str
    env: str | None
    kind: _Kind
    positive: bool


def _setting(
    default: object,
    json_name: str,
    env: str | None = None,
    kind: _Kind = _INT,
    *,
    positive: bool = False,
) -> Any:
    """A setting: its default, JSON name, environment variable, kind; `positive`: must be > 0."""
    declared = _Declared(json_name, env, kind, positive)
    return attrs.field(default=default, metadata={_SETTING_KEY: declared})


def _section(json_name: str = "") -> dict[str, object]:
    """Metadata of a section field (its class is the field's factory): a JSON object
    `json_name`, or ("") settings with top-level JSON names."""
    return {_GROUP_KEY: json_name}


@attrs.frozen(kw_only=True)
class WorkerSection:
    """`worker.*`: the slot table's settings."""

    task_slots: int = _setting(50, "taskSlots", "TASK_SLOTS")
    default_ttl_ms: int = _setting(5_000, "defaultTTLMs")
    task_deadline_ms: int = _setting(300_000, "taskDeadlineMs", "TASK_DEADLINE_MS")
    max_task_timeout_ms: int = _setting(28_800_000, "maxTaskTimeoutMs", "MAX_TASK_TIMEOUT_MS")
    result_retention_ms: int = _setting(300_000, "resultRetentionMs", "RESULT_RETENTION_MS")
    watch_disconnect_grace_ms: int = _setting(
        0, "watchDisconnectGraceMs", "WATCH_DISCONNECT_GRACE_MS"
    )
    default_max_attempts: int = _setting(3, "defaultMaxAttempts", "CALL_RETRY_MAX_ATTEMPTS")
    default_base_backoff_ms: int = _setting(
        10, "defaultBaseBackoffMs", "CALL_RETRY_BASE_BACKOFF_MS"
    )
    default_retry_jitter_percent: int = _setting(
        5, "defaultRetryJitterPercent", "CALL_RETRY_JITTER_PERCENT"
    )

    def slot_config(self) -> SlotConfig:
        return SlotConfig(
            task_slots=self.task_slots,
            default_ttl_ms=self.default_ttl_ms,
            task_deadline_ms=self.task_deadline_ms,
            max_task_timeout_ms=self.max_task_timeout_ms,
            result_retention_ms=self.result_retention_ms,
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

    builder_slots: int = _setting(16, "builderSlots", positive=True)
    executor_task_slots: int = _setting(
        32, "executorTaskSlots", "EXECUTOR_TASK_SLOTS", positive=True
    )
    plugin_slots: int = _setting(16, "pluginSlots", positive=True)
    scan_slots: int = _setting(8, "scanSlots", "SCAN_SLOTS", positive=True)


@attrs.frozen(kw_only=True)
class IOSection:
    """`io.*`: how many connections each IO backend may have open at once, worker-wide
    (tasks wait for a free one; see `blockx.io`)."""

    sqlite_connections: int = _setting(
        16, "sqliteConnections", "IO_SQLITE_CONNECTIONS", positive=True
    )
    duckdb_connections: int = _setting(
        4, "duckdbConnections", "IO_DUCKDB_CONNECTIONS", positive=True
    )
    postgres_connections: int = _setting(
        8, "postgresConnections", "IO_POSTGRES_CONNECTIONS", positive=True
    )
    table_database: str = _setting("", "tableDatabase", "TABLE_UPSERTS_DATABASE", _STR)
    """Where table_upserts writes when a task names no database (a SQLite file,
    duckdb:PATH or a postgresql:// URL); "" for none."""
    bundle_root: str = _setting("", "bundleRoot", "BUNDLE_ROOT", _STR)
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

    enabled: bool = _setting(False, "enabled", "STREAM_BUILD_ENABLED", _BOOL)
    pending_calls: int = _setting(128, "pendingCalls", "STREAM_BUILD_PENDING_CALLS", positive=True)
    """Calls of one streamed task sent to the dispatcher and not ended, at most: the
    scan waits for room, so its rows in memory stay bounded (pendingCalls x rows per call)."""


@attrs.frozen(kw_only=True)
class DispatcherSection:
    """`dispatcher.*`: how a task's calls are spread over the executors."""

    call_window: int = _setting(64, "callWindow", positive=True)
    """Calls of one task in flight at once."""
    call_deadline_ms: int = _setting(60_000, "callDeadlineMs", "CALL_DEADLINE_MS", positive=True)
    executor_capacity: int = _setting(64, "executorCapacity", positive=True)
    cancel_grace_ms: int = _setting(
        2_000, "cancelGraceMs", "EXECUTOR_CANCEL_GRACE_MS", positive=True
    )
    """How long an executor may take to stop a cancelled call (it is interrupted at once)
    before it is killed and replaced; meanwhile it is given no new calls."""
    """Calls queued on one executor at once."""


@attrs.frozen(kw_only=True)
class FunctionCodeSection:
    """`functionCode.*` (and `functionSnapshotRetentionMs`): where function code comes from."""

    dir: str = _setting("examples/functions", "dir", "FUNCTIONS_DIR", _STR)
    """Read when `redis_url` is empty; relative paths are from the current directory."""
    redis_url: str = _setting("", "redisUrl", "FUNCTIONS_REDIS_URL", _STR)
    redis_prefix: str = _setting(
        DEFAULT_REDIS_PREFIX, "redisPrefix", "FUNCTIONS_REDIS_PREFIX", _STR
    )
    refresh_ms: int = _setting(1_000, "refreshMs", "FUNCTIONS_REFRESH_MS", positive=True)


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

    count: int = _setting(8, "executorCount", "EXECUTOR_COUNT")
    restart_enabled: bool = _setting(
        True, "executorRestartEnabled", "EXECUTOR_RESTART_ENABLED", _BOOL
    )
    restart_delay_ms: int = _setting(1_000, "executorRestartDelayMs", "EXECUTOR_RESTART_DELAY_MS")
    max_restarts: int = _setting(10, "executorMaxRestarts", "EXECUTOR_MAX_RESTARTS")
    restart_window_ms: int = _setting(
        60_000, "executorRestartWindowMs", "EXECUTOR_RESTART_WINDOW_MS"
    )
    restart_backoff_ms: int = _setting(
        30_000, "executorRestartBackoffMs", "EXECUTOR_RESTART_BACKOFF_MS"
    )
    heartbeat_interval_ms: int = _setting(500, "executorHeartbeatIntervalMs")
    heartbeat_timeout_ms: int = _setting(5_000, "executorHeartbeatTimeoutMs")
    stall_timeout_ms: int = _setting(0, "executorStallTimeoutMs", "EXECUTOR_STALL_TIMEOUT_MS")
    """How long an executor's loop may stand still with a call running before it is killed
    as wedged. 0 = derived from `dispatcher.callDeadlineMs` (`stall_timeout_for`); a value
    set must exceed the call deadline, or long calls would be killed as wedged."""
    health_check_interval_ms: int = _setting(250, "executorHealthCheckIntervalMs")
    start_timeout_ms: int = _setting(30_000, "executorStartTimeoutMs")
    """From spawn to an accepted Hello."""
    stop_grace_ms: int = _setting(5_000, "executorStopGraceMs")
    max_result_bytes: int = _setting(16 * 1024 * 1024, "executorMaxResultBytes")
    send_queue_frames: int = _setting(1_024, "executorSendQueueFrames")
    python: str = _setting("", "executorPython", kind=_STR)
    """The interpreter executors run on; empty = the worker's own."""
    runtime_dir: str = _setting("", "executorRuntimeDir", kind=_STR)
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

    endpoints: tuple[str, ...] = _setting(
        ("localhost:2379",), "etcdEndpoints", "ETCD_ENDPOINTS", _ENDPOINTS
    )
    """Empty = no registration (the text forms "" and "none" both give this)."""
    registry_prefix: str = _setting(
        "/blockx/workers/", "workerRegistryPrefix", "WORKER_REGISTRY_PREFIX", _STR
    )
    """The block profile's prefix; other profiles set theirs in their defaults."""
    lease_ttl_ms: int = _setting(10_000, "etcdLeaseTtlMs", "ETCD_LEASE_TTL_MS", positive=True)
    """TTL of the registration lease; etcd raises very short ones to its minimum."""
    heartbeat_interval_ms: int = _setting(
        200, "heartbeatIntervalMs", "WORKER_HEARTBEAT_INTERVAL", _DURATION_MS, positive=True
    )
    """How often the heartbeat is republished; 2000 is the usual production value."""

    @property
    def enabled(self) -> bool:
        return bool(self.endpoints)


@attrs.frozen(kw_only=True)
class GrpcSection:
    """`grpc*`: the gRPC server's transport settings."""

    keepalive_time_ms: int = _setting(
        30_000, "grpcKeepaliveTimeMs", "WORKER_GRPC_KEEPALIVE_TIME_MS", positive=True
    )
    keepalive_timeout_ms: int = _setting(
        10_000, "grpcKeepaliveTimeoutMs", "WORKER_GRPC_KEEPALIVE_TIMEOUT_MS", positive=True
    )
    max_message_bytes: int = _setting(
        16 * 1024 * 1024, "grpcMaxMessageBytes", "WORKER_GRPC_MAX_MESSAGE_BYTES", positive=True
    )
    loop: str = _setting("thread", "grpcLoop", "WORKER_GRPC_LOOP", _STR)
    """"thread": the server on uvloop in a thread of its own (faster); "trio-asyncio": on
    trio-asyncio's loop in the worker's one thread (see `blockx.api._bridge`)."""
    pin_loop_threads: bool = _setting(True, "pinLoopThreads", "WORKER_PIN_LOOP_THREADS", _BOOL)
    """With `loop` "thread": keep Trio's and the server's loop threads on one CPU (they take
    turns holding the GIL; see `blockx.api._affinity`). Other threads and the executors keep
    every CPU the worker was given."""
    auth_token_file: str = _setting("", "grpcAuthTokenFile", "WORKER_AUTH_TOKEN_FILE", _STR)
    """A file holding the bearer token every RPC but health must carry (`blockx.net.auth`;
    the token may also come from WORKER_AUTH_TOKEN). "" and no variable: no token."""
    tls_cert_file: str = _setting("", "grpcTlsCertFile", "WORKER_TLS_CERT_FILE", _STR)
    """The PEM certificate (chain) the port serves TLS with (`blockx.net.tls`); set with
    `tls_key_file`, or neither (plain text)."""
    tls_key_file: str = _setting("", "grpcTlsKeyFile", "WORKER_TLS_KEY_FILE", _STR)
    """The certificate's unencrypted PEM private key."""
    tls_client_ca_file: str = _setting("", "grpcTlsClientCaFile", "WORKER_TLS_CLIENT_CA_FILE", _STR)
    """PEM CA certificates a client's certificate must be signed by (mutual TLS); "" asks
    clients for no certificate. Only with `tls_cert_file`."""

    @property
    def tls_enabled(self) -> bool:
        return bool(self.tls_cert_file)


@attrs.frozen(kw_only=True)
class ObservabilitySection:
    """Metrics, the status page, logs and traces."""

    metrics_listen_addr: str = _setting(":9464", "metricsListenAddr", "METRICS_LISTEN", _STR)
    """Prometheus metrics and the live status page; empty or "none" = off."""
    log_format: str = _setting("json", "logFormat", "LOG_FORMAT", _STR)
    """"json" (one object per line) or "text"."""
    otel_exporter_endpoint: str = _setting(
        "", "otelExporterEndpoint", "OTEL_EXPORTER_OTLP_ENDPOINT", _STR
    )
    """OTLP/HTTP endpoint for trace spans; empty = tracing is a no-op."""
    memory_diagnostics_interval_ms: int = _setting(
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

    target_addr: str = _setting("", "shadowSubmitTargetAddr", "SHADOW_SUBMIT_TARGET_ADDR", _STR)
    """host:port of a worker that receives a sample of accepted submits; empty = off."""
    sample_rate: float = _setting(
        0.0, "shadowSubmitSampleRate", "SHADOW_SUBMIT_SAMPLE_RATE", _FLOAT
    )
    """Fraction (0..1) of accepted submits mirrored to the shadow target."""

    @property
    def enabled(self) -> bool:
        return (
            bool(self.target_addr) and self.target_addr.lower() != "none" and self.sample_rate > 0
        )


@attrs.frozen(kw_only=True)
class WorkerConfig:
    """Everything a worker process is configured with. Checked when made."""

    listen_addr: str = _setting(":8081", "listenAddr", "WORKER_LISTEN", _STR)
    worker_addr: str = _setting("", "workerAddr", "WORKER_ADDR", _STR)
    """Advertised address and etcd key suffix; empty = derived at start."""
    drain_timeout_ms: int = _setting(30_000, "drainTimeoutMs", "DRAIN_TIMEOUT_MS", positive=True)
    gc_collect_interval_ms: int = _setting(
        60_000, "gcCollectIntervalMs", "GC_COLLECT_INTERVAL_MS", positive=True
    )
    """How often the worker process runs a full garbage collection (see `blockx.app`)."""
    phase_io_timeout_ms: int = _setting(
        10_000, "phaseIoTimeoutMs", "PHASE_IO_TIMEOUT_MS", positive=True
    )
    function_snapshot_retention_ms: int = _setting(
        0, "functionSnapshotRetentionMs", "FUNCTION_SNAPSHOT_RETENTION_MS"
    )
    """0 = `worker.maxTaskTimeoutMs` + 10 s."""

    worker: WorkerSection = attrs.field(factory=WorkerSection, metadata=_section("worker"))
    admission: AdmissionSection = attrs.field(
        factory=AdmissionSection, metadata=_section("admission")
    )
    stream_build: StreamBuildSection = attrs.field(
        factory=StreamBuildSection, metadata=_section("streamBuild")
    )
    io: IOSection = attrs.field(factory=IOSection, metadata=_section("io"))
    dispatcher: DispatcherSection = attrs.field(
        factory=DispatcherSection, metadata=_section("dispatcher")
    )
    function_code: FunctionCodeSection = attrs.field(
        factory=FunctionCodeSection, metadata=_section("functionCode")
    )
    executor: ExecutorSection = attrs.field(factory=ExecutorSection, metadata=_section())
    etcd: EtcdSection = attrs.field(factory=EtcdSection, metadata=_section())
    grpc: GrpcSection = attrs.field(factory=GrpcSection, metadata=_section())
    observability: ObservabilitySection = attrs.field(
        factory=ObservabilitySection, metadata=_section()
    )
    shadow: ShadowSection = attrs.field(factory=ShadowSection, metadata=_section())

    def __attrs_post_init__(self) -> None:
        for setting in _SETTINGS:
            value = setting.get(self)
            ConfigError.check(
                not setting.positive or value > 0,
                field=setting.path,
                value=value,
                allowed="must be > 0",
            )
        self._check_addresses()
        self._check_choices()
        self._check_tls()
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
            if optional and addr.lower() in ("", "none"):
                continue
            try:
                parse_listen_addr(addr)
            except ValueError as error:
                raise ConfigError(field=field, value=addr, allowed=str(error)) from error

    def _check_tls(self) -> None:
        """The TLS files go together: certificate and key, and a client CA only with them.
        What they hold is checked when the worker starts (`blockx.net.tls`)."""
        grpc = self.grpc
        check_paired((grpc.tls_cert_file, "grpcTlsCertFile"), (grpc.tls_key_file, "grpcTlsKeyFile"))
        ConfigError.check(
            grpc.tls_enabled or not grpc.tls_client_ca_file,
            field="grpcTlsClientCaFile",
            value=grpc.tls_client_ca_file,
            allowed="needs grpcTlsCertFile and grpcTlsKeyFile: clients are asked for "
            "certificates over TLS only",
        )

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
        check(
            self.grpc.loop in ("thread", "trio-asyncio"),
            field="grpcLoop",
            value=self.grpc.loop,
            allowed='must be "thread" or "trio-asyncio"',
        )
        check(
            self.observability.log_format in ("json", "text"),
            field="logFormat",
            value=self.observability.log_format,
            allowed='must be "json" or "text"',
        )
        check(
            bool(self.function_code.redis_url or self.function_code.dir),
            field="functionCode.dir",
            value=self.function_code.dir,
            allowed="must name a directory when functionCode.redisUrl is empty",
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
        """The effective configuration under its JSON names; loads back to an equal value."""
        rendered: dict[str, Any] = {}
        for setting in _SETTINGS:
            *groups, name = setting.path.split(".")
            target = rendered
            for group in groups:
                target = target.setdefault(group, {})
            target[name] = setting.kind.to_json(setting.get(self))
        return rendered


def check_paired(first: tuple[str, str], second: tuple[str, str]) -> None:
    """Two settings, each (value, name), that are set both or neither (a certificate and
    its key); ConfigError naming the one that is set alone."""
    for (given, field), (_, other) in ((first, second), (second, first)):
        ConfigError.check(
            bool(first[0]) == bool(second[0]) or not given,
            field=field,
            value=given,
            allowed=f"needs {other} too: set both or neither",
        )


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


def parse_listen_addr(text: str) -> tuple[str, int]:
    """(host, port) to bind of "host:port", ":port" (every IPv4 interface) or "[v6]:port".

    Raises ValueError saying what is allowed, for the caller's own error.
    """
    form = 'must be "host:port" or ":port" with a port from 0 to 65535 (0 = any free port)'
    host, colon, port_text = text.rpartition(":")
    if not colon or not re.fullmatch(r"[0-9]{1,5}", port_text) or int(port_text) > 65535:
        raise ValueError(form)
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    elif ":" in host:
        raise ValueError(form + "; write an IPv6 host in brackets")
    if any(char.isspace() for char in host):
        raise ValueError(form)
    return host or "0.0.0.0", int(port_text)


# --- the table -----------------------------------------------------------------------------


@attrs.frozen
class _Setting:
    path: str
    """JSON path, also the name in errors and overrides: "worker.taskSlots"."""
    attributes: tuple[str, ...]
    """Python attribute path: ("worker", "task_slots")."""
    env: str | None
    kind: _Kind
    positive: bool

    def get(self, config: WorkerConfig) -> Any:
        return functools.reduce(getattr, self.attributes, config)


def _walk(cls: type[Any], path: str = "", attributes: tuple[str, ...] = ()) -> Iterator[_Setting]:
    for field in attrs.fields(cls):
        if _GROUP_KEY in field.metadata:
            group = field.metadata[_GROUP_KEY]
            group_path = f"{path}{group}." if group else path
            yield from _walk(field.default.factory, group_path, (*attributes, field.name))
        else:
            declared: _Declared = field.metadata[_SETTING_KEY]
            yield _Setting(
                path=path + declared.json_name,
                attributes=(*attributes, field.name),
                env=declared.env,
                kind=declared.kind,
                positive=declared.positive,
            )


_SETTINGS = tuple(_walk(WorkerConfig))
_SETTINGS_BY_PATH = {setting.path: setting for setting in _SETTINGS}
_GROUP_PATHS = frozenset(setting.path.rpartition(".")[0] for setting in _SETTINGS) - {""}

_LOWER_LEVEL_ALIASES = {"maxTaskTimeoutMs": "worker.maxTaskTimeoutMs"}
"""Lower-level error fields that are not already JSON paths."""

_DEFAULTS = WorkerConfig()


# --- loading -------------------------------------------------------------------------------

_T = TypeVar("_T")


def load_config(
    *,
    profile: Mapping[str, object] | None = None,
    env: Mapping[str, str] | None = None,
    overrides: Mapping[str, object] | None = None,
    flags: Mapping[str, str] | None = None,
) -> WorkerConfig:
    """Defaults, then `profile` (a profile's defaults), the `WORKER_CONFIG` file, `env`,
    `overrides`.

    `env` defaults to `os.environ`. `profile` and `overrides` map JSON paths
    ("listenAddr", "worker.taskSlots") to typed values; a None override means
    "not given" so that unset command-line flags can be passed as they are.
    `flags` maps the JSON path of an override to the command-line flag that gave
    it ("worker.taskSlots" -> "--slots"), so that an error names what was typed.
    """
    environ = os.environ if env is None else env
    values = {setting.path: setting.get(_DEFAULTS) for setting in _SETTINGS}
    sources = dict.fromkeys(_SETTINGS_BY_PATH, "default")
    layers = (
        _mapping_layer(profile or {}, "profile"),
        _file_layer(environ),
        _env_layer(environ),
        _mapping_layer(overrides or {}, "override", flags or {}),
    )
    for layer in layers:
        for path, value, source in layer:
            values[path] = value
            sources[path] = source
    try:
        config: WorkerConfig = _build(WorkerConfig, values)
    except ConfigError as error:
        raise error.from_source(sources.get(error.field)) from error
    return config


_Layer = Iterator[tuple[str, object, str]]
"""(JSON path, parsed value, source) for each value a layer sets."""


def _file_layer(environ: Mapping[str, str]) -> _Layer:
    file_name = environ.get(CONFIG_FILE_ENV, "")
    if not file_name:
        return
    try:
        with open(file_name, encoding="utf-8") as file:
            document = json.load(file)
    except OSError as error:
        raise ConfigError(
            field=CONFIG_FILE_ENV,
            value=file_name,
            allowed=f"the file cannot be read ({error.strerror or error})",
        ) from error
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ConfigError(
            field=CONFIG_FILE_ENV, value=file_name, allowed=f"the file is not valid JSON ({error})"
        ) from error
    if not isinstance(document, dict):
        raise ConfigError(
            field=CONFIG_FILE_ENV,
            value=file_name,
            allowed=f"the file must hold a JSON object, not {type(document).__name__}",
        )
    yield from _json_object(document, "", f"file {file_name}")


def _json_object(document: dict[str, object], prefix: str, source: str) -> _Layer:
    for key, value in document.items():
        path = prefix + key
        if path in _GROUP_PATHS:
            if not isinstance(value, dict):
                raise ConfigError(
                    field=path, value=value, allowed="must be a JSON object", source=source
                )
            yield from _json_object(value, f"{path}.", source)
        else:
            setting = _known(path, value, source)
            yield path, _read(setting.kind.from_json, value, path, source), source


def _env_layer(environ: Mapping[str, str]) -> _Layer:
    for setting in _SETTINGS:
        if setting.env is None or setting.env not in environ:
            continue
        text = environ[setting.env]
        if not text and setting.kind.empty_text_is_unset:
            continue
        source = f"env {setting.env}"
        yield setting.path, _read(setting.kind.from_text, text, setting.path, source), source


def _mapping_layer(
    values: Mapping[str, object], source: str, flags: Mapping[str, str] | None = None
) -> _Layer:
    for path, value in values.items():
        if value is None:
            continue
        given_by = (flags or {}).get(path, source)
        setting = _known(path, value, given_by)
        yield path, _read(setting.kind.from_json, value, path, given_by), given_by


def _known(path: str, value: object, source: str) -> _Setting:
    setting = _SETTINGS_BY_PATH.get(path)
    if setting is None:
        close = difflib.get_close_matches(path, [*_SETTINGS_BY_PATH, *_GROUP_PATHS], n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise ConfigError(field=path, value=value, allowed=f"is not a setting{hint}", source=source)
    return setting


def _read(parse: Callable[[_T], object], raw: _T, path: str, source: str) -> object:
    try:
        return parse(raw)
    except ValueError as error:
        raise ConfigError(field=path, value=raw, allowed=str(error), source=source) from error


def _build(cls: type[Any], values: Mapping[str, object], prefix: str = "") -> Any:
    """Make `cls` from flat JSON-path values, innermost groups first."""
    arguments: dict[str, object] = {}
    for field in attrs.fields(cls):
        if _GROUP_KEY in field.metadata:
            group = field.metadata[_GROUP_KEY]
            group_path = f"{prefix}{group}." if group else prefix
            arguments[field.name] = _build(field.default.factory, values, group_path)
        else:
            declared: _Declared = field.metadata[_SETTING_KEY]
            arguments[field.name] = values[prefix + declared.json_name]
    return cls(**arguments)


__all__ = [
    "CONFIG_FILE_ENV",
    "AdmissionSection",
    "ConfigError",
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
    "check_paired",
    "default_config",
    "load_config",
    "outbound_ipv4",
    "parse_duration_ms",
    "parse_listen_addr",
    "stall_timeout_for",
]
