"""A worker node fed by a hub: the automatic worker runtime, with the node's tasks as its
one handler.

The node runs `blockx.autoworker.Worker` against the hub beside its gRPC API.
Its one capability names the task-file format and the node's profile
(`node_task_capability`), so a task for another profile is never offered
to it. A granted attempt becomes a task in the node's slot table:

* its id is the hub task's id and the attempt's epoch (`task#3`), so a retry,
  even on the same node, is a new task;
* it takes a free slot at once or is refused (never held: the capacity
  declared to the hub follows the free slots, so a refusal is a race with a
  gRPC client, reported retryable);
* while it runs, the runtime renews the attempt's lease; a lease the hub
  ends cancels the task (`LEASE_LOST`), and the handler returns once the slot
  table has ended it, so a slot is never held by a task nobody reports;
* its end is the attempt's outcome, as `blockx.hubnode._outcomes` maps it.

gRPC tasks and hub tasks share the slot table: the capacity the node declares
is the slots that are free plus those its hub tasks hold (`FreeSlots` and
`FedTasks.held` change in the same step of the slot table), none while the
node admits nothing (no executor up, or draining). A node full of gRPC tasks
is offered nothing.

Drain: `stop` drains the hub session (no new grants; what runs is renewed and
its result confirmed). The node's own drain ends what is still running after
its drain timeout (`WORKER_SHUTDOWN`, reported retryable, or UNKNOWN in the
plugin phase), so the session's shutdown timeout is the node's drain timeout
plus `CONFIRM_MS` for the last results to be confirmed.
"""

from __future__ import annotations

from typing import Any, Final

import trio

from blockx.actors import (
    CancelTask,
    FedTasks,
    FreeSlots,
    Inbox,
    RunFedTask,
    SlotTableMessage,
    Subscribe,
)
from blockx.api import spec_from_message
from blockx.autoworker import (
    MAX_CAPACITY,
    HubClient,
    OutcomeUnknown,
    RawJson,
    Worker,
    WorkerExecution,
    WorkerFailure,
    WorkerHandler,
    WorkerOptions,
    WorkerRunError,
)
from blockx.calls import FailureCode
from blockx.client import InvalidTaskSpec, task_spec_from_json
from blockx.hubnode._document import result_document
from blockx.hubnode._outcomes import attempt_outcome
from blockx.hubwire import Failed, Succeeded, node_task_capability
from blockx.process.clock import EpochClock
from blockx.slots import InvalidArgument, TaskSnapshot, WorkerError

CONFIRM_MS: Final = 10_000
"""How long, after the node's drain timeout, the hub session waits for the last results
to be confirmed."""
CANCEL_WAIT_S: Final = 5.0
"""How long a handler whose lease ended waits for the slot table to end its task."""
INVALID_TASK: Final = "INVALID_TASK"
NODE_REFUSED: Final = "NODE_REFUSED"
TASK_FORGOTTEN: Final = "TASK_FORGOTTEN"


class HubFeed:
    """Runs the tasks of `queue_id` at `client`'s hub in the node's `slot_table`, which
    publishes its `free_slots`."""

    def __init__(
        self,
        *,
        client: HubClient,
        queue_id: str,
        deployment: str,
        slot_table: Inbox[SlotTableMessage],
        free_slots: FreeSlots,
        slots: int,
        drain_timeout_ms: int,
        clock: EpochClock | None = None,
    ) -> None:
        """`clock`: the node's (made in the run if None)."""
        self._url = client.url
        self._queue_id = queue_id
        self._slot_table = slot_table
        self._free_slots = free_slots
        self._fed = FedTasks()
        self.capacity = min(slots, MAX_CAPACITY)
        handler = WorkerHandler(capability=node_task_capability(deployment), handle=self._run)
        options = WorkerOptions(
            queue_id=queue_id,
            handlers=(handler,),
            capacity=self.capacity,
            shutdown_timeout_ms=drain_timeout_ms + CONFIRM_MS,
        )
        self.worker = Worker(client, options, clock=clock)
        self._scope = trio.CancelScope()
        self.finished = trio.Event()
        self.failure: WorkerRunError | None = None
        """What ended the session early, if anything did: a hub that refuses the credential,
        a peer that is not a hub, a drain that overran."""

    async def run(self) -> None:
        """Until `stop`, then drain (see `failure`)."""
        self._slot_table.post(Subscribe(stream=self._fed, snapshots=()))
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._share_slots)
                try:
                    with self._scope:
                        await self.worker.run()
                except WorkerRunError as error:
                    self.failure = error
                finally:
                    nursery.cancel_scope.cancel()
        finally:
            self.finished.set()

    def status(self) -> dict[str, Any]:
        """The hub session as the node's status page shows it, in plain JSON values: where
        it takes tasks from, whether it is connected, and its counts since the start."""
        stats = self.worker.stats()
        return {
            "url": self._url,
            "queue": self._queue_id,
            "connected": stats.connected,
            "capacity": self.capacity,
            "running": stats.running,
            "started": stats.started,
            "reports_confirmed": stats.reports_confirmed,
            "reconnects": stats.reconnects,
            "last_error": stats.last_error,
        }

    def stop(self) -> None:
        """Start the drain of the hub session (`run` returns once it is over)."""
        self._scope.cancel()

    async def _share_slots(self) -> None:
        """The hub's share of the slots follows the free ones, at every change."""
        free = self._free_slots
        told = -1
        while True:
            available = min(self.capacity, free.count + self._fed.held)
            if available != told:
                self.worker.share_slots(available)
                told = available
            await free.changed()

    # ------------------------------------------------------------------ one attempt

    async def _run(self, execution: WorkerExecution) -> Any:
        """Run the attempt's task in the slot table; its result, or raise its failure."""
        task_id = f"{execution.task_id}#{execution.epoch}"
        spec = _spec_of(execution.payload, task_id)
        fed = self._fed
        fed.expect(task_id)
        try:
            with trio.CancelScope(shield=True):  # the slot table answers in its next step
                answer = await self._submit(spec, task_id)
            if isinstance(answer, WorkerError):
                raise _refused(answer)
            ended = answer if answer.is_terminal else await self._ended(task_id)
        finally:
            fed.give_up(task_id)
        if isinstance(ended, WorkerError):  # forgotten before its end: never for a fed task
            raise OutcomeUnknown(TASK_FORGOTTEN)
        return _reported(ended)

    async def _submit(self, spec: Any, task_id: str) -> TaskSnapshot | WorkerError:
        answered = trio.Event()
        answers: list[TaskSnapshot | WorkerError] = []

        def reply(answer: TaskSnapshot | WorkerError) -> None:
            self._fed.answer(task_id, answer)  # in the slot table's step: `held` stays exact
            answers.append(answer)
            answered.set()

        self._slot_table.post(RunFedTask(spec=spec, stream=self._fed, reply=reply))
        await answered.wait()
        return answers[0]

    async def _ended(self, task_id: str) -> TaskSnapshot | WorkerError:
        try:
            return await self._fed.ended(task_id)
        except trio.Cancelled:
            # The lease ended (or the drain overran): end the task, and hold its slot until
            # the slot table has.
            cancel = CancelTask(
                task_id=task_id,
                failure_code=FailureCode.LEASE_LOST,
                message="the hub ended the lease of the attempt the task ran for",
            )
            self._slot_table.post(cancel)
            with trio.CancelScope(shield=True), trio.move_on_after(CANCEL_WAIT_S):
                await self._fed.ended(task_id)
            raise


def _spec_of(payload: Any, task_id: str) -> Any:
    """The node's task of a hub payload (decoded: the runtime reports one that is not JSON),
    or a FAILED `INVALID_TASK` naming what is wrong."""
    try:
        return spec_from_message(task_spec_from_json(payload, task_id=task_id))
    except (InvalidTaskSpec, InvalidArgument) as error:
        details = {"field": error.field, "reason": error.describe()}
    raise WorkerFailure(INVALID_TASK, details)


def _refused(error: WorkerError) -> WorkerFailure:
    """A submit the slot table refused: nothing ran."""
    if isinstance(error, InvalidArgument):
        return WorkerFailure(INVALID_TASK, {"field": error.field, "reason": error.describe()})
    return WorkerFailure(NODE_REFUSED, {"reason": str(error)}, retryable=True)


def _reported(snapshot: TaskSnapshot) -> Any:
    """What the handler ends with for a task that ended with `snapshot`: the result, or the
    failure raised."""
    result = snapshot.result
    assert result is not None  # a terminal snapshot holds its result
    document = result_document(result)
    outcome = attempt_outcome(result, document)
    match outcome:
        case Succeeded():
            return RawJson(document)
        case Failed(code=code, retryable=retryable):
            raise WorkerFailure(code, RawJson(document), retryable=retryable)
        case _:
            raise OutcomeUnknown(outcome.code)
