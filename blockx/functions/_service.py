"""The code refresher: the Trio task that polls a function source for new snapshots.

Owns polling the source and loading the snapshot of each new current epoch;
it hands every snapshot to `deliver` (the owner of the worker's
`FunctionCodeView` observes it). It never touches the view itself. It must
never let a source failure end the task: it logs, and tries again on the next
tick. Source calls block, so they run in a thread.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import NoReturn, TypeVar

import trio

from blockx.errors import BlockxError
from blockx.functions._errors import InvalidCodeViewConfig
from blockx.functions._snapshot import FunctionSnapshot
from blockx.functions._sources import FunctionSource

logger = logging.getLogger("blockx.functions")

T = TypeVar("T")


async def run_code_refresher(
    source: FunctionSource,
    deliver: Callable[[FunctionSnapshot], None],
    *,
    interval_s: float,
    use_thread: bool = True,
    first: FunctionSnapshot | None = None,
    task_status: trio.TaskStatus[FunctionSnapshot] = trio.TASK_STATUS_IGNORED,
) -> NoReturn:
    """Poll `source` every `interval_s` forever; `deliver` each new current snapshot.

    `task_status.started(snapshot)` hands over the first snapshot loaded (it is
    not delivered), so `await nursery.start(run_code_refresher, ...)` returns
    once there is code to pin; `first`, a snapshot the caller already read from
    `source`, is handed over at once instead and the first poll waits
    `interval_s`. `use_thread=False` runs the source's calls on the Trio
    thread: only for in-memory sources, where it keeps virtual-clock tests exact.
    """
    InvalidCodeViewConfig.check(
        interval_s > 0, field="interval_s", value=interval_s, allowed="must be > 0"
    )
    current: str | None = None
    failing = False
    if first is not None:
        task_status.started(first)
        current = first.epoch
        await trio.sleep(interval_s)
    while True:
        try:
            snapshot = await _load_if_new(source, current, use_thread=use_thread)
        except BlockxError as error:
            # The first failure of a run is a warning; repeats would flood the log.
            level = logging.DEBUG if failing else logging.WARNING
            if current is None:
                logger.log(level, "no function code yet (waiting for it to start): %s", error)
            else:
                logger.log(
                    level,
                    "function code refresh from %r failed; keeping epoch %s: %s",
                    source,
                    current,
                    error,
                )
            failing = True
        else:
            if failing:
                logger.info("function code refresh from %r works again", source)
                failing = False
            if snapshot is not None:
                logger.info("function code epoch %s is current", snapshot.epoch)
                if current is None:
                    task_status.started(snapshot)
                else:
                    deliver(snapshot)
                current = snapshot.epoch
        await trio.sleep(interval_s)


async def _load_if_new(
    source: FunctionSource, current: str | None, *, use_thread: bool
) -> FunctionSnapshot | None:
    epoch = await _call(source.current_epoch, use_thread=use_thread)
    if epoch == current:
        return None
    return await _call(lambda: source.load(epoch), use_thread=use_thread)


async def _call(fn: Callable[[], T], *, use_thread: bool) -> T:
    if not use_thread:
        return fn()
    # Abandoning is safe: source reads have no effects, and shutdown must not
    # wait for a network timeout.
    return await trio.to_thread.run_sync(fn, abandon_on_cancel=True)
