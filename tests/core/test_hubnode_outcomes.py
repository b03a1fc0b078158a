"""The one table from a node task's end to the hub attempt's outcome (`blockx.hubnode`)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from blockx.calls import FailureCode
from blockx.hubnode import DETERMINISTIC, KIND_OF, NODE, UNCERTAIN, attempt_outcome
from blockx.hubwire import Failed, Succeeded, Unknown
from blockx.slots import TaskPhase, TaskResult, TaskState

DOCUMENT = '{"taskId":"t#1"}'


def ended(
    state: TaskState, code: FailureCode | None = None, phase: TaskPhase = TaskPhase.CALLS
) -> TaskResult:
    return TaskResult(task_id="t#1", slot_id="slot-0", state=state, phase=phase, failure_code=code)


def test_every_failure_code_has_exactly_one_kind() -> None:
    assert set(KIND_OF) == set(FailureCode)
    assert len(DETERMINISTIC) + len(NODE) + len(UNCERTAIN) == len(FailureCode)


def test_a_task_that_succeeded_reports_its_result() -> None:
    assert attempt_outcome(ended(TaskState.SUCCEEDED), DOCUMENT) == Succeeded(result=DOCUMENT)


@pytest.mark.parametrize("code", sorted(DETERMINISTIC))
def test_a_failure_of_the_task_itself_is_final(code: FailureCode) -> None:
    outcome = attempt_outcome(ended(TaskState.FAILED, code), DOCUMENT)
    assert outcome == Failed(code=code.value, details=DOCUMENT, retryable=False)


@pytest.mark.parametrize("code", sorted(NODE))
def test_a_failure_of_the_node_is_retryable_before_the_plugin_and_unknown_in_it(
    code: FailureCode,
) -> None:
    for phase in (TaskPhase.PREPARING, TaskPhase.BUILDER, TaskPhase.CALLS):
        outcome = attempt_outcome(ended(TaskState.FAILED, code, phase), DOCUMENT)
        assert outcome == Failed(code=code.value, details=DOCUMENT, retryable=True)
    in_plugin = attempt_outcome(ended(TaskState.FAILED, code, TaskPhase.PLUGIN), DOCUMENT)
    assert in_plugin == Unknown(code=code.value)  # part of the outputs may be stored


@pytest.mark.parametrize("code", sorted(UNCERTAIN))
def test_a_failure_whose_effect_is_unknown_is_reported_unknown(code: FailureCode) -> None:
    assert attempt_outcome(ended(TaskState.FAILED, code), DOCUMENT) == Unknown(code=code.value)


def test_a_failure_without_a_code_is_unknown() -> None:
    assert attempt_outcome(ended(TaskState.FAILED), DOCUMENT) == Unknown(code="NO_FAILURE_CODE")


def test_the_fleet_page_shows_the_table_as_the_code_has_it() -> None:
    page = (Path(__file__).parents[2] / "docs" / "fleet.md").read_text()

    def codes_of(row_start: str) -> set[str]:
        [row] = [line for line in page.splitlines() if line.startswith(row_start)]
        cell = row.split("|")[1]
        return set(re.findall(r"`([A-Z_]+)`", cell))

    assert codes_of("| FAILED, a failure of the task itself") == {
        *(code.value for code in DETERMINISTIC),
        "INVALID_TASK",
    }
    assert codes_of("| FAILED, a failure of the node") == {code.value for code in NODE}
    assert codes_of("| FAILED, an effect that is unknown") == {code.value for code in UNCERTAIN}
