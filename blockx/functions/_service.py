"""The code refresher: the Trio task that keeps a `FunctionCodeView` fed from a source.

Owns polling the source, observing new snapshots, and purging expired ones.
Must never let a source failure end the task: it logs, keeps the last good
snapshot, and tries again on the next tick. Source calls block, so they run
in a thread.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import NoReturn, TypeVar

import trio

from blockx.errors import BlockxError
from blockx.functions._errors import InvalidCodeViewConfig
from blockx.functions._sources import FunctionSource
from blockx.functions._view import FunctionCodeView

logger = logging.getLogger("blockx.functions")

T = TypeVar("T")


async def run_code_refresher(
    view: FunctionCodeView,
    source: FunctionSource,
    *,
    interval_s: float,
    clock_ms: Callable[[], int],
    use_thread: bool = True,
    task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED,
) -> NoReturn:
    """Poll `source` every `interval_s`, observe what is current, purge, forever.

    `task_status.started(epoch)` is called after the first successful load, so
    `await nursery.start(run_code_refresher, ...)` returns once there is code
    to pin. `use_thread=False` runs the source's calls on the Trio thread: only
    for in-memory sources, where it keeps virtual-clock tests exact.
    """
    if not interval_s > 0:
        raise InvalidCodeViewConfig(field="interval_s", value=interval_s, allowed="must be > 0")
    started = False
    failing = False
    while True:
        try:
            changed = await _refresh_once(view, source, clock_ms, use_thread=use_thread)
        except BlockxError as error:
            # The first failure of a run is a warning; repeats would flood the log.
            level = logging.DEBUG if failing else logging.WARNING
            logger.log(
                level,
                "function code refresh from %r failed; keeping epoch %s: %s",
                source,
                view.current_epoch,
                error,
            )
            failing = True
        else:
            if failing:
                logger.info("function code refresh from %r works again", source)
                failing = False
            if changed:
                logger.info("function code epoch %s is current", view.current_epoch)
            if not started and view.current_epoch is not None:
                task_status.started(view.current_epoch)
                started = True
        for epoch in view.purge(clock_ms()):
            logger.info("function code epoch %s purged", epoch)
        await trio.sleep(interval_s)


async def _refresh_once(
    view: FunctionCodeView,
    source: FunctionSource,
    clock_ms: Callable[[], int],
    *,
    use_thread: bool,
) -> bool:
    epoch = await _call(source.current_epoch, use_thread=use_thread)
    if epoch == view.current_epoch:
        return False
    snapshot = (
        view.snapshot(epoch)
        if view.has_epoch(epoch)
        else await _call(lambda: source.load(epoch), use_thread=use_thread)
    )
    return view.observe(snapshot, clock_ms())


async def _call(fn: Callable[[], T], *, use_thread: bool) -> T:
    if not use_thread:
        return fn()
    # Abandoning is safe: source reads have no effects, and shutdown must not
    # wait for a network timeout.
    return await trio.to_thread.run_sync(fn, abandon_on_cancel=True)
