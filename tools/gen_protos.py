"""Generate the betterproto2 modules for every `.proto` under `protos/`.

    python tools/gen_protos.py [OUT_DIR]          regenerate OUT_DIR in place
    python tools/gen_protos.py --check [OUT_DIR]  fail if OUT_DIR has drifted

OUT_DIR defaults to `blockx/_proto`. Both modes generate into a fresh
temporary directory first; `--check` then compares file by file, the default
mode makes OUT_DIR mirror the fresh output (stale modules are deleted). This
script never edits `protos/`.

Determinism: the betterproto2 plugin formats its output by piping it through
`ruff` (found on PATH, configured from the plugin's working directory), and it
decides which `__init__.py` files to emit by checking whether they exist
*relative to its working directory*. So protoc runs in an empty scratch
directory holding only the pinned ruff settings below, never in the checkout,
and with this interpreter's scripts directory (the locked ruff) first on PATH.
"""

from __future__ import annotations

import argparse
import filecmp
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
PROTOS_DIR = REPO_ROOT / "protos"
DEFAULT_OUT_DIR = REPO_ROOT / "blockx" / "_proto"

# google_protobuf_descriptors registers the file descriptors with protobuf, which
# grpclib's server reflection reads.
PLUGIN_OPTIONS = "client_generation=async,server_generation=async,google_protobuf_descriptors"
# Settings for the ruff that the plugin runs; kept equal to pyproject's.
PINNED_RUFF_TOML = 'line-length = 100\ntarget-version = "py311"\n'
# Written by Python when the generated code is imported; never generated.
IGNORED_NAMES = frozenset({"__pycache__"})


def proto_files(protos_dir: Path) -> list[Path]:
    files = sorted(protos_dir.rglob("*.proto"))
    if not files:
        sys.exit(f"gen_protos: no .proto files under {protos_dir}")
    return files


def generate(protos_dir: Path, out_dir: Path) -> None:
    """Run protoc with the betterproto2 plugin into the (empty) `out_dir`."""
    scripts_dir = Path(sys.executable).parent
    plugin = shutil.which("protoc-gen-python_betterproto2", path=scripts_dir)
    if plugin is None:
        sys.exit(f"gen_protos: protoc-gen-python_betterproto2 not found in {scripts_dir}")
    env = dict(os.environ)
    env["PATH"] = os.pathsep.join([str(scripts_dir), env.get("PATH", "")])
    with tempfile.TemporaryDirectory(prefix="gen_protos_cwd_") as scratch:
        Path(scratch, "ruff.toml").write_text(PINNED_RUFF_TOML)
        command = [
            sys.executable,
            "-m",
            "grpc_tools.protoc",
            f"--proto_path={protos_dir}",
            f"--plugin=protoc-gen-python_betterproto2={plugin}",
            f"--python_betterproto2_opt={PLUGIN_OPTIONS}",
            f"--python_betterproto2_out={out_dir}",
            *(str(path) for path in proto_files(protos_dir)),
        ]
        completed = subprocess.run(command, cwd=scratch, env=env, check=False)
    if completed.returncode != 0:
        sys.exit(f"gen_protos: protoc failed with exit status {completed.returncode}")


def relative_files(root: Path) -> set[Path]:
    return {
        path.relative_to(root)
        for path in root.rglob("*")
        if path.is_file() and IGNORED_NAMES.isdisjoint(path.relative_to(root).parts)
    }


def drift(fresh_dir: Path, out_dir: Path) -> list[str]:
    """Describe each file on which `out_dir` differs from `fresh_dir`."""
    fresh = relative_files(fresh_dir)
    existing = relative_files(out_dir) if out_dir.is_dir() else set()
    problems = [f"missing: {path}" for path in sorted(fresh - existing)]
    problems += [f"not generated (stale): {path}" for path in sorted(existing - fresh)]
    problems += [
        f"differs: {path}"
        for path in sorted(fresh & existing)
        if not filecmp.cmp(fresh_dir / path, out_dir / path, shallow=False)
    ]
    return problems


def mirror(fresh_dir: Path, out_dir: Path) -> None:
    """Make `out_dir` hold exactly the files of `fresh_dir`."""
    out_dir.mkdir(parents=True, exist_ok=True)
    fresh = relative_files(fresh_dir)
    for stale in relative_files(out_dir) - fresh:
        (out_dir / stale).unlink()
    for path in sorted(fresh):
        (out_dir / path).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(fresh_dir / path, out_dir / path)
    for directory in sorted(out_dir.rglob("*"), reverse=True):
        if directory.is_dir() and directory.name not in IGNORED_NAMES:
            remaining = [p for p in directory.iterdir() if p.name not in IGNORED_NAMES]
            if not remaining:
                shutil.rmtree(directory)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_dir", nargs="?", type=Path, default=DEFAULT_OUT_DIR)
    parser.add_argument("--check", action="store_true", help="compare instead of writing")
    parser.add_argument("--protos-dir", type=Path, default=PROTOS_DIR)
    args = parser.parse_args(argv)
    out_dir: Path = args.out_dir.resolve()
    protos_dir: Path = args.protos_dir.resolve()

    with tempfile.TemporaryDirectory(prefix="gen_protos_out_") as fresh:
        fresh_dir = Path(fresh)
        generate(protos_dir, fresh_dir)
        if args.check:
            problems = drift(fresh_dir, out_dir)
            if problems:
                print(f"Generated protobuf code in {out_dir} is out of date:", file=sys.stderr)
                for problem in problems:
                    print(f"  {problem}", file=sys.stderr)
                print("Regenerate with: nox -s protos -- --write", file=sys.stderr)
                return 1
            print(f"{out_dir}: up to date ({len(relative_files(fresh_dir))} files)")
            return 0
        mirror(fresh_dir, out_dir)
        print(f"{out_dir}: regenerated ({len(relative_files(fresh_dir))} files)")
        return 0


if __name__ == "__main__":
    sys.exit(main())
