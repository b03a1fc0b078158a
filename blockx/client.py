"""A coordinator-side client of the worker's gRPC API, for Trio code.

Owns one grpclib `Channel` to one worker, the Trio-facing wrappers of the five
`WorkerService` RPCs, `run_task` (submit, then follow to the terminal update),
and the helpers that build a `TaskSpec` from arguments or from a JSON task
file; and `PlacementClient`, which places tasks across the workers registered
in etcd. Must never import asyncio, retry a call on its own (placement's one
rule, trying the next worker after a refusal that proves the task did not
start there, is the exception), or let a grpclib or OS exception escape
untranslated: every failure is a `BlockxError`.

Theory of operation:

* grpclib is an asyncio library. The client runs it on trio-asyncio's loop, so
  the caller must be inside `async with trio_asyncio.open_loop():`. The
  channel is made inside that loop when `WorkerClient.connect` is entered and
  closed when it exits; every call goes through `aio_as_trio` bound to that
  loop, so a client cannot drift onto another loop.
* The channel connects lazily: an unreachable worker shows on the first call,
  as `WorkerUnreachable`. A gRPC status other than OK is `WorkerCallError`.
* `watch` is an async generator. Its stream is closed under a shielded cancel
  scope with a short deadline, so cancelling the consumer resets the stream
  instead of leaking it. A consumer that stops early should close it with
  `contextlib.aclosing`, so that the reset happens at once.
* Errors raised inside `open_loop()` reach the caller wrapped in exception
  groups (the loop runs a nursery); `except*` or unwrapping is the caller's.
"""

from __future__ import annotations

import contextlib
import json
import logging
import reprlib
from collections.abc import (
    AsyncGenerator,
    AsyncIterator,
    Awaitable,
    Callable,
    Iterator,
    Mapping,
    Sequence,
)
from typing import Any, ParamSpec, TypeVar

import attrs
import trio
import trio_asyncio
from grpclib.client import Channel, Stream
from grpclib.const import Cardinality, Status
from grpclib.exceptions import GRPCError, StreamTerminatedError

from blockx._channels import open_channels, split_host_port
from blockx._proto.blockx.worker import v1 as pb
from blockx.discovery import EtcdClient, EtcdError, Rejected, WorkerDirectory, WorkerHeartbeat
from blockx.errors import BlockxError

__all__ = [
    "DEFAULT_REGISTRY_PREFIX",
    "InvalidTaskSpec",
    "InvalidWorkerAddress",
    "NoAsyncioLoop",
    "NoWorkerAvailable",
    "Placement",
    "PlacementClient",
    "WatchEndedEarly",
    "WorkerCallError",
    "WorkerClient",
    "WorkerUnreachable",
    "parse_worker_address",
    "task_spec",
    "task_spec_from_json",
]

logger = logging.getLogger("blockx.client")

STREAM_CLOSE_GRACE_S = 5.0
"""How long closing a watch stream may take before it is abandoned."""

_WATCH_TASKS_ROUTE = "/blockx.worker.v1.WorkerService/WatchTasks"
_MAX_UINT32 = 2**32 - 1
_MAX_INT64 = 2**63 - 1

_P = ParamSpec("_P")
_R = TypeVar("_R")


# --- errors --------------------------------------------------------------------------------


class WorkerCallError(BlockxError):
    """The worker answered `rpc` with a gRPC status other than OK."""

    def __init__(self, *, rpc: str, status: Status, message: str) -> None:
        self.rpc = rpc
        self.status = status
        self.message = message
        detail = f": {message}" if message else ""
        super().__init__(f"{rpc} failed: {status.name}{detail}")


class WorkerUnreachable(BlockxError):
    """The worker at `address` could not be reached, or the connection was lost."""

    def __init__(self, *, address: str, reason: str) -> None:
        self.address = address
        self.reason = reason
        super().__init__(f"cannot reach worker at {address}: {reason}")


class InvalidWorkerAddress(BlockxError):
    """`address` is not HOST:PORT."""

    def __init__(self, *, address: str, allowed: str) -> None:
        self.address = address
        self.allowed = allowed
        super().__init__(f"worker address {address!r}: {allowed}")


class InvalidTaskSpec(BlockxError):
    """The task's `key` (a JSON task-file key, or a `task_spec` argument) is wrong."""

    def __init__(self, *, key: str, value: object, allowed: str) -> None:
        self.key = key
        self.value = value
        self.allowed = allowed
        super().__init__(f"task {key} = {reprlib.repr(value)}: {allowed}")


class WatchEndedEarly(BlockxError):
    """A watch stream ended before the terminal update of each of `task_ids`."""

    def __init__(self, *, task_ids: tuple[str, ...]) -> None:
        self.task_ids = task_ids
        super().__init__(
            f"the watch stream ended before the terminal update of task {', '.join(task_ids)}"
        )


class NoAsyncioLoop(BlockxError):
    """`WorkerClient.connect` was entered outside `trio_asyncio.open_loop()`."""

    def __init__(self) -> None:
        super().__init__(
            "WorkerClient.connect must run inside `async with trio_asyncio.open_loop():`"
        )


# --- the client ----------------------------------------------------------------------------


def parse_worker_address(address: str) -> tuple[str, int]:
    """(host, port) of "host:port" or "[v6 address]:port"."""
    try:
        return split_host_port(address)
    except ValueError as error:
        raise InvalidWorkerAddress(address=address, allowed=str(error)) from None


class WorkerClient:
    """One channel to one worker. Make it with `async with WorkerClient.connect(addr)`."""

    def __init__(self, *, address: str, channel: Channel, loop: object) -> None:
        self.address = address
        self._channel = channel
        self._stub = pb.WorkerServiceStub(channel)
        self._loop = loop

    @classmethod
    @contextlib.asynccontextmanager
    async def connect(cls, address: str) -> AsyncIterator[WorkerClient]:
        """A client of the worker at `address` ("host:port"); the channel closes on exit.

        Must be entered inside `async with trio_asyncio.open_loop():`. Connecting
        is lazy: an unreachable worker fails the first call, not this.
        """
        host, port = parse_worker_address(address)
        loop = trio_asyncio.current_loop.get()
        if loop is None:
            raise NoAsyncioLoop()
        async with open_channels(loop, [(host, port)]) as (channel,):
            yield cls(address=address, channel=channel, loop=loop)

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
            raise WorkerUnreachable(address=self.address, reason=reason) from error
        except OSError as error:
            reason = str(error) or type(error).__name__
            raise WorkerUnreachable(address=self.address, reason=reason) from error


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


# --- task specs ----------------------------------------------------------------------------

TASK_FILE_KEYS = (
    "task_id",
    "builder",
    "config",
    "payload",
    "payload_text",
    "writer",
    "writer_config",
    "timeout_ms",
    "failure_policy",
    "retry",
    "labels",
)
"""The keys of a JSON task file."""
_RETRY_KEYS = ("max_attempts", "base_backoff_ms", "jitter_percent")
_FAILURE_POLICIES = {"fail_fast": False, "best_effort": True}


def task_spec(
    task_id: str,
    *,
    builder: str,
    config: Mapping[str, Any] | None = None,
    payload: bytes = b"",
    writer: str | None = None,
    writer_config: Mapping[str, Any] | None = None,
    timeout_ms: int = 0,
    best_effort: bool = False,
    retry: pb.CallRetryPolicy | None = None,
    labels: Mapping[str, str] | None = None,
) -> pb.TaskSpec:
    """A `TaskSpec`; `config` and `writer_config` are sent as JSON objects.

    No writer means no plugin runs. `timeout_ms` 0 is the worker's default
    deadline; `retry` None the worker's retry defaults. Raises InvalidTaskSpec
    naming the argument that is wrong.
    """
    _check_text("task_id", task_id)
    _check_text("builder", builder)
    if not isinstance(payload, bytes):
        raise InvalidTaskSpec(key="payload", value=payload, allowed="must be bytes")
    if writer is not None:
        _check_text("writer", writer)
    elif writer_config is not None:
        raise InvalidTaskSpec(key="writer_config", value=writer_config, allowed="needs a writer")
    _check_int("timeout_ms", timeout_ms, _MAX_INT64)
    if not isinstance(best_effort, bool):
        raise InvalidTaskSpec(key="best_effort", value=best_effort, allowed="must be a boolean")
    if retry is not None:
        if not isinstance(retry, pb.CallRetryPolicy):
            raise InvalidTaskSpec(key="retry", value=retry, allowed="must be a CallRetryPolicy")
        for name in _RETRY_KEYS:
            _check_int(f"retry.{name}", getattr(retry, name), _MAX_UINT32)
    policy = pb.CallFailurePolicy.BEST_EFFORT if best_effort else pb.CallFailurePolicy.FAIL_FAST
    return pb.TaskSpec(
        task_id=task_id,
        function_call=pb.FunctionCallConfig(type=builder, config_json=_json_text("config", config)),
        payload=payload,
        result_handler=(
            None
            if writer is None
            else pb.ResultHandler(
                type=writer, config_json=_json_text("writer_config", writer_config)
            )
        ),
        task_timeout_ms=timeout_ms,
        call_failure_policy=policy,
        call_retry_policy=retry,
        labels=_labels("labels", labels),
    )


def task_spec_from_json(obj: Mapping[str, Any], *, task_id: str | None = None) -> pb.TaskSpec:
    """The `TaskSpec` of a JSON task file's object; `task_id` wins over the file's.

    Keys (`TASK_FILE_KEYS`): task_id (unless given here), builder (required),
    config, payload (any JSON value, sent as its JSON text) or payload_text
    (sent as UTF-8), writer, writer_config, timeout_ms, failure_policy
    ("fail_fast" or "best_effort"), retry ({max_attempts (required),
    base_backoff_ms, jitter_percent}: the whole policy, unset fields 0) and
    labels. null counts as absent. Raises InvalidTaskSpec naming the key.
    """
    if not isinstance(obj, Mapping):
        raise InvalidTaskSpec(key="file", value=obj, allowed="must be a JSON object")
    for key, value in obj.items():
        if key not in TASK_FILE_KEYS:
            allowed = f"is not a task key; the keys are {', '.join(TASK_FILE_KEYS)}"
            raise InvalidTaskSpec(key=str(key), value=value, allowed=allowed)
    fields = {key: value for key, value in obj.items() if value is not None}
    if task_id is None:
        task_id = _required_text(fields, "task_id")
    if "payload" in fields and "payload_text" in fields:
        raise InvalidTaskSpec(
            key="payload_text",
            value=fields["payload_text"],
            allowed="give payload or payload_text, not both",
        )
    if "payload_text" in fields:
        text = fields["payload_text"]
        if not isinstance(text, str):
            raise InvalidTaskSpec(key="payload_text", value=text, allowed="must be a string")
        payload = text.encode("utf-8")
    elif "payload" in fields:
        payload = _json_text("payload", fields["payload"], object_only=False).encode("utf-8")
    else:
        payload = b""
    policy = fields.get("failure_policy", "fail_fast")
    if not isinstance(policy, str) or policy not in _FAILURE_POLICIES:
        allowed = f"must be one of {', '.join(map(repr, _FAILURE_POLICIES))}"
        raise InvalidTaskSpec(key="failure_policy", value=policy, allowed=allowed)
    return task_spec(
        task_id,
        builder=_required_text(fields, "builder"),
        config=_optional_object(fields, "config"),
        payload=payload,
        writer=_optional_text(fields, "writer"),
        writer_config=_optional_object(fields, "writer_config"),
        timeout_ms=fields.get("timeout_ms", 0),
        best_effort=_FAILURE_POLICIES[policy],
        retry=_retry_policy(fields.get("retry")),
        labels=_labels("labels", fields.get("labels")),
    )


def _retry_policy(value: object) -> pb.CallRetryPolicy | None:
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise InvalidTaskSpec(key="retry", value=value, allowed="must be a JSON object")
    for key, item in value.items():
        if key not in _RETRY_KEYS:
            allowed = f"is not a retry key; the keys are {', '.join(_RETRY_KEYS)}"
            raise InvalidTaskSpec(key=f"retry.{key}", value=item, allowed=allowed)
    if value.get("max_attempts") is None:
        raise InvalidTaskSpec(key="retry.max_attempts", value=None, allowed="is required")
    numbers = {key: value.get(key, 0) for key in _RETRY_KEYS}
    for key, number in numbers.items():
        _check_int(f"retry.{key}", number, _MAX_UINT32)
    return pb.CallRetryPolicy(**numbers)


def _check_text(key: str, value: object) -> None:
    if not isinstance(value, str) or not value:
        raise InvalidTaskSpec(key=key, value=value, allowed="must be a non-empty string")


def _check_int(key: str, value: object, maximum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= maximum:
        allowed = f"must be an integer from 0 to {maximum}"
        raise InvalidTaskSpec(key=key, value=value, allowed=allowed)


def _required_text(fields: Mapping[str, object], key: str) -> str:
    if key not in fields:
        raise InvalidTaskSpec(key=key, value=None, allowed="is required")
    value = fields[key]
    _check_text(key, value)
    assert isinstance(value, str)
    return value


def _optional_text(fields: Mapping[str, object], key: str) -> str | None:
    if key not in fields:
        return None
    return _required_text(fields, key)


def _optional_object(fields: Mapping[str, object], key: str) -> Mapping[str, Any] | None:
    value = fields.get(key)
    if value is not None and not isinstance(value, Mapping):
        raise InvalidTaskSpec(key=key, value=value, allowed="must be a JSON object")
    return value


def _json_text(key: str, value: object, *, object_only: bool = True) -> str:
    """Compact JSON of `value` ("" for None when an object is expected)."""
    if value is None and object_only:
        return ""
    if object_only and not isinstance(value, Mapping):
        raise InvalidTaskSpec(key=key, value=value, allowed="must be a JSON object (a dict)")
    try:
        return json.dumps(value, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError) as error:
        raise InvalidTaskSpec(key=key, value=value, allowed=f"must be JSON ({error})") from error


def _labels(key: str, value: object) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise InvalidTaskSpec(key=key, value=value, allowed="must be an object of strings")
    for name, text in value.items():
        if not isinstance(name, str) or not isinstance(text, str):
            raise InvalidTaskSpec(key=f"{key}.{name}", value=text, allowed="must be a string")
    return dict(value)


# --- placement over the etcd registry ------------------------------------------------------

DEFAULT_REGISTRY_PREFIX = "/blockx/workers/"
"""Where workers of the block profile register (`workerRegistryPrefix`)."""
WATCH_RETRY_MIN_S = 0.5
WATCH_RETRY_MAX_S = 5.0
"""Back-off between attempts to resume the registry watch while etcd is unreachable."""
_TRY_NEXT_WORKER = frozenset({Status.RESOURCE_EXHAUSTED, Status.UNAVAILABLE})


class NoWorkerAvailable(BlockxError):
    """No worker registered under `prefix` could take task `task_id`.

    `attempts` holds (worker address, what went wrong) for each worker tried,
    in the order tried; `workers_seen` and `draining` count the view's workers.
    """

    def __init__(
        self,
        *,
        task_id: str,
        prefix: str,
        workers_seen: int,
        draining: int,
        attempts: tuple[tuple[str, str], ...],
    ) -> None:
        self.task_id = task_id
        self.prefix = prefix
        self.workers_seen = workers_seen
        self.draining = draining
        self.attempts = attempts
        if attempts:
            tried = "; ".join(f"{address}: {reason}" for address, reason in attempts)
            situation = f"every worker tried refused it ({tried})"
        elif workers_seen == 0:
            situation = "no worker is registered there"
        elif draining == workers_seen:
            situation = f"all {workers_seen} registered workers are draining"
        else:
            situation = f"none of the {workers_seen} registered workers has a free slot"
        super().__init__(f"cannot place task {task_id} under {prefix!r}: {situation}")


@attrs.frozen(kw_only=True)
class Placement:
    """Where a task went: the worker, the slot reserved there, and the submit's answer."""

    worker_addr: str
    slot_id: str
    response: pb.SubmitTaskResponse
    client: WorkerClient = attrs.field(eq=False, repr=False)
    """The client of that worker, to follow the task (valid while the placement client is)."""


class PlacementClient:
    """Places tasks on the workers registered under an etcd prefix.

    Make it with `async with PlacementClient.connect(endpoints, prefix)`: it
    reads the registry (Range), then follows it (Watch from the next
    revision) into a `WorkerDirectory`, resuming with a fresh Range after an
    etcd outage. `place` reserves a slot on the worker with the most free
    slots (never a draining one) and submits the task into it; a worker that
    answers RESOURCE_EXHAUSTED or UNAVAILABLE, or cannot be reached while
    reserving, is passed over for the next-best one. A submit whose connection
    breaks is not retried elsewhere: the task may have started there.
    `PlacementClient.over(directory)` is the same without etcd (a fixed view).
    """

    def __init__(
        self, *, directory: WorkerDirectory, workers: contextlib.AsyncExitStack, slot_ttl_ms: int
    ) -> None:
        self.directory = directory
        self._workers = workers
        self._slot_ttl_ms = slot_ttl_ms
        self._clients: dict[str, WorkerClient] = {}
        self._changed = trio.Event()

    @classmethod
    @contextlib.asynccontextmanager
    async def over(
        cls, directory: WorkerDirectory, *, slot_ttl_ms: int = 0
    ) -> AsyncIterator[PlacementClient]:
        """A placement client of the workers in `directory`, which the caller keeps current.

        Worker channels are opened on first use and closed on exit. `slot_ttl_ms`
        is the reservation lease (0 = each worker's default).
        """
        if trio_asyncio.current_loop.get() is None:
            raise NoAsyncioLoop()
        async with contextlib.AsyncExitStack() as workers:
            yield cls(directory=directory, workers=workers, slot_ttl_ms=slot_ttl_ms)

    @classmethod
    @contextlib.asynccontextmanager
    async def connect(
        cls,
        etcd_endpoints: str | Sequence[str],
        prefix: str = DEFAULT_REGISTRY_PREFIX,
        *,
        slot_ttl_ms: int = 0,
    ) -> AsyncIterator[PlacementClient]:
        """A placement client of the fleet under `prefix` in the etcd at `etcd_endpoints`.

        `etcd_endpoints` is "host:port[,host:port...]" or a sequence of them.
        Entering reads the registry once; an unreachable etcd raises
        EtcdUnavailable here. Must run inside `trio_asyncio.open_loop()`.
        """
        if isinstance(etcd_endpoints, str):
            etcd_endpoints = [part.strip() for part in etcd_endpoints.split(",") if part.strip()]
        directory = WorkerDirectory(prefix=prefix)
        async with (
            cls.over(directory, slot_ttl_ms=slot_ttl_ms) as placement,
            EtcdClient.connect(etcd_endpoints) as etcd,
            trio.open_nursery() as nursery,
        ):
            await nursery.start(placement._follow, etcd)
            try:
                yield placement
            finally:
                nursery.cancel_scope.cancel()

    def workers(self) -> tuple[WorkerHeartbeat, ...]:
        """The registered workers as last seen, by address."""
        return self.directory.workers()

    async def wait_for(
        self, predicate: Callable[[tuple[WorkerHeartbeat, ...]], bool]
    ) -> tuple[WorkerHeartbeat, ...]:
        """Until `predicate(workers())` holds; returns those workers."""
        while not predicate(workers := self.directory.workers()):
            await self._changed.wait()
        return workers

    async def place(self, task: pb.TaskSpec) -> Placement:
        """Reserve a slot for `task` on the best worker and submit it there.

        Raises NoWorkerAvailable (naming each worker tried and its answer) when
        no worker can take it; any other refusal is the worker's WorkerCallError.
        """
        attempts: list[tuple[str, str]] = []
        for worker in self.directory.placement_order():
            try:
                client = await self._client(worker.address)
                reservation = await client.request_slot(task.task_id, self._slot_ttl_ms)
            except (InvalidWorkerAddress, WorkerUnreachable) as error:
                attempts.append((worker.address, str(error)))
                continue
            except WorkerCallError as error:
                if error.status not in _TRY_NEXT_WORKER:
                    raise
                attempts.append((worker.address, _refusal(error)))
                continue
            self.directory.note_placed(worker.address)
            try:
                response = await client.submit(task, reservation.slot_id)
            except WorkerCallError as error:
                if error.status not in _TRY_NEXT_WORKER:
                    raise
                attempts.append((worker.address, _refusal(error)))
                continue
            return Placement(
                worker_addr=worker.address,
                slot_id=reservation.slot_id,
                response=response,
                client=client,
            )
        workers = self.directory.workers()
        raise NoWorkerAvailable(
            task_id=task.task_id,
            prefix=self.directory.prefix,
            workers_seen=len(workers),
            draining=sum(1 for worker in workers if worker.draining),
            attempts=tuple(attempts),
        )

    async def run_task(
        self, task: pb.TaskSpec, *, on_update: Callable[[pb.TaskUpdate], None] | None = None
    ) -> tuple[Placement, pb.TaskResult]:
        """Place `task`, follow it on its worker, and return where it ran and its result."""
        placement = await self.place(task)
        # The submit repeats (idempotent by task id: it answers the task's snapshot)
        # so that WorkerClient.run_task follows it exactly as for a direct submit.
        result = await placement.client.run_task(
            task, slot_id=placement.slot_id, on_update=on_update
        )
        return placement, result

    async def _client(self, address: str) -> WorkerClient:
        client = self._clients.get(address)
        if client is None:
            client = await self._workers.enter_async_context(WorkerClient.connect(address))
            self._clients[address] = client
        return client

    async def _follow(
        self, etcd: EtcdClient, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """Keep the directory current: Range, then Watch; resync after a broken watch."""
        prefix = self.directory.prefix
        retry_s = WATCH_RETRY_MIN_S
        synced = in_outage = False
        while True:
            try:
                snapshot = await etcd.get_prefix(prefix)
                self._changed_by(
                    self.directory.reset(revision=snapshot.revision, entries=snapshot.entries)
                )
                if not synced:
                    task_status.started()
                    synced = True
                elif in_outage:
                    logger.info("following the worker registry %s again", prefix)
                retry_s, in_outage = WATCH_RETRY_MIN_S, False
                batches = etcd.watch_prefix(prefix, start_revision=snapshot.revision + 1)
                async with contextlib.aclosing(batches):
                    async for events in batches:
                        self._changed_by(self.directory.apply(events))
            except EtcdError as error:
                if not synced:
                    raise
                if not in_outage:
                    logger.warning(
                        "lost the watch of the worker registry %s (%s); placing on the last "
                        "view seen until it resumes",
                        prefix,
                        error,
                    )
                    in_outage = True
                await trio.sleep(retry_s)
                retry_s = min(retry_s * 2, WATCH_RETRY_MAX_S)

    def _changed_by(self, rejected: Sequence[Rejected]) -> None:
        for problem in rejected:
            logger.warning("ignoring registry key %s: %s", problem.key, problem.error)
        self._changed.set()
        self._changed = trio.Event()


def _refusal(error: WorkerCallError) -> str:
    return f"{error.rpc} {error.status.name}" + (f": {error.message}" if error.message else "")
