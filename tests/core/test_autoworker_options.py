"""The automatic worker's options, checked when made, and how handler endings are reported."""

from __future__ import annotations

import decimal
import functools
import threading
from typing import Any

import pytest

from blockx.autoworker import (
    AttemptCancelled,
    Capability,
    InvalidOption,
    OutcomeUnknown,
    RawJson,
    WorkerExecution,
    WorkerFailure,
    WorkerHandler,
    WorkerOptions,
)
from blockx.autoworker._handlers import json_text, raised, returned
from blockx.hubwire import MAX_JSON_BYTES, MAX_NESTING, Failed, InvalidJson, Succeeded, Unknown

CAP = Capability(handler="text.normalize", handler_version="v1", payload_version="v1")


async def handle(execution: WorkerExecution) -> Any:
    return execution.payload


def make(**fields: Any) -> WorkerOptions:
    values: dict[str, Any] = {
        "queue_id": "q1",
        "handlers": [WorkerHandler(capability=CAP, handle=handle)],
    }
    values.update(fields)
    return WorkerOptions(**values)


def test_defaults_are_the_documented_ones() -> None:
    options = make()
    assert (options.capacity, options.shutdown_timeout_ms) == (4, 30_000)
    assert (options.reconnect_min_delay_ms, options.reconnect_max_delay_ms) == (200, 5_000)
    assert options.handler_for(CAP) is options.handlers[0]


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        ({"queue_id": ""}, "queue_id"),
        ({"queue_id": " q"}, "queue_id"),
        ({"capacity": 0}, "capacity"),
        ({"capacity": 257}, "capacity"),
        ({"capacity": True}, "capacity"),
        ({"handlers": []}, "handlers"),
        (
            {"handlers": [WorkerHandler(capability=CAP, handle=handle)] * 2},
            "handlers[1].capability",
        ),
        ({"handlers": [WorkerHandler(capability=CAP, handle=None)]}, "handlers[0].handle"),  # type: ignore[arg-type]
        ({"handlers": ["resize"]}, "handlers[0]"),
        (
            {"handlers": [WorkerHandler(capability=CAP, handle=handle, decimals="yes")]},  # type: ignore[arg-type]
            "handlers[0].decimals",
        ),
        (
            {
                "handlers": [
                    WorkerHandler(
                        capability=Capability(handler="", handler_version="1", payload_version="1"),
                        handle=handle,
                    )
                ]
            },
            "handlers[0].capability.handler",
        ),
        ({"shutdown_timeout_ms": 0}, "shutdown_timeout_ms"),
        ({"shutdown_timeout_ms": 300_001}, "shutdown_timeout_ms"),
        ({"reconnect_min_delay_ms": 9}, "reconnect_min_delay_ms"),
        ({"reconnect_min_delay_ms": 500, "reconnect_max_delay_ms": 400}, "reconnect_max_delay_ms"),
        ({"reconnect_max_delay_ms": 30_001}, "reconnect_max_delay_ms"),
    ],
)
def test_a_bad_option_is_refused_naming_it(fields: dict[str, Any], named: str) -> None:
    with pytest.raises(InvalidOption) as refused:
        make(**fields)
    assert refused.value.field == named
    assert str(refused.value).startswith(f"WorkerOptions.{named}=")


def test_a_handle_that_is_not_callable_is_refused_saying_both_kinds_are_allowed() -> None:
    with pytest.raises(InvalidOption) as refused:
        make(handlers=[WorkerHandler(capability=CAP, handle=42)])  # type: ignore[arg-type]
    assert refused.value.field == "handlers[0].handle"
    assert "async or plain" in str(refused.value)


class AsyncCall:
    async def __call__(self, execution: WorkerExecution) -> Any:
        return execution.payload


class PlainCall:
    def __call__(self, execution: WorkerExecution) -> Any:
        return execution.payload


def plain(execution: WorkerExecution, extra: int = 0) -> Any:
    return execution.payload


async def coroutine(execution: WorkerExecution, extra: int = 0) -> Any:
    return execution.payload


@pytest.mark.parametrize(
    ("handle", "in_thread"),
    [
        (coroutine, False),
        (AsyncCall(), False),
        (functools.partial(coroutine, extra=1), False),
        (functools.partial(AsyncCall()), False),
        (plain, True),
        (PlainCall(), True),
        (functools.partial(plain, extra=1), True),
        (lambda execution: execution.payload, True),
    ],
)
def test_plain_callables_run_in_threads_and_async_ones_on_the_trio_thread(
    handle: Any, in_thread: bool
) -> None:
    assert WorkerHandler(capability=CAP, handle=handle).in_thread is in_thread


def test_an_execution_tells_its_cancellation_to_any_thread() -> None:
    signal = threading.Event()
    execution = WorkerExecution(
        task_id="t1",
        attempt_id="a1",
        epoch=1,
        capability=CAP,
        payload={},
        payload_text="{}",
        attempt_deadline_ms=0,
        cancel_signal=signal,
    )
    execution.raise_if_cancelled()  # not cancelled: nothing happens
    assert (execution.cancelled, execution.wait_cancelled(timeout_s=0)) == (False, False)
    threading.Timer(0.01, signal.set).start()
    assert execution.wait_cancelled(timeout_s=30)
    assert execution.cancelled
    with pytest.raises(AttemptCancelled) as cancelled:
        execution.raise_if_cancelled()
    assert cancelled.value.attempt_id == "a1"
    assert "cancel_signal" not in repr(execution)


def test_thirty_two_handlers_are_allowed_and_thirty_three_are_not() -> None:
    def handlers(count: int) -> list[WorkerHandler]:
        return [
            WorkerHandler(
                capability=Capability(handler=f"h{i}", handler_version="1", payload_version="1"),
                handle=handle,
            )
            for i in range(count)
        ]

    assert len(make(handlers=handlers(32)).handlers) == 32
    with pytest.raises(InvalidOption):
        make(handlers=handlers(33))


def nested(depth: int) -> Any:
    """`depth` arrays, one inside the other."""
    value: Any = 1
    for _ in range(depth):
        value = [value]
    return value


@pytest.mark.parametrize(
    ("value", "outcome"),
    [
        (
            {"text": "HELLO", "n": 2**63 - 1},
            Succeeded(result='{"text":"HELLO","n":9223372036854775807}'),
        ),
        (0, Succeeded(result="0")),
        ("é", Succeeded(result='"é"')),
        (None, Unknown(code="INVALID_HANDLER_RESULT")),
        (float("nan"), Unknown(code="INVALID_HANDLER_RESULT")),
        ({"x": float("inf")}, Unknown(code="INVALID_HANDLER_RESULT")),
        (2**63, Unknown(code="INVALID_HANDLER_RESULT")),
        ({1: "a"}, Unknown(code="INVALID_HANDLER_RESULT")),
        ({1, 2}, Unknown(code="INVALID_HANDLER_RESULT")),
        (b"bytes", Unknown(code="INVALID_HANDLER_RESULT")),
        ("x" * MAX_JSON_BYTES, Unknown(code="INVALID_HANDLER_RESULT")),
        (nested(MAX_NESTING + 1), Unknown(code="INVALID_HANDLER_RESULT")),
        (nested(100_000), Unknown(code="INVALID_HANDLER_RESULT")),
        (
            {"raw": RawJson("[1.10, 1E5]"), "exact": decimal.Decimal("2.50")},
            Succeeded(result='{"raw":[1.10, 1E5],"exact":2.50}'),
        ),
        (RawJson('{"x": NaN}'), Unknown(code="INVALID_HANDLER_RESULT")),
        (RawJson("[" * 100_000 + "]" * 100_000), Unknown(code="INVALID_HANDLER_RESULT")),
        (RawJson('"\\ud800"'), Unknown(code="INVALID_HANDLER_RESULT")),
        (decimal.Decimal("1e400"), Unknown(code="INVALID_HANDLER_RESULT")),
        (decimal.Decimal("NaN"), Unknown(code="INVALID_HANDLER_RESULT")),
    ],
)
def test_a_returned_value_becomes_a_result_only_if_the_hub_can_take_it(
    value: Any, outcome: Any
) -> None:
    assert returned(value) == outcome


def test_an_unfit_result_is_refused_naming_its_path() -> None:
    with pytest.raises(InvalidJson) as refused:
        json_text({"items": [1, {"price": float("nan")}]})
    assert refused.value.field == "result.items[1].price"
    with pytest.raises(InvalidJson) as refused:
        json_text({"raw": RawJson("[1, 18446744073709551616]")}, "details")
    assert refused.value.field == "details.raw[1]"


def test_a_handler_gets_floats_or_exact_decimals_as_declared() -> None:
    text = '{"price": 1.10, "id": 1234567890123456789}'
    plain = WorkerHandler(capability=CAP, handle=handle)
    exact = WorkerHandler(capability=CAP, handle=handle, decimals=True)
    assert plain.payload_of(text) == {"price": 1.1, "id": 1234567890123456789}
    assert exact.payload_of(text) == {"price": decimal.Decimal("1.10"), "id": 1234567890123456789}
    assert str(exact.payload_of(text)["price"]) == "1.10"
    with pytest.raises(ValueError, match=r"payload\.x"):
        plain.payload_of('{"x": NaN}')


def test_results_at_the_limits_are_taken() -> None:
    assert isinstance(returned(nested(MAX_NESTING)), Succeeded)
    biggest = "x" * (MAX_JSON_BYTES - 2)  # plus two quotes
    assert len(json_text(biggest).encode()) == MAX_JSON_BYTES


@pytest.mark.parametrize(
    ("error", "outcome"),
    [
        (
            WorkerFailure("OBJECT_REJECTED", {"why": "size"}),
            Failed(code="OBJECT_REJECTED", details='{"why":"size"}'),
        ),
        (WorkerFailure("OBJECT_REJECTED"), Failed(code="OBJECT_REJECTED", details="{}")),
        (
            WorkerFailure("TEMPORARY_REJECTION", retryable=True),
            Failed(code="TEMPORARY_REJECTION", details="{}", retryable=True),
        ),
        (WorkerFailure("lower-case"), Unknown(code="INVALID_HANDLER_RESULT")),
        (WorkerFailure("BAD_DETAILS", {"x": float("nan")}), Unknown(code="INVALID_HANDLER_RESULT")),
        (OutcomeUnknown("PARTLY_WRITTEN"), Unknown(code="PARTLY_WRITTEN")),
        (OutcomeUnknown("lower-case"), Unknown(code="INVALID_HANDLER_RESULT")),
        (RuntimeError("the database password is hunter2"), Unknown(code="HANDLER_ERROR")),
        (SystemExit(3), Unknown(code="HANDLER_ABORTED")),
        (GeneratorExit(), Unknown(code="HANDLER_ABORTED")),
        (BaseException("odd"), Unknown(code="HANDLER_PANIC")),
    ],
)
def test_a_raised_error_is_classified_and_its_text_never_sent(
    error: BaseException, outcome: Any
) -> None:
    assert raised(error) == outcome
    assert "hunter2" not in repr(raised(error))
