"""Function code snapshots: one immutable epoch of module sources.

Owns the snapshot value, module-name rules, the content hash that names an
epoch, and the package convention the loader relies on. Pure: must never do
IO or read a clock.

Package convention: a module is a package exactly when some other module of
the snapshot lives under it (`pkg.mod` makes `pkg` a package, with empty
source if the snapshot has none for it, like a namespace directory). As in
Python, `pkg.__init__` names a package's own source: `source_of("pkg.__init__")`
answers only for packages, which is how the loader tells the two apart
without a second kind of request.
"""

from __future__ import annotations

import hashlib
import keyword
import re
import types
from collections.abc import Mapping

import attrs

from blockx.functions._errors import InvalidEpoch, InvalidModuleName, UnknownModule

_EPOCH_RE = re.compile(r"[!-~]{1,128}")
_INIT = "__init__"
EPOCH_HEX_DIGITS = 16


def is_valid_module_name(module: str) -> bool:
    """True if every dotted part is an identifier, not a keyword, and not `__init__`."""
    parts = module.split(".")
    return all(
        part.isidentifier() and not keyword.iskeyword(part) and part != _INIT for part in parts
    )


def content_epoch(modules: Mapping[str, str]) -> str:
    """The epoch naming this content: same modules and texts, same epoch, whatever the order."""
    digest = hashlib.sha256()
    for name in sorted(modules):
        # Length-prefixed fields: no two different snapshots frame to the same bytes.
        for field in (name.encode(), modules[name].encode()):
            digest.update(len(field).to_bytes(8, "big"))
            digest.update(field)
    return digest.hexdigest()[:EPOCH_HEX_DIGITS]


def _frozen_modules(modules: Mapping[str, str]) -> Mapping[str, str]:
    return types.MappingProxyType(dict(sorted(modules.items())))


def _package_names(modules: Mapping[str, str]) -> frozenset[str]:
    packages: set[str] = set()
    for name in modules:
        parts = name.split(".")
        packages.update(".".join(parts[:end]) for end in range(1, len(parts)))
    return frozenset(packages)


def _check_epoch(_instance: object, _attribute: object, epoch: str) -> None:
    if not _EPOCH_RE.fullmatch(epoch):
        raise InvalidEpoch(epoch=epoch)


def _check_module_names(_instance: object, _attribute: object, modules: Mapping[str, str]) -> None:
    for name in modules:
        if not is_valid_module_name(name):
            raise InvalidModuleName(module=name, origin="a function code snapshot")


@attrs.frozen(kw_only=True)
class FunctionSnapshot:
    """One epoch of function code: dotted module name -> source text.

    The epoch is usually `content_epoch(modules)`, but a source may name its
    epochs otherwise; the snapshot only requires that the name is usable.
    """

    epoch: str = attrs.field(validator=_check_epoch)
    modules: Mapping[str, str] = attrs.field(
        converter=_frozen_modules, validator=_check_module_names, hash=False
    )
    _packages: frozenset[str] = attrs.field(
        init=False,
        eq=False,
        repr=False,
        default=attrs.Factory(lambda self: _package_names(self.modules), takes_self=True),
    )

    @classmethod
    def of(cls, modules: Mapping[str, str]) -> FunctionSnapshot:
        """A snapshot whose epoch is its content hash."""
        return cls(epoch=content_epoch(modules), modules=modules)

    def is_package(self, module: str) -> bool:
        return module in self._packages

    def has_module(self, module: str) -> bool:
        return module in self.modules or module in self._packages

    def source_of(self, module: str) -> str:
        """The source text of `module`; `pkg.__init__` answers only for a package `pkg`."""
        if module.endswith("." + _INIT):
            package = module.removesuffix("." + _INIT)
            if package in self._packages:
                return self.modules.get(package, "")
        elif module in self.modules:
            return self.modules[module]
        elif module in self._packages:
            return ""
        raise UnknownModule(epoch=self.epoch, module=module)
