"""What each SIGINT/SIGTERM asks of the worker (`blockx.process.signals.SignalRule`)."""

from __future__ import annotations

import signal

from blockx.process.signals import REPEAT_WINDOW_S, SignalAction, SignalRule

TERM, INT = signal.SIGTERM, signal.SIGINT


def test_the_first_signal_drains() -> None:
    assert SignalRule().on_signal(TERM, 100.0) is SignalAction.DRAIN
    assert SignalRule().on_signal(INT, 0.0) is SignalAction.DRAIN


def test_the_same_signal_again_at_once_is_the_same_request() -> None:
    """What a worker under `uv run` gets when a process manager signals the whole group."""
    rule = SignalRule()
    rule.on_signal(TERM, 100.0)
    assert rule.on_signal(TERM, 100.0) is SignalAction.REPEAT
    assert rule.on_signal(TERM, 100.0 + REPEAT_WINDOW_S - 0.001) is SignalAction.REPEAT


def test_the_same_signal_after_the_window_exits_at_once() -> None:
    rule = SignalRule()
    rule.on_signal(TERM, 100.0)
    assert rule.on_signal(TERM, 100.0 + REPEAT_WINDOW_S) is SignalAction.EXIT


def test_another_signal_exits_at_once_however_soon() -> None:
    rule = SignalRule()
    rule.on_signal(TERM, 100.0)
    assert rule.on_signal(INT, 100.0) is SignalAction.EXIT


def test_the_window_is_counted_from_the_first_signal() -> None:
    rule = SignalRule()
    rule.on_signal(INT, 0.0)
    assert rule.on_signal(INT, 0.6) is SignalAction.REPEAT
    assert rule.on_signal(INT, 1.2) is SignalAction.EXIT  # 1.2 s after the first
