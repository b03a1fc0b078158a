"""The coordinator side: clients of the worker's gRPC API, for Trio code.

`WorkerClient` talks to one worker (`run_tasks` runs a batch on one stream,
up to `RUN_TASKS_BATCH` tasks a request, and yields a `TaskOutcome` per
task); `PlacementClient` places tasks across the workers registered in etcd,
one at a time or a batch spread over them;
`task_spec`, `task_spec_from_json` and `task_specs_from_lines` build and
check the tasks a client sends (`task_lines` keeps each line's JSON object
too, for the hub to carry to a worker node); `task_outputs` reads the call
values a result kept; `ShadowForwarder` is the small coordinator inside a
worker that mirrors a sample of its submits to another worker.
Every failure is a `BlockxError`.
"""

from blockx.client._errors import (
    InvalidWorkerAddress,
    WatchEndedEarly,
    WorkerCallError,
    WorkerUnreachable,
)
from blockx.client._outcomes import TaskOutcome
from blockx.client._outputs import InvalidOutputs, outputs_shown, readable, task_outputs
from blockx.client._placement import (
    DEFAULT_REGISTRY_PREFIX,
    NoWorkerAvailable,
    Placement,
    PlacementClient,
)
from blockx.client._settings import ClientSettings
from blockx.client._shadow import SEND_TIMEOUT_S, ShadowForwarder, shadow_target
from blockx.client._specs import (
    OLD_KEYS,
    TASK_FILE_KEYS,
    InvalidTaskLines,
    InvalidTaskSpec,
    TaskLine,
    task_lines,
    task_spec,
    task_spec_from_json,
    task_specs_from_lines,
)
from blockx.client._worker import RUN_TASKS_BATCH, TaskToRun, WorkerClient, parse_worker_address
from blockx.net.channels import NoAsyncioLoop

__all__ = [
    "DEFAULT_REGISTRY_PREFIX",
    "OLD_KEYS",
    "RUN_TASKS_BATCH",
    "SEND_TIMEOUT_S",
    "TASK_FILE_KEYS",
    "ClientSettings",
    "InvalidOutputs",
    "InvalidTaskLines",
    "InvalidTaskSpec",
    "InvalidWorkerAddress",
    "NoAsyncioLoop",
    "NoWorkerAvailable",
    "Placement",
    "PlacementClient",
    "ShadowForwarder",
    "TaskLine",
    "TaskOutcome",
    "TaskToRun",
    "WatchEndedEarly",
    "WorkerCallError",
    "WorkerClient",
    "WorkerUnreachable",
    "outputs_shown",
    "parse_worker_address",
    "readable",
    "shadow_target",
    "task_lines",
    "task_outputs",
    "task_spec",
    "task_spec_from_json",
    "task_specs_from_lines",
]
