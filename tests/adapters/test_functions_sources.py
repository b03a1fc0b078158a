"""Function code sources (directory, memory) and the code refresher under Trio.

Refresher tests run on the virtual clock (`autojump_clock`) and assert exact
times; the memory source is called on the Trio thread there so that no real
thread races the clock. Every async test runs under `fail_after`.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest
import trio
import trio.testing

from blockx.config import default_config
from blockx.functions import (
    ChangeKind,
    CodeViewConfig,
    DirectorySource,
    EpochModules,
    FunctionCodeView,
    FunctionSnapshot,
    InvalidCodeViewConfig,
    InvalidModuleName,
    MemorySource,
    NothingPublished,
    SourceUnavailable,
    UnknownEpoch,
    ViewChange,
    content_epoch,
    run_code_refresher,
)

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "functions"

V1 = "def add(a, b):\n    return a + b\n"
V2 = "def add(a, b):\n    return a - b\n"


def clock_ms() -> int:
    return round(trio.current_time() * 1000)


def write(root: Path, relative: str, text: str) -> None:
    path = root / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")


# --- DirectorySource -----------------------------------------------------------------------


def test_directory_epoch_is_the_content_hash_and_stable(tmp_path: Path) -> None:
    write(tmp_path, "demo.py", V1)
    source = DirectorySource(tmp_path)
    epoch = source.current_epoch()
    assert epoch == source.current_epoch()
    assert epoch == DirectorySource(tmp_path).current_epoch()
    assert epoch == content_epoch({"demo": V1})


def test_directory_change_makes_a_new_epoch_and_the_old_stays_loadable(tmp_path: Path) -> None:
    write(tmp_path, "demo.py", V1)
    source = DirectorySource(tmp_path)
    old = source.current_epoch()

    write(tmp_path, "demo.py", V2)
    new = source.current_epoch()

    assert new != old
    assert source.load(old).modules == {"demo": V1}
    assert source.load(new).modules == {"demo": V2}
    with pytest.raises(UnknownEpoch):
        source.load("0123456789abcdef")


def test_directory_layout_maps_to_dotted_module_names(tmp_path: Path) -> None:
    write(tmp_path, "demo.py", "A = 1\n")
    write(tmp_path, "pkg/__init__.py", "B = 2\n")
    write(tmp_path, "pkg/sub/mod.py", "C = 3\n")
    write(tmp_path, ".hidden.py", "ignored\n")
    write(tmp_path, ".git/config.py", "ignored\n")
    write(tmp_path, "pkg/__pycache__/mod.py", "ignored\n")
    write(tmp_path, "notes.txt", "ignored\n")

    snapshot = DirectorySource(tmp_path).load(DirectorySource(tmp_path).current_epoch())

    assert dict(snapshot.modules) == {"demo": "A = 1\n", "pkg": "B = 2\n", "pkg.sub.mod": "C = 3\n"}
    assert snapshot.is_package("pkg")
    assert snapshot.is_package("pkg.sub")


@pytest.mark.parametrize("relative", ["my-functions.py", "pkg/class.py", "__init__.py"])
def test_directory_files_that_cannot_be_imported_are_errors(tmp_path: Path, relative: str) -> None:
    write(tmp_path, relative, "X = 1\n")
    with pytest.raises(InvalidModuleName) as caught:
        DirectorySource(tmp_path).current_epoch()
    assert relative in caught.value.origin


def test_missing_or_unreadable_directory_is_unavailable(tmp_path: Path) -> None:
    with pytest.raises(SourceUnavailable) as missing:
        DirectorySource(tmp_path / "absent").current_epoch()
    assert missing.value.source == str(tmp_path / "absent")

    (tmp_path / "latin1.py").write_bytes(b"NAME = '\xe9'\n")
    with pytest.raises(SourceUnavailable):
        DirectorySource(tmp_path).current_epoch()


def test_the_example_functions_load_and_run() -> None:
    source = DirectorySource(EXAMPLES)
    snapshot = source.load(source.current_epoch())
    assert {"demo", "text"} <= set(snapshot.modules)

    with EpochModules(lambda epoch, module: source.load(epoch).source_of(module)) as loader:
        assert loader.resolve(snapshot.epoch, "demo.add")(2, 3) == 5
        assert loader.resolve(snapshot.epoch, "demo.echo")({"k": 1}) == {"k": 1}
        assert loader.resolve(snapshot.epoch, "text.upper")("abc") == "ABC"
        assert loader.resolve(snapshot.epoch, "text.shout")("hi") == "HI!"
        with pytest.raises(RuntimeError, match="on purpose"):
            loader.resolve(snapshot.epoch, "demo.fail")("on purpose")


# --- MemorySource --------------------------------------------------------------------------


def test_memory_source_publishes_content_epochs() -> None:
    source = MemorySource()
    with pytest.raises(NothingPublished):
        source.current_epoch()

    old = source.publish({"demo": V1})
    assert old == content_epoch({"demo": V1})
    assert source.current_epoch() == old
    new = source.publish({"demo": V2})
    assert source.current_epoch() == new
    assert source.load(old).modules == {"demo": V1}
    assert source.publish({"demo": V1}) == old


def test_memory_source_can_play_an_outage() -> None:
    source = MemorySource()
    source.publish({"demo": V1})
    source.unavailable = True
    with pytest.raises(SourceUnavailable):
        source.current_epoch()
    source.unavailable = False
    assert source.current_epoch() == content_epoch({"demo": V1})


# --- run_code_refresher --------------------------------------------------------------------


class Delivered:
    """The refresher's `deliver`: records when each snapshot came and, as the slot table
    does, has the worker's `FunctionCodeView` observe it."""

    def __init__(self, view: FunctionCodeView) -> None:
        self.view = view
        self.snapshots: list[tuple[int, FunctionSnapshot]] = []

    def __call__(self, snapshot: FunctionSnapshot) -> None:
        self.snapshots.append((clock_ms(), snapshot))
        self.view.observe(snapshot, clock_ms())

    @property
    def epochs(self) -> list[tuple[int, str]]:
        return [(at_ms, snapshot.epoch) for at_ms, snapshot in self.snapshots]


def refresher(
    deliver: Delivered, source: MemorySource, interval_s: float = 1.0
) -> Callable[..., Awaitable[object]]:
    return functools.partial(
        run_code_refresher,
        source,
        deliver,
        interval_s=interval_s,
        use_thread=False,
    )


async def start_refresher(
    nursery: trio.Nursery, deliver: Delivered, source: MemorySource
) -> FunctionSnapshot:
    """Start the refresher; its first snapshot is handed over (not delivered) and observed."""
    first: FunctionSnapshot = await nursery.start(refresher(deliver, source))
    deliver.view.observe(first, clock_ms())
    return first


async def test_refresher_follows_changes_and_keeps_pinned_code_until_retention(
    autojump_clock: trio.testing.MockClock,
) -> None:
    source = MemorySource()
    old = source.publish({"demo": V1})
    # Retention: 5 000 + 10 000 ms.
    view = FunctionCodeView(CodeViewConfig(max_task_timeout_ms=5_000, retention_ms=0))
    deliver = Delivered(view)

    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            first = await start_refresher(nursery, deliver, source)
            assert first.epoch == old
            assert first.modules == {"demo": V1}
            assert trio.current_time() == 0
            assert deliver.snapshots == []  # the first snapshot is handed over, not delivered
            assert view.pin("task-1", clock_ms()) == old

            new = source.publish({"demo": V2})
            await trio.sleep_until(0.5)
            assert deliver.snapshots == []
            assert view.current_epoch == old

            await trio.sleep_until(1.5)  # polled at 1.0
            assert deliver.epochs == [(1_000, new)]
            assert deliver.snapshots[0][1].modules == {"demo": V2}
            assert view.current_epoch == new
            assert ViewChange(at_ms=1_000, kind=ChangeKind.SUPERSEDED, epoch=old) in view.recent
            # The running task still sees the code it started with.
            assert view.pinned_epoch("task-1") == old
            assert view.module_source(old, "demo") == V1
            assert view.module_source(new, "demo") == V2
            view.unpin("task-1", clock_ms())

            await trio.sleep_until(15.5)
            # The epoch stays current: polls at 2 .. 15 deliver nothing again.
            assert deliver.epochs == [(1_000, new)]
            # The owner of the view purges: not before superseded + retention = 16 000.
            assert view.purge(15_999) == []
            assert view.has_epoch(old)
            await trio.sleep_until(16.0)
            assert view.purge(clock_ms()) == [old]
            assert not view.has_epoch(old)
            assert ViewChange(at_ms=16_000, kind=ChangeKind.PURGED, epoch=old) in view.recent

            nursery.cancel_scope.cancel()
    view.check_invariants()


async def test_a_first_snapshot_already_read_is_handed_over_at_once(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """The worker reads a directory once to check it; the refresher does not read it again
    to start, and polls one interval later."""
    source = MemorySource()
    already = source.load(source.publish({"demo": V1}))
    source.unavailable = True  # a read now would fail: the start must not read
    deliver = Delivered(FunctionCodeView(default_config().code_view_config()))

    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            started = await nursery.start(
                functools.partial(refresher(deliver, source), first=already)
            )
            assert (started, trio.current_time()) == (already, 0.0)
            source.unavailable = False
            changed = source.publish({"demo": V2})
            await trio.sleep_until(1.5)  # the first poll is at 1.0
            assert deliver.epochs == [(1_000, changed)]
            nursery.cancel_scope.cancel()


async def test_refresher_starts_after_the_first_good_load_and_survives_outages(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="blockx.functions")
    source = MemorySource()
    source.unavailable = True
    view = FunctionCodeView(default_config().code_view_config())
    deliver = Delivered(view)

    async def recover_at_3_5() -> None:
        await trio.sleep_until(3.5)
        source.publish({"demo": V1})
        source.unavailable = False

    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(recover_at_3_5)
            first = await start_refresher(nursery, deliver, source)
            assert trio.current_time() == 4.0  # polls at 0, 1, 2, 3 failed
            assert first.epoch == content_epoch({"demo": V1})
            assert first.epoch == view.current_epoch

            # Outage after success: nothing is delivered, the last good snapshot stays current.
            source.unavailable = True
            second = source.publish({"demo": V2})
            await trio.sleep_until(8.5)
            assert deliver.snapshots == []
            assert view.current_epoch == first.epoch
            assert view.pin("task-1", clock_ms()) == first.epoch

            source.unavailable = False
            await trio.sleep_until(9.5)  # polled at 9.0
            assert deliver.epochs == [(9_000, second)]
            assert view.current_epoch == second
            nursery.cancel_scope.cancel()

    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    # One warning per outage, however many polls it lasted.
    assert len(warnings) == 2
    before_first, during_outage = (r.getMessage() for r in warnings)
    assert before_first.startswith("no function code yet (waiting for it to start): ")
    assert "keeping epoch" in during_outage
    view.check_invariants()


async def test_refresher_rejects_a_non_positive_interval() -> None:
    delivered: list[FunctionSnapshot] = []
    with trio.fail_after(5), pytest.raises(InvalidCodeViewConfig) as caught:
        await run_code_refresher(MemorySource(), delivered.append, interval_s=0)
    assert caught.value.field == "interval_s"
    assert delivered == []


async def test_refresher_reads_a_directory_in_a_thread(tmp_path: Path) -> None:
    write(tmp_path, "demo.py", V1)
    delivered: list[FunctionSnapshot] = []
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            first = await nursery.start(
                functools.partial(
                    run_code_refresher,
                    DirectorySource(tmp_path),
                    delivered.append,
                    interval_s=0.05,
                )
            )
            assert first.epoch == content_epoch({"demo": V1})
            assert first.source_of("demo") == V1
            nursery.cancel_scope.cancel()
    assert delivered == []  # the directory never changed
