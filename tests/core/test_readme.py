"""The README is a front page whose two commands are the ones the project runs (CI calls
the test command), and every command and link the docs show is real."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest

from blockx import cli

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


# --- the commands and links the docs show ------------------------------------------------

DOCS = REPO / "docs"
PAGES = [REPO / "README.md", *sorted(DOCS.glob("*.md"))]
MAX_README_LINES = 250


def sh_blocks(page: Path) -> list[str]:
    """The shell blocks of a Markdown page, continuation lines joined."""
    blocks = re.findall(r"^ *```sh\n(.*?)^ *```", page.read_text(encoding="utf-8"), re.M | re.S)
    return [re.sub(r"\\\n\s*", " ", block) for block in blocks]


def shell_commands(block: str) -> Iterator[list[str]]:
    """The words of each simple command in a shell block: lists, pipelines and `$(...)`
    split into their commands, redirections and comments dropped. A quotation left open
    goes on with the next line."""
    pending = ""
    for line in block.splitlines():
        pending += line + "\n"
        lexer = shlex.shlex(pending, posix=True, punctuation_chars=True)
        lexer.whitespace_split = True
        try:
            tokens = list(lexer)
        except ValueError:  # no closing quotation yet
            continue
        pending = ""
        words: list[str] = []
        redirected = False
        for token in [*tokens, ";"]:
            if redirected:
                redirected = False
            elif token[0] in "<>":
                redirected = True  # the next word is the redirection's target
            elif set(token) <= set(";&|()"):
                if words:
                    yield words
                words = []
            else:
                words.append(token)


def blockx_commands(page: Path) -> list[list[str]]:
    """The arguments of every `blockx` command a page's shell blocks show, run as
    `uv run blockx`, `blockx` or `python -m blockx`, with variables set before it."""
    commands = []
    for block in sh_blocks(page):
        for command in shell_commands(block):
            words = list(command)
            while words and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=.*", words[0]):
                del words[0]  # VAR=value before the command
            if words[:2] == ["uv", "run"]:
                del words[:2]
            if words[:3] == ["python", "-m", "blockx"]:
                words[:3] = ["blockx"]
            if words[:1] == ["blockx"]:
                commands.append(words[1:])
    return commands


def test_the_pages_show_blockx_commands() -> None:
    shown = {page.name: len(blockx_commands(page)) for page in PAGES}
    assert shown["README.md"] >= 10
    assert sum(shown.values()) >= 40


@pytest.mark.parametrize("page", PAGES, ids=lambda page: page.name)
def test_every_blockx_command_a_page_shows_parses(page: Path) -> None:
    parser = cli._parser()
    for argv in blockx_commands(page):
        try:
            parser.parse_args(argv)
        except SystemExit as exited:  # argparse's way of refusing, and of ending --help
            if exited.code != 0:
                pytest.fail(f"{page.name}: `blockx {shlex.join(argv)}` does not parse")


@pytest.mark.parametrize("page", PAGES, ids=lambda page: page.name)
def test_every_relative_link_of_a_page_names_a_file_that_exists(page: Path) -> None:
    text = page.read_text(encoding="utf-8")
    for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text):
        if "://" in target:
            continue
        assert (page.parent / target).exists(), f"{page.name} links to {target}, which is missing"


def test_the_readme_is_a_front_page() -> None:
    lines = (REPO / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= MAX_README_LINES
    for page in sorted(DOCS.glob("*.md")):
        assert f"(docs/{page.name})" in "\n".join(lines), f"the README's map misses {page.name}"


def test_the_code_map_names_every_package() -> None:
    architecture = (DOCS / "architecture.md").read_text(encoding="utf-8")
    code_map = architecture.split("## Code map", 1)[1]
    generated = REPO / "blockx" / "_proto"
    packages = sorted(
        init.parent.relative_to(REPO)
        for init in (REPO / "blockx").rglob("__init__.py")
        if generated not in init.parents
    )
    assert len(packages) >= 20
    missing = [str(package) for package in packages if f"`{package}/`" not in code_map]
    assert missing == [], f"docs/architecture.md's code map misses {missing}"
