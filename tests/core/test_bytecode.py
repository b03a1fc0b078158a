"""blockx caches its own bytecode when Python is told not to (`cache_own_bytecode`)."""

from __future__ import annotations

import compileall
import sys
from pathlib import Path

import pytest

import blockx
from blockx.process.lifecycle import cache_own_bytecode


def package(tmp_path: Path) -> Path:
    root = tmp_path / "pkg"
    (root / "sub").mkdir(parents=True)
    (root / "__init__.py").write_text("")
    (root / "sub" / "mod.py").write_text("VALUE = 1\n")
    return root


def cached(root: Path) -> list[str]:
    return sorted(path.name.partition(".")[0] for path in root.rglob("*.pyc"))


def test_without_bytecode_writing_the_tree_is_compiled_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = package(tmp_path)
    monkeypatch.setattr(sys, "dont_write_bytecode", True)
    cache_own_bytecode(str(root))
    assert cached(root) == ["__init__", "mod"]
    written = {path: path.stat().st_mtime_ns for path in root.rglob("*.pyc")}
    cache_own_bytecode(str(root))  # current: nothing is written again
    assert {path: path.stat().st_mtime_ns for path in root.rglob("*.pyc")} == written


def test_when_python_writes_bytecode_itself_nothing_is_done(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = package(tmp_path)
    monkeypatch.setattr(sys, "dont_write_bytecode", False)
    cache_own_bytecode(str(root))
    assert cached(root) == []


def test_by_default_the_whole_blockx_package_is_compiled(monkeypatch: pytest.MonkeyPatch) -> None:
    compiled: list[str] = []

    def compile_dir(root: str, **_: object) -> bool:
        compiled.append(root)
        return True

    monkeypatch.setattr(sys, "dont_write_bytecode", True)
    monkeypatch.setattr(compileall, "compile_dir", compile_dir)
    cache_own_bytecode()
    assert compiled == [str(Path(blockx.__file__).parent)]
