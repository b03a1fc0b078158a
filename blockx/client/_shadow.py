"""Shadow submits: a sample of accepted submits mirrored to another worker.

Sending side (`ShadowForwarder`, a small coordinator inside the worker): once
the slot table accepted a submit (the reply is RUNNING, so neither a refusal
nor the retained result of a task that already ended) and the submit is not
itself a shadow, the SubmitTask handler calls `offer`. It draws against the
sample rate once per task id (a repeat submit of a running task, which
coordinators send when unsure of the first, is neither drawn again nor
mirrored twice) and puts the task on a bounded queue, or drops it, counted,
when the queue is full. It never waits and never raises: the primary's reply
is not slowed by the shadow target. One sender (`run`, a Trio task in the
worker's system nursery) owns one channel to the target (a `WorkerClient`) and
submits the queued tasks one at a time, each under `SEND_TIMEOUT_S`, into a
slot reserved inline, with the bearer token and TLS settings a client of the
target needs (the worker passes its own token and the client TLS variables).
A failure (target down, refusing, slow) is counted and logged at most once
per `REPORT_INTERVAL_S`; nothing about it reaches the primary's task.

The mark: a mirrored task carries the reserved label `blockx.shadow`
(`blockx.slots.SHADOW_LABEL`) whose value is the source worker's address; its
task id and everything else are the primary's. Receiving side: the SubmitTask
handler of any worker runs a task with that label without its result handler
(`TaskSpec.as_shadow`), so a shadow runs its builder and calls but never
stores outputs; and a shadow is never mirrored again, so two workers that
shadow to each other do not loop.
"""

from __future__ import annotations

import dataclasses
import logging
import random
from collections import OrderedDict
from collections.abc import Callable
from typing import Final

import trio

from blockx._proto.blockx.worker import v1 as pb
from blockx.client._worker import WorkerClient, parse_worker_address
from blockx.net.tls import ClientTls
from blockx.slots import SHADOW_LABEL

logger = logging.getLogger("blockx.shadow")

QUEUE_TASKS: Final = 1_024
"""Mirrored submits waiting for the sender; one more is dropped."""
RECENT_TASKS: Final = 4 * QUEUE_TASKS
"""Task ids whose sampling is remembered, so that a repeat submit is not drawn again."""
SEND_TIMEOUT_S: Final = 2.0
REPORT_INTERVAL_S: Final = 30.0
"""At most one warning about failed or dropped shadow submits per interval."""


def shadow_target(addr: str) -> str:
    """The address the sender dials: ":port" means this host (127.0.0.1)."""
    return f"127.0.0.1{addr}" if addr.startswith(":") else addr


class ShadowForwarder:
    """Mirrors a sample of accepted submits to `target_addr`; see the module docstring.

    The counters (`queued`, `dropped`, `sent`, `failed`) only grow.
    """

    def __init__(
        self,
        *,
        target_addr: str,
        sample_rate: float,
        source_addr: str,
        token: str | None = None,
        tls: ClientTls | None = None,
        queue_tasks: int = QUEUE_TASKS,
        draw: Callable[[], float] = random.random,
    ) -> None:
        """`token` and `tls`: what the sender presents to the target and trusts it with
        (`WorkerClient.connect`); None, plain text without a token."""
        self.target_addr = shadow_target(target_addr)
        self._token = token
        self._tls = tls
        parse_worker_address(self.target_addr)  # InvalidWorkerAddress now, not in the sender
        self.sample_rate = sample_rate
        self.source_addr = source_addr
        self._draw = draw
        self._recent: OrderedDict[str, None] = OrderedDict()
        self._send, self._receive = trio.open_memory_channel[pb.TaskSpec](queue_tasks)
        self.queued = 0
        self.dropped = 0
        self.sent = 0
        self.failed = 0
        self._reported = (0, 0)
        self._reported_at: float | None = None
        self._last_failure = "none"

    def offer(self, task: pb.TaskSpec) -> bool:
        """Queue `task` (accepted by this worker) if sampled. Never waits."""
        if task.task_id in self._recent:
            return False  # a repeat submit: this task was decided on already
        self._recent[task.task_id] = None
        if len(self._recent) > RECENT_TASKS:
            self._recent.popitem(last=False)
        if self.sample_rate < 1.0 and not self._draw() < self.sample_rate:
            return False
        try:
            self._send.send_nowait(task)
        except (trio.WouldBlock, trio.BrokenResourceError, trio.ClosedResourceError):
            self.dropped += 1
            return False
        self.queued += 1
        return True

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """The sender: submit queued tasks to the target until cancelled.

        Must run inside trio-asyncio's loop. The channel connects lazily, so a
        target that is down shows as failed sends, not as an error here.
        """
        try:
            async with WorkerClient.connect(
                self.target_addr, token=self._token, tls=self._tls
            ) as client:
                task_status.started()
                async for task in self._receive:
                    await self._send_one(client, task)
                    self._report(trio.current_time())
        finally:
            self._receive.close()
            logger.info(
                "shadow submits to %s: %d sent, %d failed, %d dropped",
                self.target_addr,
                self.sent,
                self.failed,
                self.dropped,
            )

    async def _send_one(self, client: WorkerClient, task: pb.TaskSpec) -> None:
        labels = {**task.labels, SHADOW_LABEL: self.source_addr}
        mirrored = dataclasses.replace(task, labels=labels)
        try:
            with trio.move_on_after(SEND_TIMEOUT_S) as waited:
                await client.submit(mirrored)
        except Exception as error:  # any failure of a shadow is the shadow's alone
            self._failed(task.task_id, str(error) or type(error).__name__)
            return
        if waited.cancelled_caught:
            self._failed(task.task_id, f"no answer within {SEND_TIMEOUT_S} s")
            return
        self.sent += 1

    def _failed(self, task_id: str, reason: str) -> None:
        self.failed += 1
        self._last_failure = f"task {task_id}: {reason}"

    def _report(self, now_s: float) -> None:
        # A warning when sends failed or submits were dropped since the last
        # one, at most once per interval: a target that is down fails them all.
        if (self.failed, self.dropped) == self._reported:
            return
        if self._reported_at is not None and now_s - self._reported_at < REPORT_INTERVAL_S:
            return
        failed = self.failed - self._reported[0]
        dropped = self.dropped - self._reported[1]
        logger.warning(
            "shadow submits to %s: %d failed and %d dropped (queue full) since the last report; "
            "last failure: %s",
            self.target_addr,
            failed,
            dropped,
            self._last_failure,
        )
        self._reported = (self.failed, self.dropped)
        self._reported_at = now_s
