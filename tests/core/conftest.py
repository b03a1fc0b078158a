"""Fixtures of the core tests: machines that are checked at teardown."""

from collections.abc import Iterator

import pytest

from blockx.dispatch import DispatchCore
from blockx.slots import SlotMachine
from tests.core.autoworker_events import WorkerCoreFactory
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


@pytest.fixture
def core() -> Iterator[DispatchCore]:
    """A dispatch core that passes check_invariants() at teardown."""
    core = DispatchCore()
    yield core
    core.check_invariants()


@pytest.fixture
def make_worker_core() -> Iterator[WorkerCoreFactory]:
    """Makes automatic worker cores; every one passes check_invariants() at teardown."""
    factory = WorkerCoreFactory()
    yield factory
    factory.check_all()
