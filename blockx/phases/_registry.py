"""Name -> implementation registries of builders and plugins, and the error of a phase.

Owns the rule that a worker serves a fixed set of builders and plugins, chosen
by name at start-up: a registry is immutable once made, an unknown name is
refused when the registry is assembled (never when a task first asks for it),
and two implementations never share a name. A task naming a builder or plugin
the worker lacks gets the same `UnknownName` (from `Registry.require`), when
it is activated. A builder or plugin may answer to two names (its camelCase
alias, the name the Go worker uses, beside ours): `CAMEL_CASE_ALIASES` is the
one table of them, and a registry, `select` and every message that lists names
read it. It never constructs an implementation itself: the packages pass their
own factories in.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from types import MappingProxyType
from typing import ClassVar, Final, Generic, Protocol, TypeVar

from blockx.calls import FailureCode
from blockx.errors import BlockxError, shown

CAMEL_CASE_ALIASES: Final[Mapping[str, str]] = MappingProxyType(
    {
        "callList": "call_list",
        "bundleScan": "bundle_scan",
        "bundleWrite": "bundle_write",
        "tableUpserts": "table_upserts",
    }
)
"""The camelCase alias of a builder or plugin (the name the Go worker uses) -> ours,
wherever the two differ.

Coordinators written for the Go worker name them this way; both spellings
reach the same implementation. `dbscan` is spelt the same in both. Names here
need not be registered in every profile: a profile that has the builder or
plugin answers to both spellings.
"""

_ALIAS_OF: Final[Mapping[str, str]] = MappingProxyType(
    {ours: alias for alias, ours in CAMEL_CASE_ALIASES.items()}
)


def our_name(name: str) -> str:
    """`name` in our spelling (`callList` -> `call_list`); any other name as it is."""
    return CAMEL_CASE_ALIASES.get(name, name)


def spelled(name: str) -> str:
    """`name` in our spelling followed by its camelCase alias, where they differ:
    `call_list (callList)`."""
    ours = our_name(name)
    alias = _ALIAS_OF.get(ours)
    return f"{ours} ({alias})" if alias is not None else ours


class UnknownName(BlockxError):
    """A configured builder or plugin name that this worker does not have."""

    def __init__(self, *, kind: str, name: str, known: tuple[str, ...]) -> None:
        self.kind = kind
        self.name = name
        self.known = known
        other = CAMEL_CASE_ALIASES.get(name) or _ALIAS_OF.get(name)
        # A task names the type: quoted in full, an unbounded name would be kept in its
        # result for the retention window.
        asked = f"{name!r} ({other})" if other is not None else shown(name)
        listed = ", ".join(spelled(known_name) for known_name in known) or "none"
        super().__init__(f"unknown {kind} {asked}; known {kind}s: {listed}")


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
    """An immutable mapping name -> implementation, in registration order.

    Names are kept in our spelling; every lookup also takes the camelCase alias.
    """

    kind: ClassVar[str] = "implementation"
    __slots__ = ("_by_name",)

    def __init__(self, implementations: Iterable[T] = ()) -> None:
        by_name: dict[str, T] = {}
        for implementation in implementations:
            name = our_name(implementation.name)
            if name in by_name:
                raise DuplicateName(kind=self.kind, name=name)
            by_name[name] = implementation
        self._by_name: Mapping[str, T] = MappingProxyType(by_name)

    def get(self, name: str) -> T | None:
        return self._by_name.get(our_name(name))

    def require(self, name: str) -> T:
        """The implementation named `name`; `UnknownName` listing the known ones if none."""
        implementation = self.get(name)
        if implementation is None:
            raise UnknownName(kind=self.kind, name=name, known=self.names())
        return implementation

    def names(self) -> tuple[str, ...]:
        """The registered names, in our spelling (`spelled` adds the camelCase alias)."""
        return tuple(self._by_name)

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and our_name(name) in self._by_name

    def __len__(self) -> int:
        return len(self._by_name)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({', '.join(self._by_name)})"


def select(kind: str, names: Iterable[str], factories: Mapping[str, Callable[[], T]]) -> list[T]:
    """One fresh implementation per distinct name, in the order first named.

    `factories` are keyed by our spelling; `names` may use the camelCase aliases. Raises
    `UnknownName` for the first name that `factories` lacks. A name listed
    twice (in either spelling) is registered once: profiles are unions of
    name lists.
    """
    chosen: dict[str, T] = {}
    for name in names:
        ours = our_name(name)
        factory = factories.get(ours)
        if factory is None:
            raise UnknownName(kind=kind, name=name, known=tuple(factories))
        if ours not in chosen:
            chosen[ours] = factory()
    return list(chosen.values())
