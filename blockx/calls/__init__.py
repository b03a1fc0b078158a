"""The leaf vocabulary of call execution, shared by every layer of the worker.

Call specs, call outcomes, the retry policy, call statistics, the one
registry of failure codes and the msgpack value codec. The slot table, the
dispatch core, the executor child, builders and plugins all import these
types; none of them keeps a copy. How the pure cores are driven (stimulus
ids, steps, the stimulus log) is not call vocabulary: it lives in
`blockx.steps`, which the automatic worker shares without loading this
package. Imports nothing of blockx but its error bases.
"""

from blockx.calls._codec import (
    POSITIONAL_KEY,
    VALUE_ERRORS,
    InvalidArguments,
    decode_args,
    decode_value,
    encode_args,
    encode_value,
)
from blockx.calls._codes import FailureCode
from blockx.calls._model import (
    MAX_JITTER_PERCENT,
    CallFailure,
    CallFailurePolicy,
    CallOutcome,
    CallPhaseOutcome,
    CallSpec,
    CallStats,
    RetryPolicy,
    Succeeded,
)

__all__ = [
    "MAX_JITTER_PERCENT",
    "POSITIONAL_KEY",
    "VALUE_ERRORS",
    "CallFailure",
    "CallFailurePolicy",
    "CallOutcome",
    "CallPhaseOutcome",
    "CallSpec",
    "CallStats",
    "FailureCode",
    "InvalidArguments",
    "RetryPolicy",
    "Succeeded",
    "decode_args",
    "decode_value",
    "encode_args",
    "encode_value",
]
