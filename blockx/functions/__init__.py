"""The function code view: sources, epochs, pinning, retention, and the executor-side loader.

A function is `module.function` inside an epoch: an immutable snapshot of
module sources read from a directory, Redis or memory. The worker's
`FunctionCodeView` knows the current epoch, pins one per task and keeps
superseded snapshots for `functionSnapshotRetentionMs`; the code refresher
feeds it; executors import a task's pinned epoch with `EpochModules`. Nothing
here decides task state.
"""

from typing import TYPE_CHECKING, Any

from blockx.functions._errors import (
    EmptySnapshot,
    EpochConflict,
    FunctionCodeError,
    FunctionCodeSyntaxError,
    InvalidCodeViewConfig,
    InvalidEpoch,
    InvalidFunctionRef,
    InvalidModuleName,
    ModuleImportFailed,
    NoCurrentEpoch,
    NotCallable,
    NothingPublished,
    NotPublic,
    SourceUnavailable,
    TaskNotPinned,
    UnknownEpoch,
    UnknownFunction,
    UnknownModule,
)
from blockx.functions._loader import EpochModules, Fetch
from blockx.functions._snapshot import FunctionSnapshot, content_epoch, is_valid_module_name
from blockx.functions._sources import (
    DEFAULT_REDIS_PREFIX,
    DirectorySource,
    FunctionSource,
    MemorySource,
    RedisSource,
    publish_directory,
    read_directory,
    redact_url,
)
from blockx.functions._view import (
    ChangeKind,
    CodeViewConfig,
    EpochStatus,
    FunctionCodeView,
    ViewChange,
)

if TYPE_CHECKING:
    from blockx.functions._service import run_code_refresher


def __getattr__(name: str) -> Any:
    # Executor processes import the loader from here; the refresher (and with
    # it trio) loads only when the worker asks for it.
    if name == "run_code_refresher":
        from blockx.functions._service import run_code_refresher  # noqa: PLC0415

        return run_code_refresher
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "DEFAULT_REDIS_PREFIX",
    "ChangeKind",
    "CodeViewConfig",
    "DirectorySource",
    "EmptySnapshot",
    "EpochConflict",
    "EpochModules",
    "EpochStatus",
    "Fetch",
    "FunctionCodeError",
    "FunctionCodeSyntaxError",
    "FunctionCodeView",
    "FunctionSnapshot",
    "FunctionSource",
    "InvalidCodeViewConfig",
    "InvalidEpoch",
    "InvalidFunctionRef",
    "InvalidModuleName",
    "MemorySource",
    "ModuleImportFailed",
    "NoCurrentEpoch",
    "NotCallable",
    "NotPublic",
    "NothingPublished",
    "RedisSource",
    "SourceUnavailable",
    "TaskNotPinned",
    "UnknownEpoch",
    "UnknownFunction",
    "UnknownModule",
    "ViewChange",
    "content_epoch",
    "is_valid_module_name",
    "publish_directory",
    "read_directory",
    "redact_url",
    "run_code_refresher",
]
