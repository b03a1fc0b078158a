"""What a `RunTasks` stream says about each task, and the book one stream keeps.

`TaskOutcome` is the one value a client yields per task that ended: refused,
finished with a result, or (for placement) lost with its worker's stream.
`RunTasksLedger` turns the stream's responses into outcomes: answers come in
request order, so the oldest unanswered request names the task a refusal is
about; a `finished` ends the task its answer accepted. Pure: never does IO.
"""

from __future__ import annotations

import collections

import attrs
from grpclib.const import Status

from blockx._proto.blockx.worker import v1 as pb
from blockx.client._errors import WatchEndedEarly, WorkerCallError
from blockx.errors import BlockxError

RUN_TASKS_RPC = "RunTasks"


@attrs.frozen(kw_only=True)
class TaskOutcome:
    """How one task of a batch ended, on the worker at `worker_addr`.

    Exactly one of `result` (it ran: SUCCEEDED or FAILED) and `error` (it did
    not, or its end is unknown) is set. A refusal is a `WorkerCallError` whose
    rpc is "RunTasks" and whose status is what SubmitTask would have ended
    with; `accepted` is the worker's answer when it took the task.
    """

    task_id: str
    worker_addr: str
    accepted: pb.SubmitTaskResponse | None = None
    result: pb.TaskResult | None = None
    error: BlockxError | None = attrs.field(default=None, eq=False)

    def __attrs_post_init__(self) -> None:
        assert (self.result is None) != (self.error is None), "a result or an error, not both"

    @property
    def succeeded(self) -> bool:
        return self.result is not None and self.result.state == pb.TaskState.SUCCEEDED

    @property
    def refusal(self) -> WorkerCallError | None:
        """The worker's refusal, when that is why the task did not run."""
        error = self.error
        if isinstance(error, WorkerCallError) and error.rpc == RUN_TASKS_RPC:
            return error
        return None


def refusal_error(refused: pb.TaskRefusal) -> WorkerCallError:
    """The refusal as the error SubmitTask would have raised."""
    try:
        status = Status(refused.status)
    except ValueError:
        status = Status.UNKNOWN
    return WorkerCallError(rpc=RUN_TASKS_RPC, status=status, message=refused.message)


@attrs.define
class RunTasksLedger:
    """The requests of one stream still waiting for an answer or an end."""

    worker_addr: str
    unanswered: collections.deque[str] = attrs.field(factory=collections.deque)
    """Task ids sent and not yet answered, oldest first."""
    running: dict[str, pb.SubmitTaskResponse] = attrs.field(factory=dict)
    """Accepted and not yet finished, by task id: the latest answer."""

    def sent(self, task_id: str) -> None:
        self.unanswered.append(task_id)

    def received(self, response: pb.RunTasksResponse) -> list[TaskOutcome]:
        """The outcomes the events of `response` end, in order."""
        return [outcome for event in response.events if (outcome := self._event(event)) is not None]

    def _event(self, event: pb.RunTasksEvent) -> TaskOutcome | None:
        if event.accepted is not None:
            self._answered()
            self.running[event.accepted.task_id] = event.accepted
            return None
        if event.refused is not None:
            asked = self._answered()
            return TaskOutcome(
                task_id=event.refused.task_id or asked,
                worker_addr=self.worker_addr,
                error=refusal_error(event.refused),
            )
        update = event.finished
        if update is None:  # an event this client does not know: nothing it can end
            return None
        result = update.result or pb.TaskResult(
            task_id=update.task_id, state=update.state, phase=update.phase
        )
        return TaskOutcome(
            task_id=update.task_id,
            worker_addr=self.worker_addr,
            accepted=self.running.pop(update.task_id, None),
            result=result,
        )

    def check_ended(self) -> None:
        """The stream ended: raise WatchEndedEarly if a task was left without its end."""
        left = [*self.unanswered, *self.running]
        if left:
            raise WatchEndedEarly(task_ids=tuple(dict.fromkeys(left)))

    def _answered(self) -> str:
        return self.unanswered.popleft() if self.unanswered else ""
