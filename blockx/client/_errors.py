"""The errors of the worker client: what the worker answered, or why it could not be asked.

Shared by `WorkerClient`, the `RunTasks` outcomes and placement; never raised
for anything but a call to a worker or its address.
"""

from __future__ import annotations

from grpclib.const import Status

from blockx.errors import BlockxError, InvalidValue


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


class InvalidWorkerAddress(InvalidValue):
    """`value` is not HOST:PORT."""

    def __init__(self, *, address: str, allowed: str) -> None:
        super().__init__(field="worker address", value=address, allowed=allowed)

    def describe(self) -> str:
        return f"worker address {self.value!r}: {self.allowed}"


class WatchEndedEarly(BlockxError):
    """A watch stream ended before the terminal update of each of `task_ids`."""

    def __init__(self, *, task_ids: tuple[str, ...]) -> None:
        self.task_ids = task_ids
        super().__init__(
            f"the watch stream ended before the terminal update of task {', '.join(task_ids)}"
        )
