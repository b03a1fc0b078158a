"""Worker nodes fed by a hub: `blockx serve --hub URL --hub-queue Q --hub-credential-file F`.

`HubFeed` runs the automatic worker runtime against the hub beside the node's
gRPC API, with the node's tasks as its handler; `attempt_outcome` maps a
task's end to the attempt's outcome (the table is in `_outcomes`).
"""

from blockx.hubnode._feed import CONFIRM_MS, HubFeed
from blockx.hubnode._outcomes import DETERMINISTIC, KIND_OF, NODE, UNCERTAIN, attempt_outcome

__all__ = [
    "CONFIRM_MS",
    "DETERMINISTIC",
    "KIND_OF",
    "NODE",
    "UNCERTAIN",
    "HubFeed",
    "attempt_outcome",
]
