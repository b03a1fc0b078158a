"""The README's two commands are the ones the project runs: CI calls the test command."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def quick_start_commands() -> list[str]:
    """The commands of the README's quick-start block, comments dropped."""
    readme = (REPO / "README.md").read_text()
    block = re.search(r"## Quick start\n.*?```sh\n(.*?)```", readme, re.S)
    assert block is not None, "the README has no quick-start sh block"
    return [line.split("#", 1)[0].strip() for line in block[1].splitlines() if line.strip()]


def test_the_quick_start_has_a_serve_command_and_a_test_command() -> None:
    serve, test = quick_start_commands()
    assert serve == "uv sync --compile-bytecode && uv run blockx serve"
    assert test == "tools/test"


def test_ci_runs_the_readmes_test_command_and_it_is_executable() -> None:
    _, test = quick_start_commands()
    ci_lines = [line.strip() for line in (REPO / ".ci" / "run").read_text().splitlines()]
    assert any(line.split("<")[0].strip() == test for line in ci_lines), ci_lines
    assert os.access(REPO / test, os.X_OK)


def test_the_test_command_runs_the_whole_suite_from_the_lock_file() -> None:
    script = (REPO / "tools" / "test").read_text()
    assert 'exec uv run --locked pytest "$@"' in script
    for package in ("redis-server", "etcd-server", "postgresql", "chromium"):
        assert package in script


def test_the_console_script_runs_the_command_line() -> None:
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    assert pyproject["project"]["scripts"] == {"blockx": "blockx.__main__:main"}
    script = shutil.which("blockx", path=str(Path(sys.executable).parent))
    assert script is not None, "uv sync installs the blockx script beside the interpreter"
    done = subprocess.run(
        [script, "--help"], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("usage: blockx ")
