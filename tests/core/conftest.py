"""Fixtures of the core tests: slot machines that are checked at teardown."""

from collections.abc import Iterator

import pytest

from blockx.slots import SlotMachine
from tests.core.slots_helpers import MachineFactory


@pytest.fixture
def make_machine() -> Iterator[MachineFactory]:
    """Makes machines; every one of them passes check_invariants() at teardown."""
    factory = MachineFactory()
    yield factory
    factory.check_all()


@pytest.fixture
def machine(make_machine: MachineFactory) -> SlotMachine:
    return make_machine()
