"""`WorkerClient`: one channel to one worker, for Trio code.

Owns one grpclib `Channel` to one worker, the Trio-facing wrappers of the five
`WorkerService` RPCs and `run_task` (submit, then follow to the terminal
update). Must never import asyncio, retry a call on its own, or let a grpclib
or OS exception escape untranslated: every failure is a `BlockxError`.

Theory of operation:

* grpclib is an asyncio library. The client runs it on trio-asyncio's loop, so
  the caller must be inside `async with trio_asyncio.open_loop():`. The
  channel is made inside that loop when `WorkerClient.connect` is entered and
  closed when it exits; every call goes through `aio_as_trio` bound to that
  loop, so a client cannot drift onto another loop.
* The channel connects lazily: an unreachable worker shows on the first call,
  as `WorkerUnreachable`. A gRPC status other than OK is `WorkerCallError`.
* With `tls` (`blockx.net.tls.ClientTls`) the channel speaks TLS; its files are read
  when `connect` is entered. A failed handshake is `WorkerUnreachable` on the
  first call: the client's own check of the worker's certificate says why;
  a worker that refuses the client (plain text to a TLS port, no accepted
  client certificate) just closes the connection, and the error says what
  that most likely means.
* `watch` is an async generator. Its stream is closed under a shielded cancel
  scope with a short deadline, so cancelling the consumer resets the stream
  instead of leaking it. A consumer that stops early should close it with
  `contextlib.aclosing`, so that the reset happens at once.
* Errors raised inside `open_loop()` reach the caller wrapped in exception
  groups (the loop runs a nursery); `except*` or unwrapping is the caller's.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
from collections.abc import (
    AsyncGenerator,
    AsyncIterable,
    AsyncIterator,
    Awaitable,
    Callable,
    Iterable,
    Iterator,
    Sequence,
)
from typing import Any, ParamSpec, TypeAlias, TypeVar

import trio
import trio_asyncio
from grpclib.client import Channel, Stream
from grpclib.const import Cardinality
from grpclib.events import SendRequest, listen
from grpclib.exceptions import GRPCError, StreamTerminatedError
from h2.exceptions import ProtocolError as H2ProtocolError

from blockx._proto.blockx.worker import v1 as pb
from blockx.client._errors import (
    InvalidWorkerAddress,
    WatchEndedEarly,
    WorkerCallError,
    WorkerUnreachable,
)
from blockx.client._outcomes import RUN_TASKS_RPC, RunTasksLedger, TaskOutcome
from blockx.errors import Misuse
from blockx.net.auth import send_bearer
from blockx.net.channels import asyncio_loop, closed_unheard, open_channels, split_host_port
from blockx.net.tls import CA_FILE_ENV, CLIENT_CERT_FILE_ENV, ClientTls
from blockx.process.lifecycle import lone_errors

STREAM_CLOSE_GRACE_S = 5.0
"""How long closing a watch stream may take before it is abandoned."""

CLOSED_UNHEARD = {
    False: "a worker serving TLS does that to a plain-text client (give the client TLS "
    f"settings: {CA_FILE_ENV})",
    True: "a worker asking for client certificates does that to a client without one it "
    f"accepts ({CLIENT_CERT_FILE_ENV})",
}
"""What a connection closed before the worker said anything most likely means, for a
client without and with TLS (see `blockx.net.channels.closed_unheard`)."""
PLAIN_TEXT_ANSWER = "a worker serving plain text answers a TLS client so"

_WATCH_TASKS_ROUTE = "/blockx.worker.v1.WorkerService/WatchTasks"
_RUN_TASKS_ROUTE = "/blockx.worker.v1.WorkerService/RunTasks"

TaskToRun: TypeAlias = "pb.TaskSpec | tuple[pb.TaskSpec, str]"
"""A task for `run_tasks`: the spec, or (spec, the slot id reserved for it)."""
_RunStream: TypeAlias = "Stream[pb.RunTasksRequest, pb.RunTasksResponse]"

RUN_TASKS_BATCH = 64
"""Tasks one `RunTasks` request carries at most: the worker's window of unanswered tasks
(`RUN_TASKS_WINDOW`), which a larger batch would only wait in."""

_P = ParamSpec("_P")
_R = TypeVar("_R")


# --- the client ----------------------------------------------------------------------------


def parse_worker_address(address: str) -> tuple[str, int]:
    """(host, port) of "host:port" or "[v6 address]:port"."""
    try:
        return split_host_port(address)
    except ValueError as error:
        raise InvalidWorkerAddress(address=address, allowed=str(error)) from None


class WorkerClient:
    """One channel to one worker. Make it with `async with WorkerClient.connect(addr)`."""

    def __init__(
        self, *, address: str, channel: Channel, loop: object, over_tls: bool = False
    ) -> None:
        self.address = address
        self.over_tls = over_tls
        self._channel = channel
        self._stub = pb.WorkerServiceStub(channel)
        self._loop = loop
        self.run_tasks_requests = 0
        """`RunTasks` requests sent (each carries a batch of up to `RUN_TASKS_BATCH` tasks)."""

    @classmethod
    @contextlib.asynccontextmanager
    async def connect(
        cls, address: str, *, token: str | None = None, tls: ClientTls | None = None
    ) -> AsyncIterator[WorkerClient]:
        """A client of the worker at `address` ("host:port"); the channel closes on exit.

        `token`: the worker's bearer token, sent with every call (`blockx.net.auth`).
        `tls`: speak TLS, trusting and presenting what it names (`blockx.net.tls`); its
        files are read now (ConfigError naming the one at fault).
        Must be entered inside `async with trio_asyncio.open_loop():`. Connecting
        is lazy: an unreachable worker fails the first call, not this.
        """
        host, port = parse_worker_address(address)
        loop = asyncio_loop("WorkerClient.connect")
        context, server_name = (None, "") if tls is None else (tls.context(), tls.server_name)
        opening = open_channels(loop, [(host, port)], tls=context, server_name=server_name)
        async with opening as (channel,):
            if token is not None:
                listen(channel, SendRequest, send_bearer(token))
            yield cls(address=address, channel=channel, loop=loop, over_tls=tls is not None)

    # --- unary calls -----------------------------------------------------------------------

    async def request_slot(self, task_id: str, ttl_ms: int = 0) -> pb.RequestTaskSlotResponse:
        """Reserve a slot for `task_id` (lease `ttl_ms`; 0 = the worker's default)."""
        request = pb.RequestTaskSlotRequest(task_id=task_id, ttl_ms=ttl_ms)
        with self._translate("RequestTaskSlot"):
            return await self._aio(self._stub.request_task_slot, request)

    async def submit(self, task: pb.TaskSpec, slot_id: str = "") -> pb.SubmitTaskResponse:
        """Submit `task` into `slot_id`, or into a slot reserved inline when it is ""."""
        request = pb.SubmitTaskRequest(task=task, slot_id=slot_id)
        with self._translate("SubmitTask"):
            return await self._aio(self._stub.submit_task, request)

    async def result(self, task_id: str) -> pb.GetTaskResultResponse:
        """The state of `task_id` and, once it is terminal, its result."""
        request = pb.GetTaskResultRequest(task_id=task_id)
        with self._translate("GetTaskResult"):
            return await self._aio(self._stub.get_task_result, request)

    async def status(self) -> pb.GetWorkerStatusResponse:
        """The worker's slots and executors right now."""
        with self._translate("GetWorkerStatus"):
            return await self._aio(self._stub.get_worker_status, pb.GetWorkerStatusRequest())

    # --- streams ---------------------------------------------------------------------------

    async def watch(self, task_ids: Sequence[str]) -> AsyncGenerator[pb.TaskUpdate, None]:
        """Each update of `task_ids` until the worker ends the stream.

        The worker ends it after the terminal update of every task. Close the
        generator with `contextlib.aclosing` when stopping before that.
        """
        request = pb.WatchTasksRequest(task_ids=list(task_ids))
        with self._translate("WatchTasks"):
            stream = await self._aio(self._open_watch_stream)
            async with _shielded_exit(trio_asyncio.aio_as_trio(stream, loop=self._loop)):
                await self._aio(stream.send_message, request, end=True)
                while (update := await self._aio(stream.recv_message)) is not None:
                    yield update

    @contextlib.asynccontextmanager
    async def run_tasks(
        self, tasks: Iterable[TaskToRun] | AsyncIterable[TaskToRun]
    ) -> AsyncIterator[trio.MemoryReceiveChannel[TaskOutcome]]:
        """Run `tasks` on one `RunTasks` stream: `async with client.run_tasks(tasks) as outcomes`.

        `outcomes` yields a `TaskOutcome` per task as it ends: refused (in
        request order) or finished. A task item is a `TaskSpec`, or (spec, slot
        id) for a slot reserved before; without one the worker holds the task
        until a slot is free. The stream opens on entry; tasks are sent while
        outcomes are read, as fast as the worker reads them (it stops reading
        while 64 are unanswered), each request carrying what is ready: up to
        `RUN_TASKS_BATCH` tasks of an iterable, or what an async iterable gave
        while the previous request was sent (it is read at most a batch ahead of
        the stream). The stream ends once `tasks` is exhausted and
        every accepted task has finished. A stream that breaks raises
        (WorkerCallError, WorkerUnreachable, or WatchEndedEarly naming the tasks
        left without an end), as does an error of `tasks`; leaving the block
        early resets the stream. Either way the worker counts a broken watch
        for the tasks still running (WATCH_DISCONNECTED after its grace).
        Nothing is retried.
        """
        async with outcomes_of(functools.partial(self._run_stream, tasks)) as outcomes:
            yield outcomes

    async def _run_stream(
        self,
        tasks: Iterable[TaskToRun] | AsyncIterable[TaskToRun],
        ended: trio.MemorySendChannel[TaskOutcome],
    ) -> None:
        """Open the stream, send `tasks` from a child task and pass on each outcome read."""
        ledger = RunTasksLedger(worker_addr=self.address)
        # The sender's nursery encloses the stream: what the reading raises reaches
        # the stream's exit unwrapped, which turns a reset that came after the
        # worker's trailers into the status those trailers carry.
        with ended:
            async with trio.open_nursery() as nursery:
                with self._translate(RUN_TASKS_RPC):
                    stream = await self._aio(self._open_run_stream)
                    async with _shielded_exit(trio_asyncio.aio_as_trio(stream, loop=self._loop)):
                        await self._aio(stream.send_request)
                        nursery.start_soon(self._send_tasks, stream, tasks, ledger)
                        while (response := await self._aio(stream.recv_message)) is not None:
                            for outcome in ledger.received(response):
                                await ended.send(outcome)
                        ledger.check_ended()

    async def _send_tasks(
        self,
        stream: _RunStream,
        tasks: Iterable[TaskToRun] | AsyncIterable[TaskToRun],
        ledger: RunTasksLedger,
    ) -> None:
        """Send the tasks in batches of what is ready, then half-close.

        A broken stream stops the sending quietly: the receiving side meets the
        same break and raises it, translated, once.
        """
        if isinstance(tasks, AsyncIterable):
            sent = await self._send_ready(stream, tasks, ledger)
        else:
            iterator = iter(tasks)
            sent = True
            while sent and (batch := list(itertools.islice(iterator, RUN_TASKS_BATCH))):
                sent = await self._send_batch(stream, batch, ledger)
        if sent:
            with contextlib.suppress(*_STREAM_ERRORS):
                await self._aio(stream.end)

    async def _send_ready(
        self, stream: _RunStream, tasks: AsyncIterable[TaskToRun], ledger: RunTasksLedger
    ) -> bool:
        """Send what `tasks` has given since the previous request, up to a batch, while a
        child task reads it on (at most a batch ahead). False: the stream broke."""
        given, ready = trio.open_memory_channel[TaskToRun](RUN_TASKS_BATCH - 1)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_read_source, tasks, given)
            async for item in ready:
                batch = [item]
                with contextlib.suppress(trio.WouldBlock, trio.EndOfChannel):
                    while len(batch) < RUN_TASKS_BATCH:
                        batch.append(ready.receive_nowait())
                if not await self._send_batch(stream, batch, ledger):
                    nursery.cancel_scope.cancel()
                    return False
        return True

    async def _send_batch(
        self, stream: _RunStream, batch: list[TaskToRun], ledger: RunTasksLedger
    ) -> bool:
        """One request carrying `batch`; False: the stream broke."""
        items = [_run_item(item) for item in batch]
        for item in items:
            ledger.sent(item.task.task_id if item.task is not None else "")
        request = _run_request(items)
        try:
            await self._aio(stream.send_message, request)
        except _STREAM_ERRORS:
            return False
        self.run_tasks_requests += 1
        return True

    async def run_task(
        self,
        task: pb.TaskSpec,
        *,
        slot_id: str = "",
        on_update: Callable[[pb.TaskUpdate], None] | None = None,
    ) -> pb.TaskResult:
        """Submit `task`, follow it, and return its terminal result.

        `on_update` is called with every update of the task, the terminal one
        included. A task id that already finished returns its retained result
        without watching.
        """
        submitted = await self.submit(task, slot_id)
        if submitted.result is not None:
            return submitted.result
        async with contextlib.aclosing(self.watch([task.task_id])) as updates:
            async for update in updates:
                if on_update is not None:
                    on_update(update)
                if update.is_terminal and update.task_id == task.task_id:
                    if update.result is not None:
                        return update.result
                    break
        # The stream ended without carrying the result (the worker closed it, or
        # sent a terminal update without one): the result RPC has the last word.
        response = await self.result(task.task_id)
        if response.result is not None:
            return response.result
        raise WatchEndedEarly(task_ids=(task.task_id,))

    # --- the bridge ------------------------------------------------------------------------

    async def _open_watch_stream(self) -> Stream[pb.WatchTasksRequest, pb.TaskUpdate]:
        return self._channel.request(
            _WATCH_TASKS_ROUTE, Cardinality.UNARY_STREAM, pb.WatchTasksRequest, pb.TaskUpdate
        )

    async def _open_run_stream(self) -> _RunStream:
        return self._channel.request(
            _RUN_TASKS_ROUTE, Cardinality.STREAM_STREAM, pb.RunTasksRequest, pb.RunTasksResponse
        )

    async def _aio(
        self, function: Callable[_P, Awaitable[_R]], *args: _P.args, **kwargs: _P.kwargs
    ) -> _R:
        result: _R = await trio_asyncio.aio_as_trio(function, loop=self._loop)(*args, **kwargs)
        return result

    @contextlib.contextmanager
    def _translate(self, rpc: str) -> Iterator[None]:
        try:
            yield
        except GRPCError as error:
            raise WorkerCallError(
                rpc=rpc, status=error.status, message=error.message or ""
            ) from error
        except StreamTerminatedError as error:
            reason = f"the connection was lost during {rpc} ({error})"
            if closed_unheard(self._channel):
                reason = (
                    f"the worker closed the connection before answering {rpc}: "
                    + CLOSED_UNHEARD[self.over_tls]
                )
            raise WorkerUnreachable(address=self.address, reason=reason) from error
        except OSError as error:
            reason = str(error) or type(error).__name__
            if getattr(error, "reason", None) == "WRONG_VERSION_NUMBER":  # ssl.SSLError's
                reason += f" ({PLAIN_TEXT_ANSWER})"
            raise WorkerUnreachable(address=self.address, reason=reason) from error


_STREAM_ERRORS = (GRPCError, StreamTerminatedError, OSError, H2ProtocolError)
"""What a call on a grpclib stream raises when the stream or its connection breaks (h2's
error: writing to a stream the worker has already ended)."""


def _run_request(items: list[pb.RunTasksItem]) -> pb.RunTasksRequest:
    """The request carrying `items`: a lone task in the single-task fields (as every
    worker reads them), more as items."""
    if len(items) == 1:
        return pb.RunTasksRequest(task=items[0].task, slot_id=items[0].slot_id)
    return pb.RunTasksRequest(items=items)


def _run_item(item: TaskToRun) -> pb.RunTasksItem:
    if isinstance(item, pb.TaskSpec):
        return pb.RunTasksItem(task=item)
    match item:
        case (pb.TaskSpec() as task, str() as slot_id):
            return pb.RunTasksItem(task=task, slot_id=slot_id)
    raise Misuse(what=f"run_tasks takes a TaskSpec or (TaskSpec, slot id), not {item!r}")


async def _read_source(
    tasks: AsyncIterable[TaskToRun], given: trio.MemorySendChannel[TaskToRun]
) -> None:
    async with given:
        async for item in tasks:
            await given.send(item)


@contextlib.asynccontextmanager
async def outcomes_of(
    produce: Callable[[trio.MemorySendChannel[TaskOutcome]], Awaitable[None]],
) -> AsyncIterator[trio.MemoryReceiveChannel[TaskOutcome]]:
    """The outcomes `produce` sends, read while it runs in a task of its own; leaving the
    block early cancels it. Its error is raised as itself, not in an exception group."""
    ended, outcomes = trio.open_memory_channel[TaskOutcome](0)
    with lone_errors():
        async with trio.open_nursery() as nursery:
            nursery.start_soon(produce, ended)
            with outcomes:
                try:
                    yield outcomes
                finally:
                    # Before the channel closes: a producer waiting to hand over an
                    # outcome is then cancelled, rather than told the reader is gone
                    # (BrokenResourceError), which would escape as its own error.
                    nursery.cancel_scope.cancel()


@contextlib.asynccontextmanager
async def _shielded_exit(context: Any) -> AsyncIterator[Any]:
    """`async with context`, whose exit runs shielded: a cancelled scope cannot skip it.

    `context` is an `aio_as_trio` wrapper, whose exit is an asyncio task; were
    it cancelled, the grpclib stream would never be reset and would leak.
    """
    value = await context.__aenter__()
    try:
        yield value
    except BaseException as error:
        suppress = False
        with trio.move_on_after(STREAM_CLOSE_GRACE_S, shield=True):
            suppress = await context.__aexit__(type(error), error, error.__traceback__)
        if not suppress:
            raise
    else:
        with trio.move_on_after(STREAM_CLOSE_GRACE_S, shield=True):
            await context.__aexit__(None, None, None)
