"""The function code view and snapshots: pinning, supersede and purge times, retention rules.

Pure: every time is an explicit `now_ms`. Every view a test makes has its
invariants checked at teardown.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from blockx.config import default_config
from blockx.functions import (
    ChangeKind,
    CodeViewConfig,
    EpochConflict,
    EpochStatus,
    FunctionCodeView,
    FunctionSnapshot,
    InvalidCodeViewConfig,
    InvalidEpoch,
    InvalidModuleName,
    NoCurrentEpoch,
    TaskNotPinned,
    UnknownEpoch,
    UnknownModule,
    ViewChange,
    content_epoch,
)

# retention 0 -> max task timeout + 10 s = 15 000 ms
CONFIG = CodeViewConfig(max_task_timeout_ms=5_000, retention_ms=0)

OLD = FunctionSnapshot.of({"demo": "def add(a, b):\n    return a + b\n"})
NEW = FunctionSnapshot.of({"demo": "def add(a, b):\n    return a - b\n"})
THIRD = FunctionSnapshot.of({"demo": "def add(a, b):\n    return a * b\n"})

ViewFactory = Callable[..., FunctionCodeView]


@pytest.fixture
def make_view() -> Iterator[ViewFactory]:
    views: list[FunctionCodeView] = []

    def make(config: CodeViewConfig = CONFIG) -> FunctionCodeView:
        view = FunctionCodeView(config)
        views.append(view)
        return view

    yield make
    for view in views:
        view.check_invariants()


# --- configuration -------------------------------------------------------------------------


def test_retention_zero_means_max_task_timeout_plus_ten_seconds() -> None:
    assert CONFIG.effective_retention_ms == 15_000
    assert default_config().code_view_config().effective_retention_ms == 28_800_000 + 10_000


def test_retention_equal_to_max_task_timeout_is_allowed() -> None:
    config = CodeViewConfig(max_task_timeout_ms=5_000, retention_ms=5_000)
    assert config.effective_retention_ms == 5_000


@pytest.mark.parametrize("retention_ms", [4_999, 1, -1])
def test_retention_below_max_task_timeout_is_refused_naming_the_field(retention_ms: int) -> None:
    with pytest.raises(InvalidCodeViewConfig) as caught:
        CodeViewConfig(max_task_timeout_ms=5_000, retention_ms=retention_ms)
    assert caught.value.field == "functionSnapshotRetentionMs"
    assert caught.value.value == retention_ms
    assert "functionSnapshotRetentionMs" in str(caught.value)


def test_max_task_timeout_must_be_positive() -> None:
    with pytest.raises(InvalidCodeViewConfig) as caught:
        CodeViewConfig(max_task_timeout_ms=0, retention_ms=0)
    assert caught.value.field == "maxTaskTimeoutMs"


# --- snapshots -----------------------------------------------------------------------------


def test_content_epoch_is_stable_and_order_independent() -> None:
    forward = {"a": "x = 1\n", "b": "y = 2\n"}
    backward = {"b": "y = 2\n", "a": "x = 1\n"}
    assert content_epoch(forward) == content_epoch(backward)
    assert len(content_epoch(forward)) == 16
    assert content_epoch(forward) != content_epoch({"a": "x = 1\n", "b": "y = 3\n"})


def test_content_epoch_frames_names_and_texts_apart() -> None:
    assert content_epoch({"a": "bc"}) != content_epoch({"ab": "c"})
    assert content_epoch({}) != content_epoch({"a": ""})


def test_snapshot_copies_its_modules() -> None:
    modules = {"demo": "x = 1\n"}
    snapshot = FunctionSnapshot.of(modules)
    modules["demo"] = "x = 2\n"
    assert snapshot.modules == {"demo": "x = 1\n"}
    assert snapshot == FunctionSnapshot.of({"demo": "x = 1\n"})
    assert hash(snapshot) == hash(FunctionSnapshot.of({"demo": "x = 1\n"}))


@pytest.mark.parametrize("name", ["", "a-b", "pkg.", "class", "pkg.__init__", "1abc", "a..b"])
def test_snapshot_refuses_module_names_python_cannot_import(name: str) -> None:
    with pytest.raises(InvalidModuleName) as caught:
        FunctionSnapshot.of({name: ""})
    assert caught.value.module == name


@pytest.mark.parametrize("epoch", ["", "has space", "x" * 129, "tab\t"])
def test_snapshot_refuses_unusable_epochs(epoch: str) -> None:
    with pytest.raises(InvalidEpoch):
        FunctionSnapshot(epoch=epoch, modules={})


def test_packages_follow_the_python_init_convention() -> None:
    snapshot = FunctionSnapshot.of(
        {"pkg": "from . import mod\n", "pkg.mod": "X = 1\n", "ns.deep.leaf": "Y = 2\n"}
    )
    assert snapshot.is_package("pkg")
    assert not snapshot.is_package("pkg.mod")
    assert snapshot.source_of("pkg") == "from . import mod\n"
    assert snapshot.source_of("pkg.__init__") == "from . import mod\n"
    # A directory without __init__.py is a package with no source of its own.
    assert snapshot.is_package("ns")
    assert snapshot.is_package("ns.deep")
    assert snapshot.source_of("ns.deep") == ""
    assert snapshot.source_of("ns.deep.__init__") == ""
    with pytest.raises(UnknownModule):
        snapshot.source_of("pkg.mod.__init__")
    with pytest.raises(UnknownModule):
        snapshot.source_of("absent")


# --- observing and pinning -----------------------------------------------------------------


def test_pin_before_any_snapshot_is_refused(make_view: ViewFactory) -> None:
    view = make_view()
    with pytest.raises(NoCurrentEpoch) as caught:
        view.pin("task-1", now_ms=0)
    assert caught.value.task_id == "task-1"
    assert view.current_epoch is None
    assert view.pinned_epoch("task-1") is None


def test_observe_makes_the_snapshot_current(make_view: ViewFactory) -> None:
    view = make_view()
    assert view.observe(OLD, now_ms=0) is True
    assert view.current_epoch == OLD.epoch
    assert view.observe(OLD, now_ms=10) is False
    assert view.status() == [
        EpochStatus(
            epoch=OLD.epoch,
            current=True,
            superseded_at_ms=None,
            pinned_by=frozenset(),
            purge_due_at_ms=None,
        )
    ]


def test_code_changed_mid_task_does_not_change_what_the_running_task_sees(
    make_view: ViewFactory,
) -> None:
    view = make_view()
    view.observe(OLD, now_ms=0)
    assert view.pin("task-1", now_ms=100) == OLD.epoch

    view.observe(NEW, now_ms=1_000)

    epoch = view.pinned_epoch("task-1")
    assert epoch == OLD.epoch
    assert view.module_source(epoch, "demo") == OLD.modules["demo"]
    # Pinning again keeps the task on its first epoch.
    assert view.pin("task-1", now_ms=1_100) == OLD.epoch
    # A task that starts now sees the new code.
    assert view.pin("task-2", now_ms=1_200) == NEW.epoch
    assert view.module_source(NEW.epoch, "demo") == NEW.modules["demo"]


def test_unpin_releases_the_pin(make_view: ViewFactory) -> None:
    view = make_view()
    view.observe(OLD, now_ms=0)
    view.pin("task-1", now_ms=1)
    view.unpin("task-1", now_ms=2)
    assert view.pinned_epoch("task-1") is None
    assert list(view.recent) == [
        ViewChange(at_ms=0, kind=ChangeKind.OBSERVED, epoch=OLD.epoch),
        ViewChange(at_ms=1, kind=ChangeKind.PINNED, epoch=OLD.epoch, task_id="task-1"),
        ViewChange(at_ms=2, kind=ChangeKind.UNPINNED, epoch=OLD.epoch, task_id="task-1"),
    ]


def test_unpin_without_a_pin_is_refused_and_changes_nothing(make_view: ViewFactory) -> None:
    view = make_view()
    view.observe(OLD, now_ms=0)
    before = view.status()
    with pytest.raises(TaskNotPinned) as caught:
        view.unpin("task-9", now_ms=5)
    assert caught.value.task_id == "task-9"
    assert view.status() == before


def test_module_source_names_what_is_missing(make_view: ViewFactory) -> None:
    view = make_view()
    view.observe(OLD, now_ms=0)
    with pytest.raises(UnknownEpoch) as no_epoch:
        view.module_source("feedfacefeedface", "demo")
    assert no_epoch.value.epoch == "feedfacefeedface"
    with pytest.raises(UnknownModule) as no_module:
        view.module_source(OLD.epoch, "helpers")
    assert (no_module.value.epoch, no_module.value.module) == (OLD.epoch, "helpers")
    assert "helpers" in str(no_module.value)


def test_same_epoch_with_other_content_is_refused_and_changes_nothing(
    make_view: ViewFactory,
) -> None:
    view = make_view()
    view.observe(OLD, now_ms=0)
    forged = FunctionSnapshot(epoch=OLD.epoch, modules={"demo": "evil = True\n"})
    with pytest.raises(EpochConflict) as caught:
        view.observe(forged, now_ms=1)
    assert caught.value.epoch == OLD.epoch
    assert view.module_source(OLD.epoch, "demo") == OLD.modules["demo"]


def test_a_known_epoch_can_become_current_again(make_view: ViewFactory) -> None:
    view = make_view()
    view.observe(OLD, now_ms=0)
    view.observe(NEW, now_ms=1_000)
    assert view.observe(OLD, now_ms=2_000) is True
    assert view.current_epoch == OLD.epoch
    assert [(s.epoch, s.current, s.superseded_at_ms) for s in view.status()] == [
        (OLD.epoch, True, None),
        (NEW.epoch, False, 2_000),
    ]


# --- purging -------------------------------------------------------------------------------


def test_superseded_snapshot_is_purged_exactly_when_retention_has_passed(
    make_view: ViewFactory,
) -> None:
    view = make_view()
    view.observe(OLD, now_ms=0)
    view.observe(NEW, now_ms=1_000)
    assert view.status()[1].purge_due_at_ms == 16_000

    assert view.purge(now_ms=15_999) == []
    assert view.module_source(OLD.epoch, "demo") == OLD.modules["demo"]

    assert view.purge(now_ms=16_000) == [OLD.epoch]
    assert view.known_epochs() == [NEW.epoch]
    with pytest.raises(UnknownEpoch):
        view.module_source(OLD.epoch, "demo")


def test_current_snapshot_is_never_purged(make_view: ViewFactory) -> None:
    view = make_view()
    view.observe(OLD, now_ms=0)
    assert view.purge(now_ms=10**12) == []
    assert view.current_epoch == OLD.epoch


def test_pinned_epoch_outlives_retention_until_unpinned(make_view: ViewFactory) -> None:
    view = make_view()
    view.observe(OLD, now_ms=0)
    view.pin("task-1", now_ms=500)
    view.observe(NEW, now_ms=1_000)

    assert view.purge(now_ms=100_000) == []
    assert view.module_source(OLD.epoch, "demo") == OLD.modules["demo"]

    view.unpin("task-1", now_ms=100_500)
    assert view.purge(now_ms=100_500) == [OLD.epoch]


def test_purge_drops_only_due_epochs(make_view: ViewFactory) -> None:
    view = make_view()
    view.observe(OLD, now_ms=0)
    view.observe(NEW, now_ms=1_000)  # OLD due at 16 000
    view.observe(THIRD, now_ms=3_000)  # NEW due at 18 000

    assert view.purge(now_ms=17_000) == [OLD.epoch]
    assert view.known_epochs() == sorted([NEW.epoch, THIRD.epoch])
    assert view.purge(now_ms=18_000) == [NEW.epoch]
    assert view.known_epochs() == [THIRD.epoch]
    assert view.recent[-1] == ViewChange(at_ms=18_000, kind=ChangeKind.PURGED, epoch=NEW.epoch)


def test_explicit_retention_is_used(make_view: ViewFactory) -> None:
    view = make_view(CodeViewConfig(max_task_timeout_ms=5_000, retention_ms=7_000))
    view.observe(OLD, now_ms=0)
    view.observe(NEW, now_ms=1_000)
    assert view.purge(now_ms=7_999) == []
    assert view.purge(now_ms=8_000) == [OLD.epoch]
