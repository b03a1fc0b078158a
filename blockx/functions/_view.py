"""The function code view: which epochs a worker knows, which is current, who pins what.

Owns the bookkeeping behind `taskCodeEpoch`: the current snapshot, superseded
snapshots kept for `functionSnapshotRetentionMs`, per-task pins and purging.
Pure: must never do IO, read a clock or import trio; time arrives as `now_ms`.

Rules (checked by `check_invariants`):

* exactly one known epoch is current once any snapshot has been observed; it
  has no supersede time, every other known epoch has one;
* a task pins one epoch for its whole life, the one current when it pinned;
* `purge` drops an epoch only if it is superseded, pinned by no task, and was
  superseded at least the retention ago. A pinned epoch is never dropped.

A refused call (an error) leaves the view exactly as it was.
"""

from __future__ import annotations

import collections
import enum

import attrs

from blockx.functions._errors import (
    EpochConflict,
    InvalidCodeViewConfig,
    NoCurrentEpoch,
    TaskNotPinned,
    UnknownEpoch,
)
from blockx.functions._snapshot import FunctionSnapshot

RETENTION_MARGIN_MS = 10_000
RECENT_CHANGES = 64


@attrs.frozen(kw_only=True)
class CodeViewConfig:
    """`maxTaskTimeoutMs` and `functionSnapshotRetentionMs` (0 = max task timeout + 10 s)."""

    max_task_timeout_ms: int
    retention_ms: int

    def __attrs_post_init__(self) -> None:
        InvalidCodeViewConfig.check(
            self.max_task_timeout_ms > 0,
            field="maxTaskTimeoutMs",
            value=self.max_task_timeout_ms,
            allowed="must be > 0",
        )
        if self.retention_ms != 0 and self.retention_ms < self.max_task_timeout_ms:
            raise InvalidCodeViewConfig(
                field="functionSnapshotRetentionMs",
                value=self.retention_ms,
                allowed=(
                    f"0 (= maxTaskTimeoutMs + {RETENTION_MARGIN_MS} ms) or "
                    f">= maxTaskTimeoutMs ({self.max_task_timeout_ms}), so that a snapshot "
                    "pinned by a running task is never purged"
                ),
            )

    @property
    def effective_retention_ms(self) -> int:
        if self.retention_ms == 0:
            return self.max_task_timeout_ms + RETENTION_MARGIN_MS
        return self.retention_ms


class ChangeKind(enum.Enum):
    OBSERVED = "OBSERVED"
    SUPERSEDED = "SUPERSEDED"
    PINNED = "PINNED"
    UNPINNED = "UNPINNED"
    PURGED = "PURGED"


@attrs.frozen(kw_only=True)
class ViewChange:
    """One entry of the view's bounded log of recent changes (for diagnostics)."""

    at_ms: int
    kind: ChangeKind
    epoch: str
    task_id: str | None = None


@attrs.frozen(kw_only=True)
class EpochStatus:
    epoch: str
    current: bool
    superseded_at_ms: int | None
    pinned_by: frozenset[str]
    purge_due_at_ms: int | None


@attrs.define
class _EpochRecord:
    snapshot: FunctionSnapshot
    superseded_at_ms: int | None = None
    pinned_by: set[str] = attrs.Factory(set)


class FunctionCodeView:
    """The worker's view of function code. Driven by the code refresher and task actors."""

    def __init__(self, config: CodeViewConfig) -> None:
        self.config = config
        self._epochs: dict[str, _EpochRecord] = {}
        self._current: str | None = None
        self._pins: dict[str, str] = {}
        self.recent: collections.deque[ViewChange] = collections.deque(maxlen=RECENT_CHANGES)

    @property
    def current_epoch(self) -> str | None:
        return self._current

    @property
    def retention_ms(self) -> int:
        return self.config.effective_retention_ms

    def has_epoch(self, epoch: str) -> bool:
        return epoch in self._epochs

    def known_epochs(self) -> list[str]:
        return sorted(self._epochs)

    def snapshot(self, epoch: str) -> FunctionSnapshot:
        return self._record(epoch).snapshot

    def pinned_epoch(self, task_id: str) -> str | None:
        return self._pins.get(task_id)

    def observe(self, snapshot: FunctionSnapshot, now_ms: int) -> bool:
        """Record `snapshot` and make it current. True if the current epoch changed.

        A known epoch becomes current again (a rollback) without a new copy; the
        same epoch with different modules is refused with `EpochConflict`.
        """
        known = self._epochs.get(snapshot.epoch)
        if known is not None and known.snapshot.modules != snapshot.modules:
            raise EpochConflict(epoch=snapshot.epoch)
        if self._current == snapshot.epoch:
            return False
        if self._current is not None:
            self._epochs[self._current].superseded_at_ms = now_ms
            self._log(now_ms, ChangeKind.SUPERSEDED, self._current)
        if known is None:
            self._epochs[snapshot.epoch] = _EpochRecord(snapshot=snapshot)
        else:
            known.superseded_at_ms = None
        self._current = snapshot.epoch
        self._log(now_ms, ChangeKind.OBSERVED, snapshot.epoch)
        return True

    def pin(self, task_id: str, now_ms: int) -> str:
        """Pin the current epoch for `task_id` and return it; a second pin returns the first."""
        already = self._pins.get(task_id)
        if already is not None:
            return already
        if self._current is None:
            raise NoCurrentEpoch(task_id=task_id)
        self._pins[task_id] = self._current
        self._epochs[self._current].pinned_by.add(task_id)
        self._log(now_ms, ChangeKind.PINNED, self._current, task_id)
        return self._current

    def unpin(self, task_id: str, now_ms: int) -> None:
        epoch = self._pins.pop(task_id, None)
        if epoch is None:
            raise TaskNotPinned(task_id=task_id)
        self._epochs[epoch].pinned_by.discard(task_id)
        self._log(now_ms, ChangeKind.UNPINNED, epoch, task_id)

    def module_source(self, epoch: str, module: str) -> str:
        """The text of `module` in `epoch` (`pkg.__init__`: see `FunctionSnapshot.source_of`)."""
        return self._record(epoch).snapshot.source_of(module)

    def purge(self, now_ms: int) -> list[str]:
        """Drop superseded, unpinned snapshots whose retention has passed; return their epochs."""
        due = [
            epoch
            for epoch, record in self._epochs.items()
            if record.superseded_at_ms is not None
            and not record.pinned_by
            and now_ms - record.superseded_at_ms >= self.retention_ms
        ]
        for epoch in sorted(due):
            del self._epochs[epoch]
            self._log(now_ms, ChangeKind.PURGED, epoch)
        return sorted(due)

    def status(self) -> list[EpochStatus]:
        """Every known epoch, current first, then by supersede time."""
        statuses = [
            EpochStatus(
                epoch=epoch,
                current=epoch == self._current,
                superseded_at_ms=record.superseded_at_ms,
                pinned_by=frozenset(record.pinned_by),
                purge_due_at_ms=(
                    None
                    if record.superseded_at_ms is None
                    else record.superseded_at_ms + self.retention_ms
                ),
            )
            for epoch, record in self._epochs.items()
        ]
        return sorted(statuses, key=lambda s: (not s.current, s.superseded_at_ms or 0, s.epoch))

    def check_invariants(self) -> None:
        if self._current is None:
            assert not self._epochs, "epochs known but none is current"
            assert not self._pins, "pins held but no epoch was ever current"
            return
        assert self._current in self._epochs, "the current epoch is not known"
        for epoch, record in self._epochs.items():
            assert record.snapshot.epoch == epoch, f"record {epoch!r} holds another epoch"
            assert (record.superseded_at_ms is None) == (epoch == self._current), (
                f"epoch {epoch!r}: only the current epoch lacks a supersede time"
            )
            for task_id in record.pinned_by:
                assert self._pins.get(task_id) == epoch, f"{task_id!r} pin out of sync"
        for task_id, epoch in self._pins.items():
            assert epoch in self._epochs, f"task {task_id!r} pins purged epoch {epoch!r}"
            assert task_id in self._epochs[epoch].pinned_by, f"{task_id!r} pin out of sync"

    def _record(self, epoch: str) -> _EpochRecord:
        record = self._epochs.get(epoch)
        if record is None:
            raise UnknownEpoch(epoch=epoch)
        return record

    def _log(self, at_ms: int, kind: ChangeKind, epoch: str, task_id: str | None = None) -> None:
        self.recent.append(ViewChange(at_ms=at_ms, kind=kind, epoch=epoch, task_id=task_id))
