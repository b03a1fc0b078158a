"""The pool manager's pure rules with explicit times: health verdicts, the restart
window, configuration checks, and the function-code API outside an executor."""

from __future__ import annotations

import sys
from typing import Any

import attrs
import pytest

import blockx
from blockx.config import default_config
from blockx.errors import BlockxError, InvalidValue
from blockx.executors import (
    DownReason,
    ExecutorPoolConfig,
    Heartbeat,
    InvalidPoolConfig,
    RestartWindow,
    assess_health,
)
from blockx.executors._config import MAX_RESULT_BYTES_LIMIT

TIMEOUTS = {"heartbeat_timeout_ms": 1_000, "stall_timeout_ms": 300}


def beat(*, running: str | None, age_ms: int) -> Heartbeat:
    return Heartbeat(
        running_call_id=running, loop_progress_age_ms=age_ms, rss_bytes=1, calls_served=0
    )


def test_healthy_while_heartbeats_arrive() -> None:
    verdict = assess_health(
        now_ms=10_000,
        last_heartbeat_at_ms=9_500,
        heartbeat=beat(running=None, age_ms=0),
        **TIMEOUTS,
    )
    assert verdict is None


def test_lost_only_after_more_than_the_heartbeat_timeout() -> None:
    def at(now_ms: int) -> DownReason | None:
        return assess_health(now_ms=now_ms, last_heartbeat_at_ms=5_000, heartbeat=None, **TIMEOUTS)

    assert at(6_000) is None
    assert at(6_001) is DownReason.LOST


def test_lost_wins_over_wedged() -> None:
    verdict = assess_health(
        now_ms=7_000,
        last_heartbeat_at_ms=5_000,
        heartbeat=beat(running="c1", age_ms=10_000),
        **TIMEOUTS,
    )
    assert verdict is DownReason.LOST


def test_wedged_when_the_loop_stalls_with_a_call_running() -> None:
    def at(now_ms: int, age_ms: int) -> DownReason | None:
        return assess_health(
            now_ms=now_ms,
            last_heartbeat_at_ms=5_000,
            heartbeat=beat(running="c1", age_ms=age_ms),
            **TIMEOUTS,
        )

    assert at(5_000, 300) is None
    assert at(5_000, 301) is DownReason.WEDGED
    # The age grows with the time since the heartbeat that reported it.
    assert at(5_100, 200) is None
    assert at(5_101, 200) is DownReason.WEDGED


def test_a_stalled_loop_without_a_running_call_is_not_wedged() -> None:
    verdict = assess_health(
        now_ms=5_000,
        last_heartbeat_at_ms=5_000,
        heartbeat=beat(running=None, age_ms=60_000),
        **TIMEOUTS,
    )
    assert verdict is None


def window(**overrides: int) -> RestartWindow:
    settings = {"delay_ms": 1_000, "max_restarts": 3, "window_ms": 60_000, "backoff_ms": 30_000}
    return RestartWindow(**{**settings, **overrides})


def test_restarts_wait_the_delay_until_the_window_holds_max_restarts() -> None:
    restarts = window()
    delays = []
    for now_ms in (0, 1_000, 2_000, 3_000):
        delays.append(restarts.next_delay_ms(now_ms))
        restarts.record(now_ms)
    assert delays == [1_000, 1_000, 1_000, 30_000]
    assert restarts.recent(3_000) == 4


def test_the_window_slides_old_restarts_out() -> None:
    restarts = window()
    for now_ms in (0, 10_000, 20_000):
        restarts.record(now_ms)
    assert restarts.next_delay_ms(59_999) == 30_000
    # At 60 000 the restart at 0 is exactly one window old: it no longer counts.
    assert restarts.recent(60_000) == 2
    assert restarts.next_delay_ms(60_000) == 1_000


def test_zero_max_restarts_always_backs_off() -> None:
    assert window(max_restarts=0).next_delay_ms(0) == 30_000


def test_defaults_follow_the_reference_design() -> None:
    config = default_config().pool_config()
    assert config.executor_count == 8
    assert config.restart_enabled is True
    assert (
        config.restart_delay_ms,
        config.max_restarts,
        config.restart_window_ms,
        config.restart_backoff_ms,
    ) == (1_000, 10, 60_000, 30_000)
    assert (config.python_executable, config.runtime_dir_parent) == (sys.executable, None)


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"executor_count": 0}, "executorCount"),
        ({"heartbeat_interval_ms": 0}, "executorHeartbeatIntervalMs"),
        ({"heartbeat_interval_ms": 500, "heartbeat_timeout_ms": 500}, "executorHeartbeatTimeoutMs"),
        ({"heartbeat_interval_ms": 500, "stall_timeout_ms": 400}, "executorStallTimeoutMs"),
        ({"health_check_interval_ms": 0}, "executorHealthCheckIntervalMs"),
        ({"start_timeout_ms": 0}, "executorStartTimeoutMs"),
        ({"restart_delay_ms": -1}, "executorRestartDelayMs"),
        ({"max_restarts": -1}, "executorMaxRestarts"),
        ({"restart_window_ms": 0}, "executorRestartWindowMs"),
        ({"restart_backoff_ms": -1}, "executorRestartBackoffMs"),
        ({"grace_ms": -1}, "executorStopGraceMs"),
        ({"max_result_bytes": 0}, "executorMaxResultBytes"),
        ({"max_result_bytes": MAX_RESULT_BYTES_LIMIT + 1}, "executorMaxResultBytes"),
        ({"send_queue_frames": 0}, "executorSendQueueFrames"),
        ({"python_executable": ""}, "executorPython"),
    ],
)
def test_invalid_settings_name_the_field(overrides: dict[str, Any], field: str) -> None:
    with pytest.raises(InvalidPoolConfig) as caught:
        attrs.evolve(default_config().pool_config(), **overrides)
    assert caught.value.field == field
    assert field in str(caught.value)
    assert isinstance(caught.value, InvalidValue)


def test_every_setting_must_be_given() -> None:
    with pytest.raises(TypeError):
        ExecutorPoolConfig()  # type: ignore[call-arg]  # the defaults live in blockx.config


def test_subcall_outside_an_executor_is_a_typed_error() -> None:
    with pytest.raises(blockx.NotInExecutor) as caught:
        blockx.subcall("demo.add", 1, 2)
    assert caught.value.function == "demo.add"
    assert isinstance(caught.value, BlockxError)


def test_retryable_error_is_a_blockx_error_with_its_message() -> None:
    error = blockx.RetryableError("database busy")
    assert isinstance(error, BlockxError)
    assert error.message == "database busy"
    assert str(error) == "database busy"
