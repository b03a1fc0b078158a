"""The shape of the `blockx` package: what imports what, and how long a function may be.

* Every module imports on its own, in a fresh `blockx` (nothing of blockx
  loaded before it), so no module works only because another came first.
* The graph of imports between packages has no cycle, no module imports a
  private module (`_x`) of another package, and the pure cores import nothing
  that reads a clock, draws a random number or does IO.
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
PURE_CORES = {
    "blockx.calls": {"msgpack"},
    "blockx.steps": set(),
    "blockx.slots": set(),
    "blockx.dispatch": set(),
}
"""Each pure core, and the libraries it may use besides attrs (the value codec is msgpack)."""
PURE_ALLOWED = frozenset({"attrs", "blockx.calls", "blockx.errors", "blockx.steps"})
"""Besides the standard library (less what `IMPURE` names)."""
IMPURE = frozenset({"asyncio", "random", "socket", "subprocess", "threading", "time", "trio"})


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
    # `python -m blockx` runs the command line when imported, as it should.
    names = [module.name for module in MODULES if module.name != "blockx.__main__"]
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
    assert {"blockx.calls", "blockx.slots", "blockx.dispatch", "blockx.app"} <= set(order)
    assert order.index("blockx.calls") < order.index("blockx.slots") < order.index("blockx.app")


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


@pytest.mark.parametrize("core", sorted(PURE_CORES))
def test_a_pure_core_imports_no_clock_randomness_or_io(core: str) -> None:
    offences = []
    for module in MODULES:
        if module.package != core and not module.package.startswith(core + "."):
            continue
        for imported in set(module.imports()):
            top = imported.split(".")[0]
            if imported.startswith(("blockx.", "attrs")):
                inside = imported.startswith(core + ".") or imported == core
                if not inside and not any(
                    imported == allowed or imported.startswith(allowed + ".")
                    for allowed in PURE_ALLOWED
                ):
                    offences.append(f"{module.name} imports {imported}")
            elif top in IMPURE or top not in sys.stdlib_module_names | PURE_CORES[core]:
                offences.append(f"{module.name} imports {imported}")
    assert offences == []


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
