"""The executor-side loader: epochs side by side, relative imports, typed failures, forgetting.

Source text comes from a `FunctionCodeView`, the way an executor's fetch
reaches the worker's view over its socket. Every loader is closed at
teardown, which must leave `sys.modules` and `sys.meta_path` as they were.
"""

from __future__ import annotations

import sys
import traceback
from collections.abc import Iterator
from typing import Any

import pytest

from blockx.config import default_config
from blockx.functions import (
    EpochModules,
    FunctionCodeSyntaxError,
    FunctionCodeView,
    FunctionSnapshot,
    InvalidFunctionRef,
    ModuleImportFailed,
    NotCallable,
    NotPublic,
    UnknownEpoch,
    UnknownFunction,
    UnknownModule,
)

ADDING = FunctionSnapshot.of(
    {
        "demo": "from . import helpers\n\ndef add(a, b):\n    return helpers.combine(a, b)\n",
        "helpers": "def combine(a, b):\n    return a + b\n",
    }
)
SUBTRACTING = FunctionSnapshot.of(
    {
        "demo": "from . import helpers\n\ndef add(a, b):\n    return helpers.combine(a, b)\n",
        "helpers": "def combine(a, b):\n    return a - b\n",
    }
)


class CountingFetch:
    """Answers from a view (as the worker does) and records every request."""

    def __init__(self, *snapshots: FunctionSnapshot) -> None:
        self.view = FunctionCodeView(default_config().code_view_config())
        for now_ms, snapshot in enumerate(snapshots):
            self.view.observe(snapshot, now_ms=now_ms)
        self.requests: list[tuple[str, str]] = []

    def __call__(self, epoch: str, module: str) -> str:
        self.requests.append((epoch, module))
        return self.view.module_source(epoch, module)


@pytest.fixture
def loaders() -> Iterator[list[EpochModules]]:
    made: list[EpochModules] = []
    modules_before = set(sys.modules)
    meta_path_before = list(sys.meta_path)
    yield made
    for loader in made:
        loader.close()
    assert not [name for name in set(sys.modules) - modules_before if "_epoch_" in name]
    assert sys.meta_path == meta_path_before


def loader_for(loaders: list[EpochModules], *snapshots: FunctionSnapshot) -> EpochModules:
    loader = EpochModules(CountingFetch(*snapshots))
    loaders.append(loader)
    return loader


def test_two_epochs_load_side_by_side_without_interfering(loaders: list[EpochModules]) -> None:
    loader = loader_for(loaders, ADDING, SUBTRACTING)

    add_v1 = loader.resolve(ADDING.epoch, "demo.add")
    add_v2 = loader.resolve(SUBTRACTING.epoch, "demo.add")

    assert add_v1(5, 3) == 8
    assert add_v2(5, 3) == 2
    # Each epoch's `demo` imported its own `helpers`.
    demo_v1 = loader.module(ADDING.epoch, "demo")
    demo_v2 = loader.module(SUBTRACTING.epoch, "demo")
    assert demo_v1 is not demo_v2
    assert demo_v1.helpers is not demo_v2.helpers
    assert demo_v1.__name__ == f"{loader.package_name(ADDING.epoch)}.demo"
    assert loader.loaded_epochs() == sorted([ADDING.epoch, SUBTRACTING.epoch])


def test_relative_imports_resolve_within_the_epoch(loaders: list[EpochModules]) -> None:
    snapshot = FunctionSnapshot.of(
        {
            "calls": (
                "from . import helpers\n"
                "from .helpers import SCALE\n"
                "from .pkg.mod import twice\n\n"
                "def run(x):\n    return helpers.scale(twice(x)) + SCALE\n"
            ),
            "helpers": "SCALE = 10\n\ndef scale(x):\n    return x * SCALE\n",
            "pkg.mod": "from .. import helpers\n\ndef twice(x):\n    return 2 * x\n",
        }
    )
    loader = loader_for(loaders, snapshot)
    assert loader.resolve(snapshot.epoch, "calls.run")(1) == 30


def test_package_init_and_namespace_directories(loaders: list[EpochModules]) -> None:
    snapshot = FunctionSnapshot.of(
        {
            "pkg": "from .mod import VALUE\n\ndef get():\n    return VALUE\n",
            "pkg.mod": "VALUE = 42\n",
            "ns.leaf": "def hello():\n    return 'hi'\n",
        }
    )
    loader = loader_for(loaders, snapshot)
    assert loader.resolve(snapshot.epoch, "pkg.get")() == 42
    assert loader.resolve(snapshot.epoch, "ns.leaf.hello")() == "hi"


def test_modules_are_cached_per_epoch_and_forget_drops_them(
    loaders: list[EpochModules],
) -> None:
    fetch = CountingFetch(ADDING)
    loader = EpochModules(fetch)
    loaders.append(loader)

    first = loader.resolve(ADDING.epoch, "demo.add")
    requests = list(fetch.requests)
    assert loader.resolve(ADDING.epoch, "demo.add") is first
    assert fetch.requests == requests  # nothing fetched twice
    package = loader.package_name(ADDING.epoch)
    assert f"{package}.demo" in sys.modules

    loader.forget(ADDING.epoch)

    assert not [n for n in sys.modules if n == package or n.startswith(package + ".")]
    assert loader.loaded_epochs() == []
    again = loader.resolve(ADDING.epoch, "demo.add")
    assert again is not first
    assert again(1, 2) == 3
    assert fetch.requests == requests + requests
    loader.forget("never-loaded")  # forgetting an unknown epoch is a no-op


def test_syntax_error_is_reported_with_module_and_line(loaders: list[EpochModules]) -> None:
    snapshot = FunctionSnapshot.of(
        {
            "broken": "def f(:\n    pass\n",
            "user": "from . import broken\n\ndef g():\n    return 1\n",
        }
    )
    loader = loader_for(loaders, snapshot)

    with pytest.raises(FunctionCodeSyntaxError) as direct:
        loader.resolve(snapshot.epoch, "broken.f")
    assert (direct.value.epoch, direct.value.module, direct.value.line) == (
        snapshot.epoch,
        "broken",
        1,
    )
    assert "'broken'" in str(direct.value)

    # Imported by another module, the error still names the module that is broken.
    with pytest.raises(FunctionCodeSyntaxError) as nested:
        loader.resolve(snapshot.epoch, "user.g")
    assert nested.value.module == "broken"


def test_errors_raised_while_importing_are_typed_and_readable(
    loaders: list[EpochModules],
) -> None:
    snapshot = FunctionSnapshot.of(
        {
            "explodes": "raise ValueError('bad config')\n",
            "lonely": "from . import missing_sibling\n",
            "absolute": "import helpers\n",
            "helpers": "X = 1\n",
        }
    )
    loader = loader_for(loaders, snapshot)

    with pytest.raises(ModuleImportFailed) as explodes:
        loader.resolve(snapshot.epoch, "explodes.f")
    assert explodes.value.module == "explodes"
    assert explodes.value.error == "ValueError: bad config"
    assert isinstance(explodes.value.__cause__, ValueError)

    with pytest.raises(ModuleImportFailed) as lonely:
        loader.resolve(snapshot.epoch, "lonely.f")
    assert lonely.value.module == "lonely"
    assert "'missing_sibling'" in lonely.value.error
    assert "_epoch_" not in lonely.value.error

    # Absolute imports never reach function code: siblings are imported relatively.
    with pytest.raises(ModuleImportFailed) as absolute:
        loader.resolve(snapshot.epoch, "absolute.f")
    assert absolute.value.error == "ModuleNotFoundError: No module named 'helpers'"


def test_lookup_failures_name_what_is_missing(loaders: list[EpochModules]) -> None:
    snapshot = FunctionSnapshot.of({"demo": "LIMIT = 3\n\ndef add(a, b):\n    return a + b\n"})
    loader = loader_for(loaders, snapshot)

    with pytest.raises(UnknownModule) as no_module:
        loader.resolve(snapshot.epoch, "nothere.add")
    assert (no_module.value.epoch, no_module.value.module) == (snapshot.epoch, "nothere")

    with pytest.raises(UnknownModule) as no_parent:
        loader.resolve(snapshot.epoch, "no.such.mod.fn")
    assert no_parent.value.module == "no.such.mod"

    with pytest.raises(UnknownFunction) as no_function:
        loader.resolve(snapshot.epoch, "demo.sub")
    assert (no_function.value.module, no_function.value.function) == ("demo", "sub")

    with pytest.raises(NotCallable) as not_callable:
        loader.resolve(snapshot.epoch, "demo.LIMIT")
    assert (not_callable.value.function, not_callable.value.type_name) == ("LIMIT", "int")

    with pytest.raises(UnknownEpoch) as no_epoch:
        loader.resolve("0000000000000000", "demo.add")
    assert no_epoch.value.epoch == "0000000000000000"


@pytest.mark.parametrize("ref", ["add", "demo.", ".add", "demo.1x", "demo-x.add", "class.f"])
def test_malformed_references_are_refused(loaders: list[EpochModules], ref: str) -> None:
    loader = loader_for(loaders, ADDING)
    with pytest.raises(InvalidFunctionRef) as caught:
        loader.resolve(ADDING.epoch, ref)
    assert caught.value.ref == ref


def test_epochs_that_are_not_alphanumeric_load_too(loaders: list[EpochModules]) -> None:
    odd = FunctionSnapshot(epoch="v1.2-beta", modules=ADDING.modules)
    plain = FunctionSnapshot(epoch="v12beta", modules=SUBTRACTING.modules)
    loader = loader_for(loaders, odd, plain)
    assert loader.resolve("v1.2-beta", "demo.add")(2, 1) == 3
    assert loader.resolve("v12beta", "demo.add")(2, 1) == 1
    assert loader.package_name("v1.2-beta") != loader.package_name("v12beta")


def test_tracebacks_show_function_code(loaders: list[EpochModules]) -> None:
    snapshot = FunctionSnapshot.of({"demo": "def fail(msg):\n    raise RuntimeError(msg)\n"})
    loader = loader_for(loaders, snapshot)
    fail = loader.resolve(snapshot.epoch, "demo.fail")
    with pytest.raises(RuntimeError) as caught:
        fail("boom")
    rendered = "".join(traceback.format_exception(caught.value))
    assert f"<blockx epoch {snapshot.epoch}>/demo.py" in rendered
    assert "raise RuntimeError(msg)" in rendered


def test_two_loaders_in_one_process_do_not_share_modules(loaders: list[EpochModules]) -> None:
    first = loader_for(loaders, ADDING)
    second = loader_for(loaders, ADDING)
    assert first.package_name(ADDING.epoch) != second.package_name(ADDING.epoch)
    assert first.module(ADDING.epoch, "demo") is not second.module(ADDING.epoch, "demo")
    first.close()
    assert second.resolve(ADDING.epoch, "demo.add")(1, 1) == 2


PUBLIC_RULES = FunctionSnapshot.of(
    {
        "open": (
            "import os\n"
            "from os.path import join\n"
            "victim = 1\n"
            "def add(a, b):\n    return a + b\n"
            "def _helper():\n    return 'private'\n"
            "class Point:\n    def __init__(self, x):\n        self.x = x\n"
        ),
        "listed": (
            "from os.path import join\n"
            "__all__ = ['join', 'shown']\n"
            "def shown():\n    return 1\n"
            "def hidden():\n    return 2\n"
        ),
    }
)


@pytest.mark.parametrize(
    ("ref", "why"),
    [
        ("open.__setattr__", "names starting with '_' are private"),
        ("open._helper", "names starting with '_' are private"),
        ("open.join", "it is not defined in the module"),
        ("listed.hidden", "the module's __all__ does not list it"),
    ],
)
def test_only_a_module_s_public_functions_may_be_called(
    loaders: list[EpochModules], ref: str, why: str
) -> None:
    loader = loader_for(loaders, PUBLIC_RULES)
    with pytest.raises(NotPublic) as refused:
        loader.resolve(PUBLIC_RULES.epoch, ref)
    module, _, function = ref.partition(".")
    assert str(refused.value).startswith(
        f"{module}.{function} in function code epoch {PUBLIC_RULES.epoch!r} cannot be called: {why}"
    )


def test_functions_and_classes_defined_in_the_module_and_what_all_lists_may_be_called(
    loaders: list[EpochModules],
) -> None:
    loader = loader_for(loaders, PUBLIC_RULES)
    assert loader.resolve(PUBLIC_RULES.epoch, "open.add")(1, 2) == 3
    point: Any = loader.resolve(PUBLIC_RULES.epoch, "open.Point")(4)
    assert point.x == 4
    assert loader.resolve(PUBLIC_RULES.epoch, "listed.shown")() == 1
    assert loader.resolve(PUBLIC_RULES.epoch, "listed.join")("a", "b") == "a/b"  # opted in
    with pytest.raises(UnknownFunction):
        loader.resolve(PUBLIC_RULES.epoch, "open.print")  # builtins are not the module's
