"""What a builder is: its request, its protocol, its error and its registry.

A builder turns a task's function call and payload into the task's calls. It
must be cheap and must never run user code or reach an executor: it only
describes calls, and the dispatcher runs them.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping, Sequence
from typing import ClassVar, Protocol

import attrs

from blockx.calls import CallSpec, FailureCode
from blockx.io import TaskIOScope
from blockx.phases._registry import PhaseFailed, Registry
from blockx.slots import FunctionCall


@attrs.frozen(kw_only=True)
class BuildRequest:
    """Everything a builder may look at for one task."""

    task_id: str
    function_call: FunctionCall
    payload: bytes
    task_code_epoch: str
    labels: Mapping[str, str] = attrs.field(factory=dict, hash=False)
    io: TaskIOScope | None = attrs.field(default=None, eq=False, hash=False)
    """The task's IO scope, for a builder that reads a source (None outside a worker)."""


class Builder(Protocol):
    """Turns one task's request into its calls; `name` is the function-call type it serves."""

    @property
    def name(self) -> str: ...

    @property
    def usage(self) -> str:
        """What it takes, in one line: its config keys and its payload (for `--help`)."""
        ...

    async def build(self, request: BuildRequest) -> list[CallSpec]: ...


class InlineBuilder(Builder, Protocol):
    """A builder that does no IO and no logging: its calls come from the request alone.

    The worker runs `build_now` within the slot table's own step, without a task
    actor and without taking a builder slot (it is over before any other task
    runs), so such a task costs fewer trips through the scheduler. `build` must
    give the same calls.
    """

    def build_now(self, request: BuildRequest) -> list[CallSpec]: ...


class StreamingBuilder(Builder, Protocol):
    """A builder that reads its calls from a source while they run: a scan.

    `stream` yields the task's calls in batches (an async generator: the worker
    closes it when the task ends). When `streamBuild.enabled` holds, the
    builder phase only opens the stream and reads its first batch; the call
    phase then runs under scan admission, its calls dispatched while the rest
    is read, at most `streamBuild.pendingCalls` of them sent and not ended at
    once, and the stream's end seals the task's calls. The worker bounds each
    batch's read by the phase IO timeout. Otherwise `build` gives every call
    at once (`collect`). A batch's reads and encoding belong on a worker thread.
    """

    def stream(self, request: BuildRequest) -> AsyncIterator[Sequence[CallSpec]]: ...


async def collect(batches: AsyncIterator[Sequence[CallSpec]]) -> list[CallSpec]:
    """Every call of a stream, in order: a streaming builder's `build`."""
    calls: list[CallSpec] = []
    async for batch in batches:
        calls.extend(batch)
    return calls


class BuilderFailed(PhaseFailed):
    """The task's payload or function-call config cannot be turned into calls.

    A bad payload never succeeds when submitted again: not retryable by default.
    """

    default_code: ClassVar[FailureCode] = FailureCode.BUILDER_FAILED


class BuilderRegistry(Registry[Builder]):
    """The builders of one worker, by name (immutable)."""

    kind: ClassVar[str] = "builder"
    __slots__ = ()
