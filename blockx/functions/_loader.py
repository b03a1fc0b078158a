"""Importing function code inside an executor process, one package per epoch.

Owns turning module source text for (epoch, module) into module objects and
resolving `module.function` references to callables. Each epoch is its own
top-level package in `sys.modules` under a mangled name, so two epochs load
side by side without sharing a module: `demo` of epoch A and `demo` of epoch
B are different objects. Relative imports inside function code
(`from . import helpers`) resolve within the same epoch; absolute imports
(`import helpers`) do not reach function code, only installed packages.

Source text comes only through `fetch(epoch, module)`, which returns the text
and raises `UnknownModule` for a name the epoch does not have (any other
error propagates). Package-ness follows the snapshot's convention:
`fetch(epoch, "pkg.__init__")` succeeds exactly when `pkg` is a package.
Plain Python: must never import trio, and never read function code from
anywhere but `fetch`.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import inspect
import itertools
import linecache
import sys
import types
from collections.abc import Callable, Sequence
from typing import cast

import attrs

from blockx.errors import BlockxError
from blockx.functions._errors import (
    FunctionCodeSyntaxError,
    InvalidFunctionRef,
    ModuleImportFailed,
    NotCallable,
    NotPublic,
    UnknownFunction,
    UnknownModule,
)
from blockx.functions._snapshot import is_valid_module_name

Fetch = Callable[[str, str], str]

# Distinguishes the packages of two EpochModules in one process (tests).
_INSTANCES = itertools.count()


def _mangle(epoch: str) -> str:
    # An alphanumeric epoch (the content hashes) is used as is; anything else is
    # hex-encoded behind a leading underscore, which no alphanumeric epoch has.
    if epoch.isascii() and epoch.isalnum():
        return epoch
    return "_" + epoch.encode().hex()


@attrs.frozen(kw_only=True)
class _ModuleCode:
    epoch: str
    module: str
    text: str
    is_package: bool
    filename: str


class EpochModules:
    """Module objects of every epoch this executor has run code of.

    Modules are cached per epoch (in `sys.modules`) until `forget(epoch)`.
    `close()` forgets every epoch and uninstalls the import hook.
    """

    def __init__(self, fetch: Fetch) -> None:
        self._fetch = fetch
        self._prefix = f"_blockx{next(_INSTANCES)}_epoch_"
        self._roots: dict[str, str] = {}  # root package name -> epoch
        self._code: dict[str, _ModuleCode] = {}  # full module name -> its code
        self._finder = _EpochFinder(self)
        sys.meta_path.insert(0, self._finder)

    def __enter__(self) -> EpochModules:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def package_name(self, epoch: str) -> str:
        """The name of `epoch`'s package in `sys.modules`."""
        return self._prefix + _mangle(epoch)

    def loaded_epochs(self) -> list[str]:
        return sorted(self._roots.values())

    def resolve(self, epoch: str, ref: str) -> Callable[..., object]:
        """The callable `module.function` of `epoch`, importing the module if needed.

        Only a module's public functions may be called: a name without a leading
        underscore, and either listed in the module's `__all__` (its opt-in for
        anything, an imported name included) or, without `__all__`, defined in the
        module itself. So a task can never reach a module's internals
        (`module.__setattr__`), builtins or what the module imported (`os.system`).
        """
        module_name, dot, function = ref.rpartition(".")
        if not dot or not is_valid_module_name(module_name) or not function.isidentifier():
            raise InvalidFunctionRef(ref=ref)
        if function.startswith("_"):
            raise NotPublic(
                epoch=epoch,
                module=module_name,
                function=function,
                why="names starting with '_' are private",
            )
        module = self.module(epoch, module_name)
        try:
            value = inspect.getattr_static(module, function)
        except AttributeError:
            raise UnknownFunction(epoch=epoch, module=module_name, function=function) from None
        if not callable(value):
            raise NotCallable(
                epoch=epoch, module=module_name, function=function, type_name=type(value).__name__
            )
        exported = getattr(module, "__all__", None)
        if exported is not None:
            if function not in exported:
                raise NotPublic(
                    epoch=epoch,
                    module=module_name,
                    function=function,
                    why="the module's __all__ does not list it",
                )
        elif getattr(value, "__module__", None) != module.__name__:
            raise NotPublic(
                epoch=epoch,
                module=module_name,
                function=function,
                why="it is not defined in the module (list it in the module's __all__ to "
                "allow an imported name)",
            )
        return cast("Callable[..., object]", value)

    def module(self, epoch: str, module: str) -> types.ModuleType:
        """The module object of `module` in `epoch`.

        Blockx errors (the typed ones here, and any that `fetch` raises) propagate
        unchanged; any other exception while importing becomes `ModuleImportFailed`.
        """
        if not is_valid_module_name(module):
            raise UnknownModule(epoch=epoch, module=module)
        root = self._ensure_root(epoch)
        full = f"{root}.{module}"
        try:
            return importlib.import_module(full)
        except BlockxError:
            raise
        except ModuleNotFoundError as error:
            missing = error.name or ""
            if missing.startswith(root + ".") and (full + ".").startswith(missing + "."):
                raise UnknownModule(epoch=epoch, module=module) from error
            raise ModuleImportFailed(
                epoch=epoch, module=module, error=self._readable(error, root)
            ) from error
        except Exception as error:
            raise ModuleImportFailed(
                epoch=epoch, module=module, error=self._readable(error, root)
            ) from error

    def forget(self, epoch: str) -> None:
        """Drop every module of `epoch` from `sys.modules`; later use fetches again.

        Call it only when no call of `epoch` is running: function objects already
        resolved keep working, but an import they run later finds no package.
        """
        root = self.package_name(epoch)
        if self._roots.pop(root, None) is None:
            return
        for name in [n for n in sys.modules if n == root or n.startswith(root + ".")]:
            del sys.modules[name]
        for name in [n for n in self._code if n == root or n.startswith(root + ".")]:
            linecache.cache.pop(self._code.pop(name).filename, None)

    def close(self) -> None:
        for epoch in list(self._roots.values()):
            self.forget(epoch)
        if self._finder in sys.meta_path:
            sys.meta_path.remove(self._finder)

    def _ensure_root(self, epoch: str) -> str:
        root = self.package_name(epoch)
        if root not in self._roots:
            self._roots[root] = epoch
            self._code[root] = _ModuleCode(
                epoch=epoch,
                module="",
                text="",
                is_package=True,
                filename=f"<blockx epoch {epoch}>/__init__.py",
            )
        return root

    def _code_of(self, fullname: str) -> _ModuleCode | None:
        """The code of `fullname` (fetched once), or None if it is not ours or does not exist."""
        known = self._code.get(fullname)
        if known is not None:
            return known
        root, dot, module = fullname.partition(".")
        epoch = self._roots.get(root)
        if epoch is None or not dot:
            return None
        try:
            text = self._fetch(epoch, module + ".__init__")
            is_package = True
        except UnknownModule:
            try:
                text = self._fetch(epoch, module)
                is_package = False
            except UnknownModule:
                return None
        path = module.replace(".", "/") + ("/__init__.py" if is_package else ".py")
        code = _ModuleCode(
            epoch=epoch,
            module=module,
            text=text,
            is_package=is_package,
            filename=f"<blockx epoch {epoch}>/{path}",
        )
        self._code[fullname] = code
        return code

    def _readable(self, error: BaseException, root: str) -> str:
        # Users wrote `helpers`, not the mangled `_blockx0_epoch_<epoch>.helpers`.
        text = str(error).replace(root + ".", "").replace(root, f"<epoch {self._roots[root]}>")
        return f"{type(error).__name__}: {text}"


class _EpochFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """The import hook: answers only for names inside its owner's epoch packages."""

    def __init__(self, owner: EpochModules) -> None:
        self._owner = owner

    def find_spec(
        self,
        fullname: str,
        path: Sequence[str] | None,
        target: types.ModuleType | None = None,
    ) -> importlib.machinery.ModuleSpec | None:
        code = self._owner._code_of(fullname)
        if code is None:
            return None
        return importlib.machinery.ModuleSpec(
            fullname, self, origin=code.filename, is_package=code.is_package
        )

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType | None:
        return None  # the default module object

    def exec_module(self, module: types.ModuleType) -> None:
        code = self._owner._code_of(module.__name__)
        assert code is not None, f"{module.__name__} was found by this finder"
        try:
            compiled = compile(code.text, code.filename, "exec", dont_inherit=True)
        except (SyntaxError, ValueError) as error:  # ValueError: NUL bytes on 3.11
            line = error.lineno if isinstance(error, SyntaxError) else None
            detail = error.msg if isinstance(error, SyntaxError) else str(error)
            raise FunctionCodeSyntaxError(
                epoch=code.epoch, module=code.module, line=line, detail=detail
            ) from error
        # Tracebacks and `inspect.getsource` show function code, not "??"; no
        # mtime, so `linecache.checkcache` never drops it.
        linecache.cache[code.filename] = (
            len(code.text),
            None,
            code.text.splitlines(keepends=True),
            code.filename,
        )
        exec(compiled, module.__dict__)

    def get_source(self, fullname: str) -> str | None:
        code = self._owner._code_of(fullname)
        return None if code is None else code.text
