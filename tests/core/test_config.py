"""The worker configuration: defaults, layer order, parsing, checks and conversions.

Every test passes `env` explicitly, so the real environment never leaks in.
"""

from __future__ import annotations

import ipaddress
import json
import sys
from pathlib import Path

import attrs
import pytest

from blockx.calls import RetryPolicy
from blockx.config import (
    GrpcSection,
    WorkerConfig,
    default_config,
    load_config,
    stall_timeout_for,
)
from blockx.executors import ExecutorPoolConfig
from blockx.functions import CodeViewConfig
from blockx.settings import ConfigError, parse_duration_ms
from blockx.slots import SlotConfig


def write_config(tmp_path: Path, document: object) -> str:
    path = tmp_path / "worker.json"
    path.write_text(json.dumps(document), encoding="utf-8")
    return str(path)


BUNDLE_PROFILE: dict[str, object] = {
    "workerRegistryPrefix": "/blockx/bundle-workers/",
    "streamBuild.enabled": True,
    "worker.taskSlots": 20,
}
"""Profile defaults like the bundle profile's (by JSON path)."""


def error_text(excinfo: pytest.ExceptionInfo[ConfigError]) -> str:
    return str(excinfo.value)


# --- defaults ------------------------------------------------------------------------------

DOCUMENTED_DEFAULTS = [
    ("listenAddr", ":8081"),
    ("workerAddr", ""),
    ("etcdEndpoints", "localhost:2379"),
    ("executorCount", 8),
    ("worker.taskSlots", 50),
    ("worker.defaultTTLMs", 5_000),
    ("worker.taskDeadlineMs", 300_000),
    ("worker.maxTaskTimeoutMs", 28_800_000),
    ("worker.resultRetentionMs", 300_000),
    ("worker.watchDisconnectGraceMs", 0),
    ("worker.defaultMaxAttempts", 3),
    ("worker.defaultBaseBackoffMs", 10),
    ("worker.defaultRetryJitterPercent", 5),
    ("admission.builderSlots", 16),
    ("admission.executorTaskSlots", 32),
    ("admission.pluginSlots", 16),
    ("admission.scanSlots", 8),
    ("streamBuild.enabled", False),
    ("streamBuild.pendingCalls", 128),
    ("heartbeatIntervalMs", 200),
    ("heartbeatRefreshMs", 10_000),
    ("drainTimeoutMs", 30_000),
    ("gcCollectIntervalMs", 60_000),
    ("phaseIoTimeoutMs", 10_000),
    ("grpcKeepaliveTimeMs", 30_000),
    ("grpcKeepaliveTimeoutMs", 10_000),
    ("grpcMaxConcurrentStreams", 100),
    ("grpcMaxConnections", 500),
    ("grpcIdleTimeoutMs", 600_000),
    ("grpcMaxResets", 200),
    ("grpcResetWindowMs", 10_000),
    ("executorRestartEnabled", True),
    ("executorRestartDelayMs", 1_000),
    ("executorMaxRestarts", 10),
    ("executorRestartWindowMs", 60_000),
    ("executorRestartBackoffMs", 30_000),
    ("functionSnapshotRetentionMs", 0),
]


def json_at(document: dict[str, object], path: str) -> object:
    value: object = document
    for part in path.split("."):
        assert isinstance(value, dict)
        value = value[part]
    return value


@pytest.mark.parametrize(("path", "expected"), DOCUMENTED_DEFAULTS)
def test_defaults_match_the_documented_table(path: str, expected: object) -> None:
    assert json_at(default_config().to_json_dict(), path) == expected


def test_defaults_as_attributes() -> None:
    config = default_config()
    assert config.listen_addr == ":8081"
    assert config.etcd.endpoints == ("localhost:2379",)
    assert config.etcd.enabled
    assert config.worker.task_slots == 50
    assert config.worker.max_task_timeout_ms == 28_800_000
    assert config.admission.executor_task_slots == 32
    assert config.stream_build.enabled is False
    assert config.etcd.heartbeat_interval_ms == 200
    assert config.grpc.max_message_bytes == 16 * 1024 * 1024
    assert config.dispatcher.call_deadline_ms == 60_000
    assert config.function_code.dir == "examples/functions"
    assert config.function_code.redis_url == ""


def test_load_without_anything_gives_the_defaults() -> None:
    assert load_config(env={}) == default_config()


# --- layer order ---------------------------------------------------------------------------


def test_profile_defaults_are_applied() -> None:
    config = load_config(profile=BUNDLE_PROFILE, env={})
    assert config.etcd.registry_prefix == "/blockx/bundle-workers/"
    assert config.stream_build.enabled is True
    assert config.worker.task_slots == 20
    assert config.executor.count == 8


def test_file_and_env_beat_the_profile(tmp_path: Path) -> None:
    file_name = write_config(tmp_path, {"streamBuild": {"enabled": False}})
    config = load_config(
        profile=BUNDLE_PROFILE,
        env={"WORKER_CONFIG": file_name, "TASK_SLOTS": "7"},
    )
    assert config.stream_build.enabled is False
    assert config.worker.task_slots == 7
    assert config.etcd.registry_prefix == "/blockx/bundle-workers/"


def test_file_overrides_only_the_fields_it_holds(tmp_path: Path) -> None:
    file_name = write_config(
        tmp_path, {"listenAddr": ":9000", "worker": {"taskSlots": 4}, "admission": {}}
    )
    config = load_config(env={"WORKER_CONFIG": file_name})
    default = default_config()
    assert config.listen_addr == ":9000"
    assert config.worker.task_slots == 4
    assert config.worker.task_deadline_ms == default.worker.task_deadline_ms
    assert config.admission == default.admission
    assert config == attrs.evolve(
        default, listen_addr=":9000", worker=attrs.evolve(default.worker, task_slots=4)
    )


def test_env_beats_file(tmp_path: Path) -> None:
    file_name = write_config(tmp_path, {"worker": {"taskSlots": 4}, "executorCount": 2})
    config = load_config(env={"WORKER_CONFIG": file_name, "TASK_SLOTS": "9"})
    assert config.worker.task_slots == 9
    assert config.executor.count == 2


def test_overrides_beat_env(tmp_path: Path) -> None:
    file_name = write_config(tmp_path, {"listenAddr": ":9000"})
    config = load_config(
        env={"WORKER_CONFIG": file_name, "WORKER_LISTEN": ":9100", "EXECUTOR_COUNT": "3"},
        overrides={
            "listenAddr": "127.0.0.1:0",
            "worker.taskSlots": 11,
            "functionCode.dir": "/srv/functions",
            "executorCount": None,  # a flag that was not given
        },
    )
    assert config.listen_addr == "127.0.0.1:0"
    assert config.worker.task_slots == 11
    assert config.function_code.dir == "/srv/functions"
    assert config.executor.count == 3


ENV_CASES = [
    ("WORKER_LISTEN", "10.0.0.1:7000", "listenAddr", "10.0.0.1:7000"),
    ("WORKER_ADDR", "w1:8081", "workerAddr", "w1:8081"),
    ("ETCD_ENDPOINTS", "e1:2379, e2:2379", "etcdEndpoints", "e1:2379,e2:2379"),
    ("WORKER_REGISTRY_PREFIX", "/x/", "workerRegistryPrefix", "/x/"),
    ("EXECUTOR_COUNT", "2", "executorCount", 2),
    ("TASK_SLOTS", "12", "worker.taskSlots", 12),
    ("TASK_DEADLINE_MS", "1000", "worker.taskDeadlineMs", 1_000),
    ("MAX_TASK_TIMEOUT_MS", "600000", "worker.maxTaskTimeoutMs", 600_000),
    ("RESULT_RETENTION_MS", "5", "worker.resultRetentionMs", 5),
    ("WATCH_DISCONNECT_GRACE_MS", "250", "worker.watchDisconnectGraceMs", 250),
    ("CALL_RETRY_MAX_ATTEMPTS", "1", "worker.defaultMaxAttempts", 1),
    ("CALL_RETRY_BASE_BACKOFF_MS", "0", "worker.defaultBaseBackoffMs", 0),
    ("CALL_RETRY_JITTER_PERCENT", "0", "worker.defaultRetryJitterPercent", 0),
    ("EXECUTOR_TASK_SLOTS", "4", "admission.executorTaskSlots", 4),
    ("SCAN_SLOTS", "2", "admission.scanSlots", 2),
    ("STREAM_BUILD_ENABLED", "true", "streamBuild.enabled", True),
    ("WORKER_HEARTBEAT_INTERVAL", "2s", "heartbeatIntervalMs", 2_000),
    ("WORKER_HEARTBEAT_REFRESH", "1m", "heartbeatRefreshMs", 60_000),
    ("DRAIN_TIMEOUT_MS", "100", "drainTimeoutMs", 100),
    ("GC_COLLECT_INTERVAL_MS", "5000", "gcCollectIntervalMs", 5_000),
    ("PHASE_IO_TIMEOUT_MS", "100", "phaseIoTimeoutMs", 100),
    ("WORKER_GRPC_KEEPALIVE_TIME_MS", "100", "grpcKeepaliveTimeMs", 100),
    ("WORKER_GRPC_KEEPALIVE_TIMEOUT_MS", "100", "grpcKeepaliveTimeoutMs", 100),
    ("WORKER_GRPC_MAX_MESSAGE_BYTES", "1024", "grpcMaxMessageBytes", 1_024),
    ("EXECUTOR_RESTART_ENABLED", "false", "executorRestartEnabled", False),
    ("EXECUTOR_RESTART_DELAY_MS", "0", "executorRestartDelayMs", 0),
    ("EXECUTOR_MAX_RESTARTS", "1", "executorMaxRestarts", 1),
    ("EXECUTOR_RESTART_WINDOW_MS", "1000", "executorRestartWindowMs", 1_000),
    ("EXECUTOR_RESTART_BACKOFF_MS", "0", "executorRestartBackoffMs", 0),
    ("EXECUTOR_STALL_TIMEOUT_MS", "90000", "executorStallTimeoutMs", 90_000),
    ("FUNCTION_SNAPSHOT_RETENTION_MS", "30000000", "functionSnapshotRetentionMs", 30_000_000),
    ("CALL_DEADLINE_MS", "500", "dispatcher.callDeadlineMs", 500),
    ("FUNCTIONS_DIR", "/srv/fn", "functionCode.dir", "/srv/fn"),
    ("FUNCTIONS_REDIS_URL", "redis://r:6379/0", "functionCode.redisUrl", "redis://r:6379/0"),
    ("FUNCTIONS_REDIS_PREFIX", "p:", "functionCode.redisPrefix", "p:"),
    ("FUNCTIONS_REFRESH_MS", "50", "functionCode.refreshMs", 50),
]


@pytest.mark.parametrize(("variable", "text", "path", "expected"), ENV_CASES)
def test_each_env_variable_sets_its_field(
    variable: str, text: str, path: str, expected: object
) -> None:
    config = load_config(env={variable: text})
    assert json_at(config.to_json_dict(), path) == expected


@pytest.mark.parametrize("text", ["none", "NONE", ""])
def test_etcd_can_be_turned_off(text: str) -> None:
    config = load_config(env={"ETCD_ENDPOINTS": text})
    assert config.etcd.endpoints == ()
    assert not config.etcd.enabled


def test_etcd_endpoints_in_the_file_may_be_a_list(tmp_path: Path) -> None:
    file_name = write_config(tmp_path, {"etcdEndpoints": ["a:2379", "b:2379"]})
    config = load_config(env={"WORKER_CONFIG": file_name})
    assert config.etcd.endpoints == ("a:2379", "b:2379")


def test_empty_numeric_env_counts_as_unset() -> None:
    config = load_config(env={"TASK_SLOTS": "", "WORKER_HEARTBEAT_INTERVAL": ""})
    assert config.worker.task_slots == 50
    assert config.etcd.heartbeat_interval_ms == 200


def test_effective_config_round_trips_through_a_file(tmp_path: Path) -> None:
    config = load_config(
        profile=BUNDLE_PROFILE,
        env={"ETCD_ENDPOINTS": "a:1,b:2", "FUNCTIONS_REDIS_URL": "redis://r/0"},
    )
    file_name = write_config(tmp_path, config.to_json_dict())
    assert load_config(env={"WORKER_CONFIG": file_name}) == config


# --- durations -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected_ms"),
    [
        ("2s", 2_000),
        ("1m30s", 90_000),
        ("150ms", 150),
        ("200ms", 200),
        ("1.5h", 5_400_000),
        (".5s", 500),
        ("1500us", 1),
        ("999999ns", 0),
        ("0", 0),
        ("-2s", -2_000),
    ],
)
def test_go_durations_parse(text: str, expected_ms: int) -> None:
    assert parse_duration_ms(text) == expected_ms


@pytest.mark.parametrize("text", ["bad", "2", "", "s", "2x", "1m 30s", "-"])
def test_bad_go_durations_are_refused(text: str) -> None:
    with pytest.raises(ValueError, match="Go duration"):
        parse_duration_ms(text)


def test_bad_duration_in_env_names_the_variable() -> None:
    with pytest.raises(ConfigError) as excinfo:
        load_config(env={"WORKER_HEARTBEAT_INTERVAL": "bad"})
    assert error_text(excinfo) == (
        "heartbeatIntervalMs = 'bad' (from env WORKER_HEARTBEAT_INTERVAL): "
        "must be a Go duration such as 2s, 200ms or 1m30s"
    )
    assert excinfo.value.source == "env WORKER_HEARTBEAT_INTERVAL"


# --- bad input -----------------------------------------------------------------------------


def test_unparsable_env_value_names_the_variable() -> None:
    with pytest.raises(ConfigError) as excinfo:
        load_config(env={"TASK_SLOTS": "abc"})
    assert error_text(excinfo) == (
        "worker.taskSlots = 'abc' (from env TASK_SLOTS): must be an integer"
    )
    assert excinfo.value.field == "worker.taskSlots"


def test_unparsable_env_bool_names_the_variable() -> None:
    with pytest.raises(ConfigError, match=r"from env STREAM_BUILD_ENABLED\): must be true"):
        load_config(env={"STREAM_BUILD_ENABLED": "maybe"})


def test_out_of_range_env_value_names_field_source_and_rule() -> None:
    with pytest.raises(ConfigError) as excinfo:
        load_config(env={"TASK_SLOTS": "0"})
    assert error_text(excinfo) == "worker.taskSlots = 0 (from env TASK_SLOTS): must be > 0"
    error = excinfo.value
    assert (error.field, error.value, error.allowed, error.source) == (
        "worker.taskSlots",
        0,
        "must be > 0",
        "env TASK_SLOTS",
    )


def test_unknown_key_in_file_names_its_path(tmp_path: Path) -> None:
    file_name = write_config(tmp_path, {"worker": {"tasksSlots": 4}})
    with pytest.raises(ConfigError) as excinfo:
        load_config(env={"WORKER_CONFIG": file_name})
    assert error_text(excinfo) == (
        f"worker.tasksSlots = 4 (from file {file_name}): is not a setting; "
        "did you mean 'worker.taskSlots'?"
    )


def test_wrong_type_in_file_names_path_value_and_type(tmp_path: Path) -> None:
    file_name = write_config(tmp_path, {"worker": {"taskSlots": "4"}})
    with pytest.raises(ConfigError) as excinfo:
        load_config(env={"WORKER_CONFIG": file_name})
    assert error_text(excinfo) == (
        f"worker.taskSlots = '4' (from file {file_name}): must be an integer"
    )


@pytest.mark.parametrize(
    ("document", "expected"),
    [
        ({"streamBuild": {"enabled": 1}}, "streamBuild.enabled = 1 (from file {}): must be true"),
        ({"executorCount": True}, "executorCount = True (from file {}): must be an integer"),
        ({"executorCount": 2.5}, "executorCount = 2.5 (from file {}): must be an integer"),
        ({"listenAddr": 8081}, "listenAddr = 8081 (from file {}): must be a string"),
        ({"worker": 4}, "worker = 4 (from file {}): must be a JSON object"),
        ({"etcdEndpoints": [1]}, "etcdEndpoints = [1] (from file {}): must be a string"),
    ],
)
def test_wrong_json_types_are_refused(
    tmp_path: Path, document: dict[str, object], expected: str
) -> None:
    file_name = write_config(tmp_path, document)
    with pytest.raises(ConfigError) as excinfo:
        load_config(env={"WORKER_CONFIG": file_name})
    assert error_text(excinfo).startswith(expected.format(file_name))


def test_missing_file_is_named(tmp_path: Path) -> None:
    file_name = str(tmp_path / "absent.json")
    with pytest.raises(ConfigError) as excinfo:
        load_config(env={"WORKER_CONFIG": file_name})
    assert error_text(excinfo).startswith(f"WORKER_CONFIG = {file_name!r}: the file cannot be read")


def test_invalid_json_file_is_named(tmp_path: Path) -> None:
    path = tmp_path / "broken.json"
    path.write_text('{"listenAddr": ', encoding="utf-8")
    with pytest.raises(ConfigError) as excinfo:
        load_config(env={"WORKER_CONFIG": str(path)})
    assert error_text(excinfo).startswith(f"WORKER_CONFIG = {str(path)!r}: the file is not valid")


def test_file_must_hold_an_object(tmp_path: Path) -> None:
    file_name = write_config(tmp_path, [1, 2])
    with pytest.raises(ConfigError, match="must hold a JSON object, not list"):
        load_config(env={"WORKER_CONFIG": file_name})


def test_unknown_override_is_refused() -> None:
    with pytest.raises(ConfigError) as excinfo:
        load_config(env={}, overrides={"listenAdr": ":1"})
    assert error_text(excinfo) == (
        "listenAdr = ':1' (from override): is not a setting; did you mean 'listenAddr'?"
    )


def test_override_of_the_wrong_type_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"^executorCount = '3' \(from override\): must be an"):
        load_config(env={}, overrides={"executorCount": "3"})


# --- checks --------------------------------------------------------------------------------


def test_deadline_above_max_timeout_is_refused_with_its_source(tmp_path: Path) -> None:
    file_name = write_config(tmp_path, {"worker": {"taskDeadlineMs": 400_000}})
    with pytest.raises(ConfigError) as excinfo:
        load_config(env={"WORKER_CONFIG": file_name, "MAX_TASK_TIMEOUT_MS": "300000"})
    assert error_text(excinfo) == (
        f"worker.taskDeadlineMs = 400000 (from file {file_name}): "
        "must be > 0 and <= worker.maxTaskTimeoutMs (300000)"
    )


def test_jitter_above_five_is_refused() -> None:
    with pytest.raises(ConfigError) as excinfo:
        load_config(env={"CALL_RETRY_JITTER_PERCENT": "6"})
    assert error_text(excinfo) == (
        "worker.defaultRetryJitterPercent = 6 (from env CALL_RETRY_JITTER_PERCENT): between 0 and 5"
    )


def test_snapshot_retention_below_max_timeout_is_refused() -> None:
    with pytest.raises(ConfigError) as excinfo:
        load_config(env={"FUNCTION_SNAPSHOT_RETENTION_MS": "1000"})
    assert error_text(excinfo).startswith(
        "functionSnapshotRetentionMs = 1000 (from env FUNCTION_SNAPSHOT_RETENTION_MS): 0 (="
    )


def test_max_timeout_is_named_by_its_json_path() -> None:
    with pytest.raises(ConfigError) as excinfo:
        load_config(env={}, overrides={"worker.maxTaskTimeoutMs": 0})
    assert excinfo.value.field == "worker.maxTaskTimeoutMs"
    assert excinfo.value.source == "override"


@pytest.mark.parametrize(
    ("variable", "path"),
    [
        ("EXECUTOR_COUNT", "executorCount"),
        ("EXECUTOR_TASK_SLOTS", "admission.executorTaskSlots"),
        ("SCAN_SLOTS", "admission.scanSlots"),
        ("DRAIN_TIMEOUT_MS", "drainTimeoutMs"),
        ("PHASE_IO_TIMEOUT_MS", "phaseIoTimeoutMs"),
        ("WORKER_GRPC_KEEPALIVE_TIMEOUT_MS", "grpcKeepaliveTimeoutMs"),
        ("CALL_DEADLINE_MS", "dispatcher.callDeadlineMs"),
        ("FUNCTIONS_REFRESH_MS", "functionCode.refreshMs"),
    ],
)
def test_zero_counts_and_timeouts_are_refused(variable: str, path: str) -> None:
    with pytest.raises(ConfigError) as excinfo:
        load_config(env={variable: "0"})
    assert error_text(excinfo) == f"{path} = 0 (from env {variable}): must be > 0"


POSITIVE_SETTINGS = [
    "drainTimeoutMs",
    "gcCollectIntervalMs",
    "phaseIoTimeoutMs",
    "admission.builderSlots",
    "admission.executorTaskSlots",
    "admission.pluginSlots",
    "admission.scanSlots",
    "io.sqliteConnections",
    "io.duckdbConnections",
    "io.postgresConnections",
    "streamBuild.pendingCalls",
    "dispatcher.callWindow",
    "dispatcher.cancelGraceMs",
    "dispatcher.callDeadlineMs",
    "dispatcher.executorCapacity",
    "dispatcher.executorQueueMs",
    "functionCode.refreshMs",
    "etcdLeaseTtlMs",
    "heartbeatIntervalMs",
    "heartbeatRefreshMs",
    "grpcKeepaliveTimeMs",
    "grpcKeepaliveTimeoutMs",
    "grpcMaxMessageBytes",
    "grpcMaxConcurrentStreams",
    "grpcMaxConnections",
    "grpcIdleTimeoutMs",
    "grpcMaxResets",
    "grpcResetWindowMs",
    "memoryDiagnosticsIntervalMs",
]


@pytest.mark.parametrize("path", POSITIVE_SETTINGS)
def test_each_setting_that_must_be_positive_refuses_zero(path: str) -> None:
    with pytest.raises(ConfigError) as excinfo:
        load_config(env={}, overrides={path: 0})
    assert error_text(excinfo) == f"{path} = 0 (from override): must be > 0"


def test_zero_heartbeat_duration_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"^heartbeatIntervalMs = 0 \(from env WORKER_HEART"):
        load_config(env={"WORKER_HEARTBEAT_INTERVAL": "0s"})


def test_the_heartbeat_refresh_may_not_be_shorter_than_the_interval() -> None:
    with pytest.raises(ConfigError) as excinfo:
        load_config(env={"WORKER_HEARTBEAT_INTERVAL": "2s", "WORKER_HEARTBEAT_REFRESH": "1s"})
    assert error_text(excinfo) == (
        "heartbeatRefreshMs = 1000 (from env WORKER_HEARTBEAT_REFRESH): must be >= "
        "heartbeatIntervalMs (2000): an unchanged heartbeat cannot be put again more often "
        "than the heartbeat is read"
    )
    config = load_config(
        env={}, overrides={"heartbeatIntervalMs": 2_000, "heartbeatRefreshMs": 2_000}
    )
    assert config.etcd.heartbeat_refresh_ms == config.etcd.heartbeat_interval_ms == 2_000


def test_stall_timeout_must_exceed_the_executor_heartbeat() -> None:
    with pytest.raises(ConfigError) as excinfo:
        load_config(env={"EXECUTOR_STALL_TIMEOUT_MS": "500", "CALL_DEADLINE_MS": "100"})
    assert error_text(excinfo) == (
        "executorStallTimeoutMs = 500 (from env EXECUTOR_STALL_TIMEOUT_MS): "
        "must be > executorHeartbeatIntervalMs (500)"
    )


def test_a_stall_timeout_at_or_below_the_call_deadline_is_refused() -> None:
    with pytest.raises(ConfigError) as excinfo:
        load_config(env={"EXECUTOR_STALL_TIMEOUT_MS": "60000", "CALL_DEADLINE_MS": "60000"})
    assert error_text(excinfo) == (
        "executorStallTimeoutMs = 60000 (from env EXECUTOR_STALL_TIMEOUT_MS): must be greater "
        "than dispatcher.callDeadlineMs (60000), or a call computing that long is killed as "
        "wedged; 0 derives it (the call deadline + 10000 ms, at least 30000 ms)"
    )
    with pytest.raises(ConfigError, match=r"^executorStallTimeoutMs = -1 .*must be >= 0"):
        load_config(env={"EXECUTOR_STALL_TIMEOUT_MS": "-1"})


@pytest.mark.parametrize(
    ("call_deadline_ms", "stall_ms"),
    [(1, 30_000), (20_000, 30_000), (60_000, 70_000), (600_000, 610_000)],
)
def test_the_stall_timeout_is_derived_from_the_call_deadline(
    call_deadline_ms: int, stall_ms: int
) -> None:
    config = load_config(env={"CALL_DEADLINE_MS": str(call_deadline_ms)})
    assert config.executor.stall_timeout_ms == 0
    assert config.pool_config().stall_timeout_ms == stall_ms == stall_timeout_for(call_deadline_ms)
    # A call may now run up to its deadline without being taken for a wedged executor.
    assert config.pool_config().stall_timeout_ms > call_deadline_ms


def test_an_explicit_stall_timeout_is_kept() -> None:
    config = load_config(env={"EXECUTOR_STALL_TIMEOUT_MS": "120000", "CALL_DEADLINE_MS": "90000"})
    assert config.pool_config().stall_timeout_ms == 120_000


@pytest.mark.parametrize("listen", ["8081", "host:", ":65536", ":-1", "::8081", "a b:1", ":x"])
def test_bad_listen_addresses_are_refused(listen: str) -> None:
    with pytest.raises(ConfigError) as excinfo:
        load_config(env={"WORKER_LISTEN": listen})
    assert error_text(excinfo).startswith(f"listenAddr = {listen!r} (from env WORKER_LISTEN): ")


@pytest.mark.parametrize(
    ("listen", "expected"),
    [
        (":8081", ("0.0.0.0", 8081)),
        (":0", ("0.0.0.0", 0)),
        ("127.0.0.1:9000", ("127.0.0.1", 9000)),
        ("localhost:65535", ("localhost", 65535)),
        ("[::1]:9000", ("::1", 9000)),
    ],
)
def test_listen_host_port(listen: str, expected: tuple[str, int]) -> None:
    assert WorkerConfig(listen_addr=listen).listen_host_port() == expected


def test_bad_profile_default_is_reported_as_the_profile() -> None:
    with pytest.raises(ConfigError) as excinfo:
        load_config(profile={"executorCount": 0}, env={})
    assert error_text(excinfo) == "executorCount = 0 (from profile): must be > 0"


def test_direct_construction_checks_too() -> None:
    with pytest.raises(ConfigError) as excinfo:
        WorkerConfig(grpc=GrpcSection(keepalive_timeout_ms=0))
    assert error_text(excinfo) == "grpcKeepaliveTimeoutMs = 0: must be > 0"
    assert excinfo.value.source is None


def test_a_default_made_invalid_by_another_setting_is_blamed_on_the_default() -> None:
    with pytest.raises(ConfigError) as excinfo:
        load_config(env={}, overrides={"executorHeartbeatIntervalMs": 60_000})
    assert error_text(excinfo) == (
        "executorHeartbeatTimeoutMs = 5000 (from default): "
        "must be > executorHeartbeatIntervalMs (60000)"
    )


# --- addresses -----------------------------------------------------------------------------


def test_explicit_worker_addr_is_advertised_as_is() -> None:
    config = load_config(env={"WORKER_ADDR": "worker-3.internal:8081"})
    assert config.resolve_worker_addr(43_125) == "worker-3.internal:8081"


def test_empty_worker_addr_uses_outbound_ip_and_the_bound_port() -> None:
    config = load_config(env={"WORKER_LISTEN": ":0"})
    assert config.resolve_worker_addr(43_125, outbound_ip=lambda: "10.1.2.3") == "10.1.2.3:43125"


def test_empty_worker_addr_with_a_specific_listen_host_advertises_that_host() -> None:
    config = load_config(env={"WORKER_LISTEN": "127.0.0.1:0"})
    assert config.resolve_worker_addr(5_000, outbound_ip=lambda: "10.1.2.3") == "127.0.0.1:5000"


def test_real_outbound_probe_gives_an_ipv4_address() -> None:
    host, _, port = default_config().resolve_worker_addr(8_081).rpartition(":")
    assert port == "8081"
    assert isinstance(ipaddress.ip_address(host), ipaddress.IPv4Address)


# --- conversions ---------------------------------------------------------------------------


def test_slot_config_carries_the_worker_group() -> None:
    config = load_config(
        env={
            "TASK_SLOTS": "7",
            "TASK_DEADLINE_MS": "1000",
            "MAX_TASK_TIMEOUT_MS": "2000",
            "RESULT_RETENTION_MS": "3000",
            "RESULT_RETENTION_BYTES": "4096",
            "WATCH_DISCONNECT_GRACE_MS": "400",
            "CALL_RETRY_MAX_ATTEMPTS": "2",
            "CALL_RETRY_BASE_BACKOFF_MS": "20",
            "CALL_RETRY_JITTER_PERCENT": "1",
        }
    )
    assert config.worker.slot_config() == SlotConfig(
        task_slots=7,
        default_ttl_ms=5_000,
        task_deadline_ms=1_000,
        max_task_timeout_ms=2_000,
        result_retention_ms=3_000,
        result_retention_bytes=4_096,
        watch_disconnect_grace_ms=400,
        default_retry_policy=RetryPolicy(max_attempts=2, base_backoff_ms=20, jitter_percent=1),
    )
    assert default_config().worker.slot_config() == SlotConfig(
        task_slots=50,
        default_ttl_ms=5_000,
        task_deadline_ms=300_000,
        max_task_timeout_ms=28_800_000,
        result_retention_ms=300_000,
        result_retention_bytes=256 * 1024 * 1024,
        watch_disconnect_grace_ms=0,
        default_retry_policy=RetryPolicy(max_attempts=3, base_backoff_ms=10, jitter_percent=5),
    )


def test_pool_config_carries_the_executor_settings() -> None:
    config = load_config(
        env={
            "EXECUTOR_COUNT": "3",
            "EXECUTOR_STALL_TIMEOUT_MS": "9000",
            "CALL_DEADLINE_MS": "8000",
            "EXECUTOR_RESTART_ENABLED": "0",
            "EXECUTOR_RESTART_DELAY_MS": "10",
            "EXECUTOR_MAX_RESTARTS": "4",
            "EXECUTOR_RESTART_WINDOW_MS": "5000",
            "EXECUTOR_RESTART_BACKOFF_MS": "7",
        },
        overrides={
            "executorHeartbeatIntervalMs": 100,
            "executorHeartbeatTimeoutMs": 1_000,
            "executorStopGraceMs": 250,
        },
    )
    assert config.pool_config() == ExecutorPoolConfig(
        executor_count=3,
        heartbeat_interval_ms=100,
        heartbeat_timeout_ms=1_000,
        stall_timeout_ms=9_000,
        health_check_interval_ms=250,
        start_timeout_ms=30_000,
        restart_enabled=False,
        restart_delay_ms=10,
        max_restarts=4,
        restart_window_ms=5_000,
        restart_backoff_ms=7,
        grace_ms=250,
        max_result_bytes=16 * 1024 * 1024,
        send_queue_frames=1_024,
        python_executable=sys.executable,
        runtime_dir_parent=None,
    )
    assert default_config().pool_config() == ExecutorPoolConfig(
        executor_count=8,
        heartbeat_interval_ms=500,
        heartbeat_timeout_ms=5_000,
        stall_timeout_ms=70_000,
        health_check_interval_ms=250,
        start_timeout_ms=30_000,
        restart_enabled=True,
        restart_delay_ms=1_000,
        max_restarts=10,
        restart_window_ms=60_000,
        restart_backoff_ms=30_000,
        grace_ms=5_000,
        max_result_bytes=16 * 1024 * 1024,
        send_queue_frames=1_024,
        python_executable=sys.executable,
        runtime_dir_parent=None,
    )


NEW_EXECUTOR_DEFAULTS = [
    ("executorHealthCheckIntervalMs", 250),
    ("executorStartTimeoutMs", 30_000),
    ("executorMaxResultBytes", 16 * 1024 * 1024),
    ("executorSendQueueFrames", 1_024),
    ("executorPython", ""),
    ("executorRuntimeDir", ""),
]


@pytest.mark.parametrize(("path", "expected"), NEW_EXECUTOR_DEFAULTS)
def test_new_executor_settings_default_to_the_pools_former_defaults(
    path: str, expected: object
) -> None:
    assert json_at(default_config().to_json_dict(), path) == expected


def test_new_executor_settings_load_from_the_file(tmp_path: Path) -> None:
    file_name = write_config(
        tmp_path,
        {
            "executorHealthCheckIntervalMs": 100,
            "executorStartTimeoutMs": 2_000,
            "executorMaxResultBytes": 1_024,
            "executorSendQueueFrames": 8,
            "executorPython": "/opt/python/bin/python3",
            "executorRuntimeDir": "/run/blockx",
        },
    )
    config = load_config(env={"WORKER_CONFIG": file_name})
    executor = config.executor
    assert (
        executor.health_check_interval_ms,
        executor.start_timeout_ms,
        executor.max_result_bytes,
        executor.send_queue_frames,
        executor.python,
        executor.runtime_dir,
    ) == (100, 2_000, 1_024, 8, "/opt/python/bin/python3", "/run/blockx")
    pool = config.pool_config()
    assert (
        pool.health_check_interval_ms,
        pool.start_timeout_ms,
        pool.max_result_bytes,
        pool.send_queue_frames,
        pool.python_executable,
        pool.runtime_dir_parent,
    ) == (100, 2_000, 1_024, 8, "/opt/python/bin/python3", "/run/blockx")


@pytest.mark.parametrize(
    ("document", "expected"),
    [
        (
            {"executorMaxResultBytes": 0},
            "executorMaxResultBytes = 0 (from file {}): must be > 0 and <= 33554432",
        ),
        (
            {"executorMaxResultBytes": 33_554_433},
            "executorMaxResultBytes = 33554433 (from file {}): must be > 0 and <= 33554432",
        ),
        (
            {"executorHealthCheckIntervalMs": 0},
            "executorHealthCheckIntervalMs = 0 (from file {}): must be > 0",
        ),
        ({"executorStartTimeoutMs": 0}, "executorStartTimeoutMs = 0 (from file {}): must be > 0"),
        (
            {"executorSendQueueFrames": 0},
            "executorSendQueueFrames = 0 (from file {}): must be > 0",
        ),
        (
            {"executorPython": 3},
            "executorPython = 3 (from file {}): must be a string",
        ),
        (
            {"executorRuntimeDir": ["/run"]},
            "executorRuntimeDir = ['/run'] (from file {}): must be a string",
        ),
    ],
)
def test_a_bad_new_executor_setting_is_refused_naming_its_json_field(
    tmp_path: Path, document: dict[str, object], expected: str
) -> None:
    file_name = write_config(tmp_path, document)
    with pytest.raises(ConfigError) as excinfo:
        load_config(env={"WORKER_CONFIG": file_name})
    assert error_text(excinfo) == expected.format(file_name)
    assert excinfo.value.field == next(iter(document))


def test_code_view_config_carries_timeout_and_retention() -> None:
    config = load_config(
        env={"MAX_TASK_TIMEOUT_MS": "600000", "TASK_DEADLINE_MS": "60000"},
        overrides={"functionSnapshotRetentionMs": 700_000},
    )
    assert config.code_view_config() == CodeViewConfig(
        max_task_timeout_ms=600_000, retention_ms=700_000
    )
    assert default_config().code_view_config().effective_retention_ms == 28_810_000


def test_fleet_and_observability_settings_load_from_env() -> None:
    config = load_config(
        env={
            "ETCD_LEASE_TTL_MS": "4000",
            "SHADOW_SUBMIT_TARGET_ADDR": "10.0.0.2:8081",
            "SHADOW_SUBMIT_SAMPLE_RATE": "0.25",
            "METRICS_LISTEN": "127.0.0.1:0",
            "LOG_FORMAT": "text",
            "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318",
        }
    )
    assert config.etcd.lease_ttl_ms == 4000
    assert (config.shadow.target_addr, config.shadow.sample_rate) == (
        "10.0.0.2:8081",
        0.25,
    )
    assert config.shadow.enabled
    assert config.observability.metrics_enabled
    assert config.observability.metrics_host_port() == ("127.0.0.1", 0)
    assert config.observability.log_format == "text"
    assert config.observability.otel_exporter_endpoint == "http://127.0.0.1:4318"


def test_fleet_and_observability_defaults() -> None:
    config = load_config(env={})
    assert not config.shadow.enabled
    assert config.observability.metrics_host_port() == ("0.0.0.0", 9464)
    assert config.observability.log_format == "auto"
    assert not load_config(env={"METRICS_LISTEN": "none"}).observability.metrics_enabled


@pytest.mark.parametrize(
    ("env", "named"),
    [
        ({"SHADOW_SUBMIT_SAMPLE_RATE": "1.5"}, "shadowSubmitSampleRate = 1.5"),
        ({"SHADOW_SUBMIT_SAMPLE_RATE": "lots"}, "SHADOW_SUBMIT_SAMPLE_RATE"),
        ({"LOG_FORMAT": "xml"}, "logFormat = 'xml'"),
        ({"METRICS_LISTEN": "nowhere"}, "metricsListenAddr"),
        ({"ETCD_LEASE_TTL_MS": "0"}, "etcdLeaseTtlMs = 0"),
    ],
)
def test_bad_fleet_and_observability_settings_name_the_field(
    env: dict[str, str], named: str
) -> None:
    with pytest.raises(ConfigError) as raised:
        load_config(env=env)
    assert named in str(raised.value)


# --- TLS files -------------------------------------------------------------------------------


def test_tls_files_come_from_the_file_and_the_environment(tmp_path: Path) -> None:
    file_name = write_config(
        tmp_path, {"grpcTlsCertFile": "/etc/w/cert.pem", "grpcTlsKeyFile": "/etc/w/key.pem"}
    )
    config = load_config(
        env={"WORKER_CONFIG": file_name, "WORKER_TLS_CLIENT_CA_FILE": "/etc/w/ca.pem"}
    )
    grpc = config.grpc
    assert (grpc.tls_cert_file, grpc.tls_key_file, grpc.tls_client_ca_file) == (
        "/etc/w/cert.pem",
        "/etc/w/key.pem",
        "/etc/w/ca.pem",
    )
    assert grpc.tls_enabled
    assert not default_config().grpc.tls_enabled
    by_env = load_config(
        env={"WORKER_TLS_CERT_FILE": "/etc/w/cert.pem", "WORKER_TLS_KEY_FILE": "/etc/w/key.pem"}
    )
    assert attrs.evolve(by_env.grpc, tls_client_ca_file="/etc/w/ca.pem") == grpc


@pytest.mark.parametrize(
    ("env", "message"),
    [
        (
            {"WORKER_TLS_CERT_FILE": "/c.pem"},
            "grpcTlsCertFile = '/c.pem' (from env WORKER_TLS_CERT_FILE): "
            "needs grpcTlsKeyFile too: set both or neither",
        ),
        (
            {"WORKER_TLS_KEY_FILE": "/k.pem"},
            "grpcTlsKeyFile = '/k.pem' (from env WORKER_TLS_KEY_FILE): "
            "needs grpcTlsCertFile too: set both or neither",
        ),
        (
            {"WORKER_TLS_CLIENT_CA_FILE": "/ca.pem"},
            "grpcTlsClientCaFile = '/ca.pem' (from env WORKER_TLS_CLIENT_CA_FILE): needs "
            "grpcTlsCertFile and grpcTlsKeyFile: clients are asked for certificates over TLS only",
        ),
    ],
)
def test_tls_files_that_go_together_are_refused_alone(env: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError) as raised:
        load_config(env=env)
    assert str(raised.value) == message
