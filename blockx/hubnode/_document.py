"""A node's task result as the JSON document its hub attempt reports, made in the C runtime.

The document is the result as `blockx.client.readable` shows a `TaskResult`
(what `blockx submit --watch` prints): protobuf JSON, with the outputs the
`result` plugin kept shown as JSON values. `readable` goes through
betterproto2's `to_dict`, which reads the message classes' type hints again
on every call: about 0.3 ms of the node's loop for each task, the largest
cost of a hub task on the node. The same document is made here by the
official runtime's C implementation (upb, as the gRPC replies are; see
`blockx.api._convert`) in a tenth of that; tests/core/test_hubnode_document.py
holds it equal to `readable`'s.
"""

from __future__ import annotations

import json

from google.protobuf import json_format  # type: ignore[import-untyped]

from blockx.api import result_message
from blockx.client import outputs_shown
from blockx.slots import TaskResult


def result_document(result: TaskResult) -> str:
    """`result` as the JSON text of `readable(pb.TaskResult)`: its outputs, when they are a
    JSON array, as `outputs` in the place of `outputsJson`; else the text as it came."""
    return json.dumps(outputs_shown(json_format.MessageToDict(result_message(result))))
