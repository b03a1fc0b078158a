"""The shape of the `blockx` package: what imports what, and how long a function may be.

* Every module imports on its own, in a fresh `blockx` (nothing of blockx
  loaded before it), so no module works only because another came first.
* The graph of imports between packages has no cycle, no module imports a
  private module (`_x`) of another package, and the pure cores (the slot
  table, call dispatch, the hub's rules, the automatic worker's core), and
  what they import, import nothing that reads a clock, draws a random number
  or does IO.
* Importing the automatic worker loads neither the hub nor the worker.
* At most `MAX_ROOT_MODULES` modules sit at the package's root: the rest live in the
  package of what they are for.
* No function is longer than 60 lines (generated protobuf code aside).

Imports are read from the source (every `import` statement, type-only and
deferred ones included), so a cycle hidden behind `TYPE_CHECKING` counts.
"""

from __future__ import annotations

import ast
import graphlib
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import attrs
import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "blockx"
GENERATED = PACKAGE / "_proto"
MAX_FUNCTION_LINES = 60
MAX_ROOT_MODULES = 10
IMPURE = frozenset({"asyncio", "random", "socket", "subprocess", "threading", "time", "trio"})
"""Standard library a pure module never imports: clocks, randomness, IO, concurrency."""
PURE_ALLOWED = frozenset({"attrs", "blockx.calls", "blockx.errors", "blockx.steps"})
"""What the worker's pure cores may import besides the standard library (less `IMPURE`)."""
HUB_PURE_ALLOWED = frozenset({"attrs", "blockx.errors", "blockx.hubwire", "blockx.steps"})
"""The same for the hub's and the automatic worker's: their wire protocol, not the worker's
call vocabulary (which `import blockx.autoworker` must not load)."""


@attrs.frozen
class Pure:
    """A pure module, or a pure package (every module in it): besides the standard library
    (less `IMPURE`) it imports only `allowed` (blockx modules, attrs) and `libraries`."""

    allowed: frozenset[str]
    libraries: frozenset[str] = frozenset()


PURE = {
    # The four cores: events in, commands out. A core that is one module of an impure
    # package (the hub's rules, the automatic worker's core) is checked alone.
    "blockx.slots": Pure(PURE_ALLOWED),
    "blockx.dispatch": Pure(PURE_ALLOWED),
    "blockx.hub._rules": Pure(HUB_PURE_ALLOWED | {"blockx.hub._model"}),
    "blockx.autoworker._core": Pure(HUB_PURE_ALLOWED | {"blockx.autoworker._handlers"}),
    # What they may import is pure in turn.
    "blockx.calls": Pure(PURE_ALLOWED, libraries=frozenset({"msgpack"})),  # the value codec
    "blockx.steps": Pure(frozenset({"attrs"})),
    "blockx.errors": Pure(frozenset()),
    "blockx.hubwire": Pure(
        frozenset({"attrs", "blockx.errors"}), libraries=frozenset({"cattrs", "msgpack"})
    ),
    "blockx.hub._model": Pure(frozenset({"attrs", "blockx.hubwire"})),
    "blockx.autoworker._handlers": Pure(frozenset({"attrs", "blockx.errors", "blockx.hubwire"})),
    # The hub's series of the last hour: every time is given to it, never read.
    "blockx.hub._series": Pure(frozenset()),
}
AUTOWORKER_MODULES = 15
"""At most this many blockx modules load with `import blockx.autoworker`."""
NOT_FOR_THE_AUTOWORKER = ("blockx.hub", "blockx.config", "blockx.executors", "blockx.slots")


@attrs.frozen
class Module:
    name: str
    path: Path

    @property
    def package(self) -> str:
        """The package the module belongs to (itself for a package's `__init__`)."""
        if self.path.name == "__init__.py":
            return self.name
        return self.name.rpartition(".")[0]

    @property
    def node(self) -> str:
        """What the module is in the package graph: its package, or itself at the top."""
        return self.name if self.package == "blockx" else self.package

    def imports(self) -> Iterator[str]:
        """Every module this one names in an import statement, anywhere in it."""
        tree = ast.parse(self.path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                yield from (alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module is not None:
                assert node.level == 0, f"{self.name}: relative import"
                yield node.module
                yield from (f"{node.module}.{alias.name}" for alias in node.names)


def _modules() -> list[Module]:
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if GENERATED in path.parents:
            continue
        parts = path.relative_to(ROOT).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found.append(Module(name=name, path=path))
    return found


MODULES = _modules()
MODULE_NAMES = frozenset(module.name for module in MODULES) | {"blockx._proto"}


def _blockx_imports(module: Module) -> set[str]:
    """The blockx modules `module` imports (a `from package import name` counts once)."""
    named = set()
    for imported in module.imports():
        if imported.startswith("blockx._proto"):
            named.add("blockx._proto")
        elif imported in MODULE_NAMES:
            named.add(imported)
    return named - {module.name}


def _within(name: str, outer: str) -> bool:
    """`name` is `outer`, or a module or attribute inside it."""
    return name == outer or name.startswith(outer + ".")


def _node(name: str) -> str:
    """The package an imported module belongs to, as a node of the package graph."""
    if name == "blockx._proto":
        return name
    module = next(m for m in MODULES if m.name == name)
    return module.node


def test_every_module_imports_on_its_own() -> None:
    script = """
import importlib, sys, traceback
failed = []
for name in sys.argv[1:]:
    for loaded in [m for m in sys.modules if m == "blockx" or m.startswith("blockx.")]:
        del sys.modules[loaded]
    try:
        importlib.import_module(name)
    except Exception:
        failed.append(name + ": " + traceback.format_exc(limit=3))
print("\\n".join(failed))
sys.exit(1 if failed else 0)
"""
    names = [module.name for module in MODULES]  # `blockx.__main__` runs nothing on import
    done = subprocess.run(
        [sys.executable, "-c", script, *names],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_packages_import_each_other_without_a_cycle() -> None:
    graph: dict[str, set[str]] = {}
    for module in MODULES:
        edges = graph.setdefault(module.node, set())
        for imported in _blockx_imports(module):
            target = _node(imported)
            # A package may use its own modules and its ancestors' (the root
            # package re-exports the function API, which imports nothing back).
            if target != module.node and not module.node.startswith(target + "."):
                edges.add(target)
    try:
        order = list(graphlib.TopologicalSorter(graph).static_order())
    except graphlib.CycleError as error:
        pytest.fail(f"packages import each other in a cycle: {' -> '.join(error.args[1])}")
    cores = ("blockx.slots", "blockx.dispatch", "blockx.autoworker")
    assert {"blockx.calls", "blockx.steps", *cores, "blockx.app"} <= set(order)
    assert order.index("blockx.calls") < order.index("blockx.slots") < order.index("blockx.app")
    assert all(order.index("blockx.steps") < order.index(core) for core in cores)


def test_no_module_imports_a_private_module_of_another_package() -> None:
    offences = []
    for module in MODULES:
        for imported in _blockx_imports(module):
            parts = imported.split(".")
            private = next((i for i, part in enumerate(parts) if part.startswith("_")), None)
            if private is None:
                continue
            owner = ".".join(parts[:private])  # the package the private name belongs to
            if not (module.package == owner or module.package.startswith(owner + ".")):
                offences.append(f"{module.name} imports {imported}")
    assert offences == []


@pytest.mark.parametrize("pure", sorted(PURE))
def test_a_pure_core_imports_no_clock_randomness_or_io(pure: str) -> None:
    rule = PURE[pure]
    modules = [module for module in MODULES if _within(module.name, pure)]
    assert modules, f"no module {pure}"
    offences = []
    for module in modules:
        for imported in set(module.imports()):
            top = imported.split(".")[0]
            if top in ("blockx", "attrs"):
                if not _within(imported, pure) and not any(
                    _within(imported, allowed) for allowed in rule.allowed
                ):
                    offences.append(f"{module.name} imports {imported}")
            elif top in IMPURE or top not in sys.stdlib_module_names | rule.libraries:
                offences.append(f"{module.name} imports {imported}")
    assert offences == []


def test_what_a_pure_core_may_import_is_checked_as_pure_too() -> None:
    unchecked = {
        allowed
        for rule in PURE.values()
        for allowed in rule.allowed
        if allowed != "attrs" and not any(_within(allowed, pure) for pure in PURE)
    }
    assert unchecked == set()


def _loaded_by(*modules: str) -> list[str]:
    """Every module a fresh interpreter has loaded once it imported `modules`."""
    script = f"import sys, {', '.join(modules)}; print(*sorted(sys.modules))"
    done = subprocess.run(
        [sys.executable, "-c", script],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return done.stdout.split()


def test_importing_the_automatic_worker_loads_neither_the_hub_nor_the_worker() -> None:
    loaded = _loaded_by("blockx.autoworker")
    ours = [name for name in loaded if _within(name, "blockx")]
    assert len(ours) <= AUTOWORKER_MODULES, ours
    unwanted = (*NOT_FOR_THE_AUTOWORKER, "sqlite3", "_sqlite3", "httptools")
    assert [name for name in loaded if any(_within(name, u) for u in unwanted)] == []


def test_a_worker_or_a_hub_loads_no_test_tooling() -> None:
    """pytest (which `trio.testing` pulls in) costs a worker megabytes and a slower start."""
    tooling = ("pytest", "_pytest", "trio.testing", "hypothesis")
    loaded = _loaded_by("blockx.app", "blockx.cli")
    assert [name for name in loaded if any(_within(name, t) for t in tooling)] == []


def test_at_most_ten_modules_sit_at_the_root() -> None:
    root = sorted(path.name for path in PACKAGE.glob("*.py"))
    assert len(root) <= MAX_ROOT_MODULES, root


def _functions() -> Iterator[tuple[int, str]]:
    for module in MODULES:
        tree = ast.parse(module.path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                assert node.end_lineno is not None
                lines = node.end_lineno - node.lineno + 1
                yield lines, f"{module.path.relative_to(ROOT)}:{node.lineno} {node.name}"


def test_no_function_is_longer_than_sixty_lines() -> None:
    too_long = sorted(entry for entry in _functions() if entry[0] > MAX_FUNCTION_LINES)
    assert too_long == []
