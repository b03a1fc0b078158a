"""The walk-through's handler as `blockx autoworker` runs it: a plain function.

Set up a hub, a queue and a credential as in `examples/autoworker_normalize.py`,
then run the worker and queue a task (docs/autoworker.md shows the output):

    uv run blockx autoworker --hub http://127.0.0.1:8090 --queue text \\
        --credential-file worker.credential examples.autoworker_handlers:normalize &
    uv run blockx hub submit --queue text --handler text.normalize \\
        --handler-version v1 --payload-version v1 --payload '{"text": "  hello   hub "}'
    uv run blockx hub task show TASK_ID     # state SUCCEEDED, result {"text": "HELLO HUB"}
    kill -INT %1                            # drains, prints the worker's counts

A plain `def` runs in a thread of the worker, so it may block (files, a
database driver, `requests`) without stalling the worker's heartbeats and
lease renewals.
"""

from __future__ import annotations

from blockx.autoworker import WorkerExecution, handles


@handles("text.normalize")
def normalize(execution: WorkerExecution) -> dict[str, str]:
    """Strip, collapse runs of whitespace to one space, upper-case."""
    return {"text": " ".join(execution.payload["text"].split()).upper()}
