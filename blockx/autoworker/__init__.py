"""The automatic worker runtime: run task handlers against the hub.

    worker = Worker(HubClient(url, credential), WorkerOptions(
        queue_id="images",
        handlers=[WorkerHandler(capability=Capability(...), handle=resize)],
    ))
    await worker.run()   # until the surrounding scope is cancelled; then it drains

`WorkerCore` holds the rules (pure, tested by events); `Worker` runs it on Trio.
`blockx.autoworker.command` is the `blockx autoworker` command, imported only by
the command line (it is not loaded by `import blockx.autoworker`).
"""

from blockx.autoworker._client import (
    HubCertificateRejected,
    HubClient,
    HubRequestFailed,
    hub_client_of,
    node_task_submission,
    task_submission,
)
from blockx.autoworker._core import WorkerCore
from blockx.autoworker._handlers import (
    MAX_CAPACITY,
    AttemptCancelled,
    InvalidOption,
    OutcomeUnknown,
    WorkerExecution,
    WorkerFailure,
    WorkerHandler,
    WorkerOptions,
    handles,
)
from blockx.autoworker._runtime import (
    Worker,
    WorkerAlreadyRun,
    WorkerEvent,
    WorkerRunError,
    WorkerShutdownTimeout,
    WorkerStats,
)
from blockx.hubwire import Capability, RawJson

__all__ = [
    "MAX_CAPACITY",
    "AttemptCancelled",
    "Capability",
    "HubCertificateRejected",
    "HubClient",
    "HubRequestFailed",
    "InvalidOption",
    "OutcomeUnknown",
    "RawJson",
    "Worker",
    "WorkerAlreadyRun",
    "WorkerCore",
    "WorkerEvent",
    "WorkerExecution",
    "WorkerFailure",
    "WorkerHandler",
    "WorkerOptions",
    "WorkerRunError",
    "WorkerShutdownTimeout",
    "WorkerStats",
    "handles",
    "hub_client_of",
    "node_task_submission",
    "task_submission",
]
