"""The fence around grpclib's internals (`blockx/api/_grpclib.py`) holds.

* The installed grpclib is the version the fence restates, and pyproject.toml pins it.
* The source of every upstream object the fence restates, overrides or relies on the
  inside of is the source it was written against (`UPSTREAM_DIGESTS`).
* The fence's docstring lists exactly the private grpclib names it touches, and no
  other module of blockx touches one.

A private grpclib name is a name starting with "_" that grpclib's own source defines
or uses (its `__x__` names included, Python's own dunders aside). A module touches one
when it imports a private grpclib module or name, reads or sets such an attribute on
anything but itself, passes such a keyword, or, in a class derived from a grpclib
class, defines one or reads it on `self`.
"""

from __future__ import annotations

import ast
import builtins
import collections.abc
import contextlib
import functools
import hashlib
import importlib
import importlib.metadata
import inspect
import re
import tomllib
import types
import typing
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Final

import attrs
import grpclib
import pytest

from blockx.api import _grpclib as fence

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "blockx"
GENERATED = PACKAGE / "_proto"
FENCE = PACKAGE / "api" / "_grpclib.py"
FENCE_NAME = "blockx/api/_grpclib.py"

PUBLIC_DUNDERS: Final = frozenset({"__mapping__"})
"""grpclib's `__x__` names that are its public interface: `__mapping__` is what every
generated service defines and what `Server` takes (blockx.api's WorkerService extends it)."""

OUTSIDE_THE_FENCE: Final = {"blockx/net/channels.py": frozenset({"_protocol_factory"})}
"""Known touches outside the fence, each limited to the names it has. The client's channel
(`blockx.net.channels`) overrides grpclib's `Channel._protocol_factory`; blockx.net may not
import blockx.api's private fence (the two packages would import each other, and every
gRPC client would load the server), so it stays there, held to the same digest check."""
OUTSIDE_DIGESTS: Final = {
    "grpclib.client.Channel._protocol_factory": (
        "12293ca34552ac2e7a2592a2ed6cdc6c0f191658ad82c756621ec5cc20b700c3"
    ),
}
"""The upstream source each touch outside the fence relies on, as `UPSTREAM_DIGESTS`."""


def _python_dunders() -> frozenset[str]:
    kinds: list[object] = [
        *vars(builtins).values(),
        *vars(collections.abc).values(),
        types.ModuleType,
        types.FunctionType,
        contextlib.AbstractContextManager,
        contextlib.AbstractAsyncContextManager,
        typing.Generic,
    ]
    names = {
        name
        for kind in kinds
        if isinstance(kind, type)
        for name in dir(kind)
        if name.startswith("__") and name.endswith("__")
    }
    # Python's, but on no class above: module globals, finalizers, dataclass hooks.
    return frozenset(names | {"__all__", "__version__", "__file__", "__del__", "__post_init__"})


@functools.cache
def grpclib_private_names() -> frozenset[str]:
    """Every private name grpclib's source defines or uses (see the module docstring)."""
    python = _python_dunders()
    names: set[str] = set()
    for path in Path(grpclib.__file__).parent.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names.update(_names_in(node))
    return frozenset(
        name
        for name in names
        if name.startswith("_") and name != "_" and name not in python | PUBLIC_DUNDERS
    )


def _names_in(node: ast.AST) -> Iterator[str]:
    match node:
        case ast.Attribute(attr=name) | ast.Name(id=name) | ast.arg(arg=name):
            yield name
        case ast.FunctionDef(name=name) | ast.AsyncFunctionDef(name=name) | ast.ClassDef(name=name):
            yield name
        case ast.keyword(arg=str(name)):
            yield name
        case ast.alias(name=name, asname=asname):
            yield from name.split(".")
            if asname is not None:
                yield asname


@attrs.frozen
class Touch:
    """A private grpclib `name` touched at `line`, and how."""

    name: str
    line: int
    how: str


def touches(tree: ast.Module, grpclib_based: Callable[[ast.ClassDef], bool]) -> list[Touch]:
    """Every touch of a private grpclib name in `tree`; `grpclib_based` tells whether a
    class derives from a grpclib class."""
    private = grpclib_private_names()
    found: list[Touch] = []
    inside_grpclib_class: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and grpclib_based(node):
            inside_grpclib_class.update(id(inner) for inner in ast.walk(node))
            found += [
                Touch(name, line, "overrides")
                for name, line in _class_body_names(node)
                if name in private
            ]
    for node in ast.walk(tree):
        match node:
            case ast.Import() | ast.ImportFrom():
                found.extend(_private_imports(node))
            case ast.Attribute(attr=name) if name in private:
                on_itself = isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")
                if not on_itself or id(node) in inside_grpclib_class:
                    found.append(Touch(name, node.lineno, "uses"))
            case ast.keyword(arg=str(name)) if name in private:
                found.append(Touch(name, node.value.lineno, "passes"))
    return found


def _class_body_names(node: ast.ClassDef) -> Iterator[tuple[str, int]]:
    """The names a class body defines: its methods and class attributes."""
    for statement in node.body:
        match statement:
            case ast.FunctionDef(name=name) | ast.AsyncFunctionDef(name=name):
                yield name, statement.lineno
            case ast.Assign(targets=targets):
                for target in targets:
                    if isinstance(target, ast.Name):
                        yield target.id, statement.lineno
            case ast.AnnAssign(target=ast.Name(id=name)):
                yield name, statement.lineno


def _private_imports(node: ast.Import | ast.ImportFrom) -> Iterator[Touch]:
    if isinstance(node, ast.Import):
        modules, names = [alias.name for alias in node.names], []
    else:
        modules, names = [node.module or ""], [alias.name for alias in node.names]
    for module in modules:
        parts = module.split(".")
        if parts[0] != "grpclib":
            continue
        for part in [*parts[1:], *names]:
            if part.startswith("_"):
                yield Touch(part, node.lineno, "imports")


def _grpclib_imports(tree: ast.Module) -> set[str]:
    """The names `tree` binds to something of grpclib."""
    bound: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "grpclib":
            bound.update(alias.asname or alias.name for alias in node.names)
        elif isinstance(node, ast.Import):
            bound.update(
                (alias.asname or alias.name).split(".")[0]
                for alias in node.names
                if alias.name.split(".")[0] == "grpclib"
            )
    return bound


def grpclib_based_in(tree: ast.Module, module: object | None) -> Callable[[ast.ClassDef], bool]:
    """Whether a class of `tree` derives from grpclib: directly by its bases' names, or (for
    a class of the imported `module`) anywhere in its method resolution order."""
    bound = _grpclib_imports(tree)

    def based(node: ast.ClassDef) -> bool:
        for base in node.bases:
            root = base
            while isinstance(root, ast.Attribute | ast.Subscript):
                root = root.value
            if isinstance(root, ast.Name) and root.id in bound:
                return True
        made = getattr(module, node.name, None)
        return isinstance(made, type) and any(
            kind.__module__.split(".")[0] == "grpclib" for kind in made.__mro__
        )

    return based


def module_touches(path: Path) -> list[Touch]:
    """The touches of private grpclib names in the blockx module at `path`."""
    parts = path.relative_to(ROOT).with_suffix("").parts
    name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
    # `python -m blockx` runs the command line when imported; it derives from nothing.
    module = None if name == "blockx.__main__" else importlib.import_module(name)
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return touches(tree, grpclib_based_in(tree, module))


def listed_private_names() -> dict[str, str]:
    """The names the fence's docstring lists, each with its line."""
    doc = inspect.getdoc(fence) or ""
    section = doc.partition("Private names of grpclib touched here")[2]
    bullets = section.split("\n\n")[1].splitlines()
    listed = {}
    for bullet in bullets:
        shape = re.fullmatch(r"\* `([\w.]+)` \(([\w., ]+)\): (\w.+)", bullet)
        assert shape is not None, f"{FENCE_NAME} lists {bullet!r}: not `name` (where): why"
        listed[shape.group(1).rpartition(".")[2]] = bullet
    return listed


def resolve(qualified_name: str) -> object:
    """The object a dotted name names: a module's, a class's, a method."""
    parts = qualified_name.split(".")
    for split in range(len(parts), 0, -1):
        try:
            found: object = importlib.import_module(".".join(parts[:split]))
        except ImportError:
            continue
        for part in parts[split:]:
            found = getattr(found, part)
        return found
    raise LookupError(qualified_name)


def test_the_installed_grpclib_is_the_version_the_fence_restates() -> None:
    installed = importlib.metadata.version("grpclib")
    assert installed == fence.UPSTREAM_VERSION, (
        f"grpclib {installed} is installed, but {FENCE_NAME} restates grpclib "
        f"{fence.UPSTREAM_VERSION}: review every override against it, then update "
        "UPSTREAM_VERSION, the digests and the pin in pyproject.toml"
    )


def test_pyproject_pins_the_grpclib_the_fence_restates() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    pins = [entry for entry in project["dependencies"] if re.match(r"grpclib\b", entry)]
    assert pins == [f"grpclib=={fence.UPSTREAM_VERSION}"]


@pytest.mark.parametrize("qualified_name", sorted(fence.UPSTREAM_DIGESTS))
def test_the_upstream_source_the_fence_restates_is_unchanged(qualified_name: str) -> None:
    source = inspect.getsource(resolve(qualified_name))  # type: ignore[arg-type]
    digest = hashlib.sha256(source.encode()).hexdigest()
    assert digest == fence.UPSTREAM_DIGESTS[qualified_name], (
        f"grpclib's {qualified_name} changed since {FENCE_NAME} restated it "
        f"(grpclib {fence.UPSTREAM_VERSION}): review the override, then update its digest"
    )


@pytest.mark.parametrize("qualified_name", sorted(OUTSIDE_DIGESTS))
def test_the_upstream_source_a_touch_outside_the_fence_relies_on_is_unchanged(
    qualified_name: str,
) -> None:
    source = inspect.getsource(resolve(qualified_name))  # type: ignore[arg-type]
    digest = hashlib.sha256(source.encode()).hexdigest()
    where = ", ".join(OUTSIDE_THE_FENCE)
    assert digest == OUTSIDE_DIGESTS[qualified_name], (
        f"grpclib's {qualified_name} changed since {where} overrode it "
        f"(grpclib {fence.UPSTREAM_VERSION}): review the override, then update its digest"
    )


def test_the_fence_lists_each_private_name_it_touches_and_no_other() -> None:
    touched = {touch.name for touch in module_touches(FENCE)}
    listed = listed_private_names()
    assert sorted(touched - set(listed)) == [], f"touched by {FENCE_NAME} but not listed"
    assert sorted(set(listed) - touched) == [], f"listed in {FENCE_NAME} but not touched"


def test_no_module_but_the_fence_touches_a_private_grpclib_name() -> None:
    offences = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path == FENCE or GENERATED in path.parents:
            continue
        where = str(path.relative_to(ROOT))
        allowed = OUTSIDE_THE_FENCE.get(where, frozenset())
        offences += [
            f"{where}:{touch.line} {touch.how} {touch.name}"
            for touch in module_touches(path)
            if touch.name not in allowed
        ]
    assert offences == [], f"only {FENCE_NAME} may touch grpclib's private names"


SNIPPETS = {
    "from grpclib.reflection._deprecated import ServerReflection": {"_deprecated"},
    "import grpclib.server\nserver._mapping.clear()": {"_mapping"},
    "from grpclib.server import _GC": {"_GC"},
    "from grpclib.config import Configuration\nConfiguration(_keepalive_time=1)": {
        "_keepalive_time"
    },
    "from grpclib import server\nclass S(server.Server):\n def _protocol_factory(self): ...": {
        "_protocol_factory"
    },
    "from grpclib.server import Handler as H\nclass A(H):\n def f(self): self._tasks.clear()": {
        "_tasks"
    },
    "from grpclib.server import Server\nclass S(Server):\n _gc_counter = 0": {"_gc_counter"},
    "class Own:\n def f(self): self._config = self._tasks = 1": set(),
    "channel._protocol.processor.close()": {"_protocol"},
}


@pytest.mark.parametrize("source", sorted(SNIPPETS))
def test_the_check_finds_each_kind_of_touch(source: str) -> None:
    tree = ast.parse(source)
    found = {touch.name for touch in touches(tree, grpclib_based_in(tree, None))}
    assert found == SNIPPETS[source]


def test_the_known_touches_outside_the_fence_are_still_there() -> None:
    for where, names in OUTSIDE_THE_FENCE.items():
        found = {touch.name for touch in module_touches(ROOT / where)}
        assert names <= found, f"{where} no longer touches {sorted(names - found)}: drop them"
