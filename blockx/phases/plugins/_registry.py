"""Name -> plugin registries, shared by the builder and writer packages.

Owns the rule that a worker serves a fixed set of builders and writers, chosen
by name at start-up: a registry is immutable once made, an unknown name is
refused when the registry is assembled (never when a task first asks for it),
and two plugins never share a name. It must never construct a plugin itself:
the packages pass their own factories in.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from types import MappingProxyType
from typing import ClassVar, Generic, Protocol, TypeVar

from blockx.errors import BlockxError


class UnknownPlugin(BlockxError):
    """A configured builder or writer name that this worker does not have."""

    def __init__(self, *, kind: str, name: str, known: tuple[str, ...]) -> None:
        self.kind = kind
        self.name = name
        self.known = known
        super().__init__(f"unknown {kind} {name!r}; known {kind}s: {', '.join(known) or 'none'}")


class DuplicatePlugin(BlockxError):
    """Two plugins handed to one registry have the same name."""

    def __init__(self, *, kind: str, name: str) -> None:
        self.kind = kind
        self.name = name
        super().__init__(f"two {kind}s are named {name!r}; each name may be registered once")


class PhaseFailed(BlockxError):
    """A builder or writer could not do its part for one task.

    `code` becomes the task's failure code (the phase's default unless given);
    `retryable` says whether running the same task again may succeed.
    """

    default_code: ClassVar[str]

    def __init__(self, *, message: str, code: str | None = None, retryable: bool = False) -> None:
        self.code = code or self.default_code
        self.message = message
        self.retryable = retryable
        super().__init__(message)


class Named(Protocol):
    @property
    def name(self) -> str: ...


PluginT = TypeVar("PluginT", bound=Named)


class PluginRegistry(Generic[PluginT]):
    """An immutable mapping name -> plugin, in registration order."""

    kind: ClassVar[str] = "plugin"
    __slots__ = ("_by_name",)

    def __init__(self, plugins: Iterable[PluginT] = ()) -> None:
        by_name: dict[str, PluginT] = {}
        for plugin in plugins:
            if plugin.name in by_name:
                raise DuplicatePlugin(kind=self.kind, name=plugin.name)
            by_name[plugin.name] = plugin
        self._by_name: Mapping[str, PluginT] = MappingProxyType(by_name)

    def get(self, name: str) -> PluginT | None:
        return self._by_name.get(name)

    def names(self) -> tuple[str, ...]:
        return tuple(self._by_name)

    def __contains__(self, name: object) -> bool:
        return name in self._by_name

    def __len__(self) -> int:
        return len(self._by_name)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({', '.join(self._by_name)})"


def select_plugins(
    kind: str, names: Iterable[str], factories: Mapping[str, Callable[[], PluginT]]
) -> list[PluginT]:
    """One fresh plugin per distinct name, in the order first named.

    Raises `UnknownPlugin` for the first name that `factories` lacks. A name
    listed twice is registered once: profiles are unions of name lists.
    """
    chosen: dict[str, PluginT] = {}
    for name in names:
        factory = factories.get(name)
        if factory is None:
            raise UnknownPlugin(kind=kind, name=name, known=tuple(factories))
        if name not in chosen:
            chosen[name] = factory()
    return list(chosen.values())
