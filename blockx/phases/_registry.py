"""Name -> implementation registries of builders and plugins, and the error of a phase.

Owns the rule that a worker serves a fixed set of builders and plugins, chosen
by name at start-up: a registry is immutable once made, an unknown name is
refused when the registry is assembled (never when a task first asks for it),
and two implementations never share a name. A builder or plugin may answer to
several names (the seed's spellings beside ours). It never constructs an
implementation itself: the packages pass their own factories in.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from types import MappingProxyType
from typing import ClassVar, Generic, Protocol, TypeVar

from blockx.calls import FailureCode
from blockx.errors import BlockxError


class UnknownName(BlockxError):
    """A configured builder or plugin name that this worker does not have."""

    def __init__(self, *, kind: str, name: str, known: tuple[str, ...]) -> None:
        self.kind = kind
        self.name = name
        self.known = known
        super().__init__(f"unknown {kind} {name!r}; known {kind}s: {', '.join(known) or 'none'}")


class DuplicateName(BlockxError):
    """Two implementations handed to one registry have the same name."""

    def __init__(self, *, kind: str, name: str) -> None:
        self.kind = kind
        self.name = name
        super().__init__(f"two {kind}s are named {name!r}; each name may be registered once")


class PhaseFailed(BlockxError):
    """A builder or plugin could not do its part for one task.

    `code` becomes the task's failure code (the phase's default unless given);
    `retryable` says whether running the same task again may succeed.
    """

    default_code: ClassVar[FailureCode]

    def __init__(
        self, *, message: str, code: FailureCode | None = None, retryable: bool = False
    ) -> None:
        self.code = code or self.default_code
        self.message = message
        self.retryable = retryable
        super().__init__(message)


class Named(Protocol):
    @property
    def name(self) -> str: ...


T = TypeVar("T", bound=Named)


class Registry(Generic[T]):
    """An immutable mapping name -> implementation, in registration order."""

    kind: ClassVar[str] = "implementation"
    __slots__ = ("_by_name",)

    def __init__(self, implementations: Iterable[T] = ()) -> None:
        by_name: dict[str, T] = {}
        for implementation in implementations:
            if implementation.name in by_name:
                raise DuplicateName(kind=self.kind, name=implementation.name)
            by_name[implementation.name] = implementation
        self._by_name: Mapping[str, T] = MappingProxyType(by_name)

    def get(self, name: str) -> T | None:
        return self._by_name.get(name)

    def names(self) -> tuple[str, ...]:
        return tuple(self._by_name)

    def __contains__(self, name: object) -> bool:
        return name in self._by_name

    def __len__(self) -> int:
        return len(self._by_name)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({', '.join(self._by_name)})"


def select(kind: str, names: Iterable[str], factories: Mapping[str, Callable[[], T]]) -> list[T]:
    """One fresh implementation per distinct name, in the order first named.

    Raises `UnknownName` for the first name that `factories` lacks. A name
    listed twice is registered once: profiles are unions of name lists.
    """
    chosen: dict[str, T] = {}
    for name in names:
        factory = factories.get(name)
        if factory is None:
            raise UnknownName(kind=kind, name=name, known=tuple(factories))
        if name not in chosen:
            chosen[name] = factory()
    return list(chosen.values())
