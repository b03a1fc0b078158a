"""blockx: a worker node for a distributed task platform.

The package root is the API of function code (`blockx.function_api`):
`subcall` runs another function on the executor pool, `RetryableError` fails a
call as retryable.
"""

from blockx.function_api import (
    CallCancelled,
    NotInExecutor,
    RetryableError,
    SubcallFailed,
    subcall,
)

__version__ = "0.1.0"

__all__ = [
    "CallCancelled",
    "NotInExecutor",
    "RetryableError",
    "SubcallFailed",
    "__version__",
    "subcall",
]
