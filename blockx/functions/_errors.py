"""Errors of the function code view, its sources and the executor-side loader.

Every error carries the epoch, module, task or source it is about as fields;
the message is only a rendering of those fields. Raising one never leaves the
view half-changed: a refused call changes nothing.
"""

from __future__ import annotations

from blockx.errors import BlockxError, InvalidValue


class FunctionCodeError(BlockxError):
    """Base of every function-code error."""


class UnknownEpoch(FunctionCodeError):
    """No snapshot with this epoch is known (never seen, or already purged)."""

    def __init__(self, *, epoch: str) -> None:
        self.epoch = epoch
        super().__init__(f"function code epoch {epoch!r} is unknown or has been purged")


class UnknownModule(FunctionCodeError):
    """The epoch's snapshot has no module of this name."""

    def __init__(self, *, epoch: str, module: str) -> None:
        self.epoch = epoch
        self.module = module
        super().__init__(f"module {module!r} does not exist in function code epoch {epoch!r}")


class UnknownFunction(FunctionCodeError):
    """The module exists but has no attribute of this name."""

    def __init__(self, *, epoch: str, module: str, function: str) -> None:
        self.epoch = epoch
        self.module = module
        self.function = function
        super().__init__(
            f"module {module!r} in function code epoch {epoch!r} has no function {function!r}"
        )


class NotPublic(FunctionCodeError):
    """The name exists in the module but is not one of its public functions."""

    def __init__(self, *, epoch: str, module: str, function: str, why: str) -> None:
        self.epoch = epoch
        self.module = module
        self.function = function
        super().__init__(
            f"{module}.{function} in function code epoch {epoch!r} cannot be called: {why}"
        )


class NotCallable(FunctionCodeError):
    """The name exists in the module but is not callable."""

    def __init__(self, *, epoch: str, module: str, function: str, type_name: str) -> None:
        self.epoch = epoch
        self.module = module
        self.function = function
        self.type_name = type_name
        super().__init__(
            f"{module}.{function} in function code epoch {epoch!r} is a {type_name}, not a callable"
        )


class InvalidFunctionRef(FunctionCodeError):
    """A function reference is not of the form `module.function`."""

    def __init__(self, *, ref: str) -> None:
        self.ref = ref
        super().__init__(
            f"function reference {ref!r} is invalid: expected 'module.function' "
            "(dotted Python identifiers, at least one dot)"
        )


class InvalidModuleName(FunctionCodeError):
    """A module name in a snapshot (or a file in a function directory) cannot be imported."""

    def __init__(self, *, module: str, origin: str) -> None:
        self.module = module
        self.origin = origin
        super().__init__(
            f"module name {module!r} (from {origin}) is invalid: every dotted part must be a "
            "Python identifier that is not a keyword and not '__init__'"
        )


class InvalidEpoch(FunctionCodeError):
    """An epoch string cannot be used as an epoch."""

    def __init__(self, *, epoch: str) -> None:
        self.epoch = epoch
        super().__init__(
            f"epoch {epoch!r} is invalid: 1 to 128 printable ASCII characters, no spaces"
        )


class EpochConflict(FunctionCodeError):
    """A snapshot arrived under an epoch already known with different content."""

    def __init__(self, *, epoch: str) -> None:
        self.epoch = epoch
        super().__init__(
            f"function code epoch {epoch!r} arrived again with different modules; "
            "an epoch's content never changes"
        )


class FunctionCodeSyntaxError(FunctionCodeError):
    """Function code does not compile."""

    def __init__(self, *, epoch: str, module: str, line: int | None, detail: str) -> None:
        self.epoch = epoch
        self.module = module
        self.line = line
        self.detail = detail
        where = f"line {line}" if line is not None else "unknown line"
        super().__init__(
            f"syntax error in module {module!r} of function code epoch {epoch!r} "
            f"at {where}: {detail}"
        )


class ModuleImportFailed(FunctionCodeError):
    """Function code raised while its module was being imported."""

    def __init__(self, *, epoch: str, module: str, error: str) -> None:
        self.epoch = epoch
        self.module = module
        self.error = error
        super().__init__(
            f"importing module {module!r} of function code epoch {epoch!r} failed: {error}"
        )


class NoCurrentEpoch(FunctionCodeError):
    """A task asked to pin an epoch before any snapshot was observed."""

    def __init__(self, *, task_id: str) -> None:
        self.task_id = task_id
        super().__init__(
            f"task {task_id!r} cannot pin function code: no snapshot has been loaded yet"
        )


class TaskNotPinned(FunctionCodeError):
    """`unpin` for a task that holds no pin."""

    def __init__(self, *, task_id: str) -> None:
        self.task_id = task_id
        super().__init__(f"task {task_id!r} holds no function code pin")


class NothingPublished(FunctionCodeError):
    """The source is reachable but has no current epoch yet."""

    def __init__(self, *, source: str) -> None:
        self.source = source
        super().__init__(f"no function code has been published to {source} yet")


class EmptySnapshot(FunctionCodeError):
    """Publishing was asked for a snapshot with no modules."""

    def __init__(self, *, source: str) -> None:
        self.source = source
        super().__init__(f"{source} holds no .py files; refusing to publish an empty snapshot")


class SourceUnavailable(FunctionCodeError):
    """A source could not be read (directory missing, Redis down, bad URL)."""

    def __init__(self, *, source: str, reason: str) -> None:
        self.source = source
        self.reason = reason
        super().__init__(f"function code source {source} is unavailable: {reason}")


class InvalidCodeViewConfig(FunctionCodeError, InvalidValue):
    """A function-code setting is out of range or inconsistent with another."""
