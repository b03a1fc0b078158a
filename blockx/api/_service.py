"""The `WorkerService` handlers (asyncio side of the bridge).

A handler turns the request into a domain message, posts it to the
slot-table actor together with a `reply` that resolves an asyncio future, and
awaits the future. Actors never await handlers. If the request backlog is
full, or the front end is closing, the answer is UNAVAILABLE at once.

`WatchTasks` hands the watch fan-out a `WatchStream` whose wake-up sets an
asyncio event; the handler sends what the stream holds whenever it is set.
A stream that ends after the terminal update of every task it follows is a
clean detach; a handler cancelled by its client going away is a disconnect.
A watch of tasks that have all ended, and `GetTaskResult` of one, are answered
from the terminal snapshots the slot table publishes (`RetainedSnapshots`)
without a round trip to the actors: the answer the actor would give, a hop and
two thread wake-ups sooner (for a client that watches right after its submit,
the task has usually ended by then).

`RunTasks` does both on one stream: a reader posts each task of a request (one
or many, up to `MAX_RUN_TASKS_BATCH`) as a submit that carries the stream's
`TaskStream` (the slot table answers into it and holds a submit without a slot
until one is free), while the handler sends the answers and the terminal
updates the stream collects. The submits of a request cross to the Trio thread
in one hand-over, one slot-table message each. The reader stops taking tasks
while `RUN_TASKS_WINDOW` submits are unanswered or as many events wait to be
sent, so a client that writes faster than slots free up, or than it reads its
answers, is slowed by HTTP/2 flow control, not by refusals (nor held in memory).
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable, Sequence
from typing import Any, TypeVar, cast

from grpclib.const import Handler, Status
from grpclib.exceptions import GRPCError
from grpclib.server import Stream

from blockx._proto.blockx.worker import v1 as pb
from blockx.actors import (
    GetResult,
    GetStatus,
    Inbox,
    OpenWatch,
    Refused,
    Reply,
    RequestSlot,
    RetainedSnapshots,
    SlotTableMessage,
    StreamEvent,
    SubmitTask,
    Subscribe,
    TaskStream,
    Unsubscribe,
    WatchStream,
    WorkerStatus,
)
from blockx.api._bridge import Bridge, InlineBridge
from blockx.api._convert import (
    WIRE_REQUESTS,
    grpc_error,
    result_response,
    slot_response,
    spec_from_wire,
    stream_responses,
    submit_response,
    task_update,
)
from blockx.executors import ExecutorView
from blockx.identity import WorkerIdentity
from blockx.slots import (
    SHADOW_LABEL,
    InvalidArgument,
    TaskSnapshot,
    TaskSpec,
    TaskState,
    WorkerError,
)

T = TypeVar("T")

MAX_BACKLOG = 4_096
"""Client requests waiting in the slot table's inbox beyond this are refused (UNAVAILABLE)."""
MAX_WATCH_TASK_IDS = 10_000
RUN_TASKS_WINDOW = 64
"""Submits of one `RunTasks` stream that may wait for an answer (and events that may wait
to be sent) before it stops reading."""
MAX_RUN_TASKS_BATCH = 1_000
"""Tasks one `RunTasksRequest` may carry; each task of a larger one is refused."""


class WorkerService(pb.WorkerServiceBase):
    def __init__(
        self,
        *,
        slot_table: Inbox[SlotTableMessage],
        identity: WorkerIdentity,
        executors: Callable[[], Sequence[ExecutorView]],
        ready: Callable[[], bool],
        retained: RetainedSnapshots,
        shadow: Callable[[pb.TaskSpec], object] | None = None,
    ) -> None:
        self._slot_table = slot_table
        self._retained = retained
        self.shadow = shadow
        """Offered every accepted submit that is not itself a shadow (`ShadowForwarder.offer`)."""
        self.identity = identity
        self._executors = executors
        self._ready = ready
        self.closing = False
        """Set once the worker stops serving: every request gets UNAVAILABLE."""
        self.bridge: Bridge = InlineBridge()
        """How handlers reach the actors; the front end sets it when it starts."""

    def __mapping__(self) -> dict[str, Handler]:
        """The generated handlers' shapes with raw handlers: every request is decoded by the
        C runtime (`WIRE_REQUESTS`) and the replies about tasks are sent as bytes.

        The C runtime keeps protobuf's rules: a field of the wrong wire type is an unknown
        field and a string is UTF-8. betterproto2's decoder hands over whatever it read
        (an int for a `task_id` that arrived as a varint), which no handler expects.
        """
        mapping = super().__mapping__()
        raw = {
            "RequestTaskSlot": self._request_task_slot,
            "SubmitTask": self._submit_task,
            "RunTasks": self._run_tasks,
            "WatchTasks": self._watch_tasks,
            "GetTaskResult": self._get_task_result,
            "GetWorkerStatus": self._get_worker_status,
        }
        for name, handler in raw.items():
            path = f"/blockx.worker.v1.WorkerService/{name}"
            generated = mapping[path]
            mapping[path] = Handler(
                handler, generated.cardinality, WIRE_REQUESTS[name], generated.reply_type
            )
        return mapping

    def _check_open(self, *, stream_closed: bool = False) -> None:
        """UNAVAILABLE once the worker stops serving (or the stream at hand was closed by it)."""
        if self.closing or stream_closed:
            raise GRPCError(Status.UNAVAILABLE, "worker is shutting down")

    def _admit(self, message: SlotTableMessage) -> None:
        """Hand a client's request to the slot table, unless its backlog is full."""
        if self._slot_table.waiting >= MAX_BACKLOG:
            raise GRPCError(Status.UNAVAILABLE, "worker is overloaded: its request backlog is full")
        self.bridge.to_trio(self._slot_table.post, message)

    async def _ask(self, make: Callable[[Reply[T]], SlotTableMessage]) -> T:
        self._check_open()
        future: asyncio.Future[T | WorkerError] = asyncio.get_running_loop().create_future()
        to_loop = self.bridge.to_loop

        def reply(answer: T | WorkerError) -> None:
            to_loop(_resolve, future, answer)

        self._admit(make(reply))
        answer = await future
        if isinstance(answer, WorkerError):
            raise grpc_error(answer)
        return answer

    async def _on_trio(self, read: Callable[[], T]) -> T:
        """`read()` run on the actors' thread, for state only they may touch."""
        future: asyncio.Future[T] = asyncio.get_running_loop().create_future()
        bridge = self.bridge
        bridge.to_trio(lambda: bridge.to_loop(_resolve, future, read()))
        return await future

    async def _request_task_slot(self, rpc: Stream[Any, Any]) -> None:
        message = await _request(rpc)
        snapshot: TaskSnapshot = await self._ask(
            lambda reply: RequestSlot(task_id=message.task_id, ttl_ms=message.ttl_ms, reply=reply)
        )
        await rpc.send_message(slot_response(snapshot))

    async def _submit_task(self, rpc: Stream[Any, Any]) -> None:
        message = await _request(rpc)
        if not message.HasField("task"):
            raise GRPCError(Status.INVALID_ARGUMENT, "task is required")
        try:
            spec = _spec(message.task)
        except InvalidArgument as error:
            raise grpc_error(error) from error
        snapshot: TaskSnapshot = await self._ask(
            lambda reply: SubmitTask(spec=spec, slot_id=message.slot_id or None, reply=reply)
        )
        self._offer_shadow(message.task, snapshot)
        await rpc.send_message(submit_response(snapshot))

    def _offer_shadow(self, task: Any, snapshot: TaskSnapshot) -> None:
        """Mirror an accepted task that is not itself a mirror (see `ShadowForwarder`)."""
        shadow = self.shadow
        if (
            shadow is not None
            and snapshot.state is TaskState.RUNNING
            and SHADOW_LABEL not in task.labels
        ):
            self.bridge.to_trio(shadow, pb.TaskSpec.parse(task.SerializeToString()))

    async def _get_task_result(self, rpc: Stream[Any, Any]) -> None:
        message = await _request(rpc)
        self._check_open()
        snapshot = self._retained.get(message.task_id)
        if snapshot is None:
            asked: TaskSnapshot = await self._ask(
                lambda reply: GetResult(task_id=message.task_id, reply=reply)
            )
            snapshot = asked
        await rpc.send_message(result_response(snapshot))

    async def _get_worker_status(self, rpc: Stream[Any, Any]) -> None:
        await _request(rpc)
        await rpc.send_message(await self._worker_status())

    async def _worker_status(self) -> pb.GetWorkerStatusResponse:
        status: WorkerStatus = await self._ask(lambda reply: GetStatus(reply=reply))
        executors, ready = await self._on_trio(lambda: (tuple(self._executors()), self._ready()))
        beat = status.heartbeat
        identity = self.identity
        return pb.GetWorkerStatusResponse(
            worker_addr=identity.worker_addr,
            deployment=identity.deployment,
            version=identity.version,
            started_at_ms=identity.started_at_ms,
            ready=ready and not beat.draining,
            draining=beat.draining,
            slots_total=beat.slots_total,
            reserved_slots=beat.reserved_slots,
            running_tasks=beat.running_tasks,
            free_slots=beat.free_slots,
            waiting_submits=status.waiting_submits,
            retained_results=status.retained_results,
            retained_bytes=status.retained_bytes,
            slots=[
                pb.SlotStatus(
                    slot_id=slot.slot_id,
                    state=slot.state.value,
                    task_id=slot.task_id or "",
                    lease_expires_at_ms=slot.lease_expires_at_ms or 0,
                )
                for slot in status.slots
            ],
            executors=[
                pb.ExecutorStatus(
                    executor_id=view.executor_id,
                    state=view.state.value,
                    pid=view.pid or 0,
                    rss_bytes=view.rss_bytes,
                    calls_served=view.calls_served,
                    restarts=view.restarts,
                )
                for view in executors
            ],
        )

    async def _run_tasks(self, rpc: Stream[Any, Any]) -> None:
        self._check_open()
        wake = asyncio.Event()
        room = asyncio.Event()
        to_loop = self.bridge.to_loop
        stream = TaskStream(
            wake=functools.partial(to_loop, wake.set),
            room=functools.partial(to_loop, room.set),
            window=RUN_TASKS_WINDOW,
        )
        self.bridge.to_trio(self._slot_table.post, Subscribe(stream=stream, snapshots=()))
        tasks: dict[str, Any] = {}  # kept only to mirror accepted tasks
        reader = asyncio.ensure_future(self._read_tasks(rpc, stream, room, tasks))
        reader.add_done_callback(lambda _: wake.set())
        broken = True
        try:
            while True:
                await wake.wait()
                wake.clear()
                events = stream.take()
                if self.shadow is not None:
                    self._offer_shadows(events, tasks)
                for response in stream_responses(events):
                    await rpc.send_message(response)
                if reader.done() and reader.exception() is not None:
                    raise cast(BaseException, reader.exception())
                if stream.finished:
                    break
            broken = False
        finally:
            reader.cancel()
            stream.abandoned = True
            self.bridge.to_trio(self._slot_table.post, Unsubscribe(stream=stream, broken=broken))

    def _offer_shadows(self, events: list[StreamEvent], tasks: dict[str, Any]) -> None:
        """Mirror the tasks `events` accepted; `tasks` keeps only those not answered yet."""
        for event in events:
            if isinstance(event, Refused):
                tasks.pop(event.task_id, None)
                continue
            task = tasks.pop(event.snapshot.task_id, None)
            if task is not None:
                self._offer_shadow(task, event.snapshot)

    async def _read_tasks(
        self, rpc: Stream[Any, Any], stream: TaskStream, room: asyncio.Event, tasks: dict[str, Any]
    ) -> None:
        """Post every task of `rpc`'s requests as a submit on `stream`, at most a window
        ahead: the submits of a request go to the actors in one hand-over (one per stretch
        of it read while the stream has room)."""
        async for message in rpc:
            items = _run_items(message)
            too_many = _too_many(len(items))
            submits: list[SubmitTask] = []
            for task, slot_id, field in items:
                if stream.full:
                    self._post_all(submits)
                    submits = []
                    while stream.full:
                        room.clear()
                        await room.wait()
                self._check_open(stream_closed=stream.closed)
                place = stream.posted()
                try:
                    spec = _run_spec(task, field, too_many)
                except InvalidArgument as error:
                    stream.answer(place, task.task_id if task is not None else "", error)
                    continue
                if self.shadow is not None:
                    tasks[spec.task_id] = task
                reply = functools.partial(stream.answer, place, spec.task_id)
                submits.append(
                    SubmitTask(spec=spec, slot_id=slot_id or None, reply=reply, stream=stream)
                )
            self._post_all(submits)
        stream.end_input()

    def _post_all(self, submits: list[SubmitTask]) -> None:
        """`submits` to the slot table, in order, in one hand-over to the Trio thread."""
        if submits:
            self.bridge.to_trio(_post_each, self._slot_table, submits)

    async def _watch_tasks(self, rpc: Stream[Any, Any]) -> None:
        message = await _request(rpc)
        self._check_open()
        if not message.task_ids:
            raise GRPCError(Status.INVALID_ARGUMENT, "task_ids is empty: name at least one task")
        if len(message.task_ids) > MAX_WATCH_TASK_IDS:
            raise GRPCError(
                Status.INVALID_ARGUMENT,
                f"task_ids has {len(message.task_ids)} ids; at most {MAX_WATCH_TASK_IDS}",
            )
        ended = self._retained.all_of(message.task_ids)
        if ended is not None:  # what the fan-out would send: each terminal update, then the end
            for snapshot in ended:
                await rpc.send_message(task_update(snapshot))
            return
        wake = asyncio.Event()
        stream = WatchStream(
            message.task_ids, wake=functools.partial(self.bridge.to_loop, wake.set)
        )
        self._admit(OpenWatch(stream=stream))
        broken = True
        try:
            while True:
                await wake.wait()
                wake.clear()
                for snapshot in stream.take():
                    await rpc.send_message(task_update(snapshot))
                if stream.error is not None:
                    raise grpc_error(stream.error)
                if stream.finished:
                    break
            broken = False
        finally:
            stream.abandoned = True
            self.bridge.to_trio(self._slot_table.post, Unsubscribe(stream=stream, broken=broken))


def _spec(task: Any) -> TaskSpec:
    """The domain spec of `task`; `InvalidArgument` if it has none (see `spec_from_wire`)."""
    spec = spec_from_wire(task)
    if spec.is_shadow:  # mirrored here by another worker: it must never store outputs
        spec = spec.as_shadow()
    return spec


def _run_items(message: Any) -> list[tuple[Any, str, str]]:
    """The (task, slot id, field path) of each task of a `RunTasksRequest`: `task` first
    when set, then `items`. A task missing is None, refused in its place (a request without
    any task is one such refusal)."""
    items = [(message.task, message.slot_id, "task")] if message.HasField("task") else []
    items.extend(
        (item.task if item.HasField("task") else None, item.slot_id, f"items[{index}].task")
        for index, item in enumerate(message.items)
    )
    return items or [(None, "", "task")]


def _too_many(count: int) -> InvalidArgument | None:
    """The refusal of every task of a request that carries more than `MAX_RUN_TASKS_BATCH`."""
    if count <= MAX_RUN_TASKS_BATCH:
        return None
    return InvalidArgument(
        field="items", value=count, allowed=f"at most {MAX_RUN_TASKS_BATCH} tasks per request"
    )


def _run_spec(task: Any, field: str, too_many: InvalidArgument | None) -> TaskSpec:
    """The spec of a request's task at `field`; `InvalidArgument` if it has none."""
    if too_many is not None:
        raise too_many
    if task is None:
        raise InvalidArgument(field=field, value=None, allowed="a task is required")
    return _spec(task)


def _post_each(inbox: Inbox[SlotTableMessage], submits: list[SubmitTask]) -> None:
    for submit in submits:
        inbox.post(submit)


def _resolve(future: asyncio.Future[T], answer: T) -> None:
    if not future.done():  # its handler may have gone (cancelled by its client)
        future.set_result(answer)


async def _request(rpc: Stream[Any, Any]) -> Any:
    """The one request message of a call that takes one (a call that ends without it is
    refused before it gets here: see `_grpclib.RequestStream`)."""
    message = await rpc.recv_message()
    assert message is not None
    return message
