"""Bundles: a directory of Parquet files and the manifest that says what they hold.

A bundle is `manifest.json` plus the Parquet files it lists. The manifest
holds the format (`FORMAT`), the task that wrote it, the schema, and each
file's row count, size and SHA-256; `verify_bundle` checks all of them. A
bundle is written whole or not at all (`write_bundle`): its files go into a
temporary directory beside the target, are flushed to disk with the
directory, and the directory is renamed into place. A reader therefore finds
either no bundle or a whole one. Writing over an existing bundle with the
same content leaves it as it is (a task run again); other content replaces
it, the old one moved aside first, so the path never holds two.

Blocking: callers run these on a worker thread. pyarrow is imported by the
first bundle read or written, not by the worker's start.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final

FORMAT: Final = "blockx-bundle/1"
MANIFEST: Final = "manifest.json"
_CHUNK: Final = 1 << 20


class BundleError(Exception):
    """A bundle cannot be written, or what is on disk is not a whole bundle."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


def write_bundle(
    path: str | os.PathLike[str],
    task_id: str,
    rows: Sequence[dict[str, Any]],
    *,
    rows_per_file: int = 100_000,
) -> dict[str, Any]:
    """Write `rows` (objects of column values) as the bundle at `path`; its manifest.

    `BundleError` when the rows have no common Parquet schema; OSError from the disk.
    """
    import pyarrow as pa  # noqa: PLC0415 - see the module docstring

    target = Path(path)
    try:
        table = pa.Table.from_pylist(list(rows))
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError) as error:
        raise BundleError(f"the rows have no common Parquet schema: {error}") from error
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = target.parent / f".{target.name}.tmp-{uuid.uuid4().hex}"
    staging.mkdir()
    try:
        manifest = _write_files(staging, task_id, table, rows_per_file)
        _fsync_dir(staging)
        if _same_content(target, manifest):
            shutil.rmtree(staging)
            return read_manifest(target)
        _move_into_place(staging, target)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return manifest


def _write_files(staging: Path, task_id: str, table: Any, rows_per_file: int) -> dict[str, Any]:
    import pyarrow.parquet as pq  # noqa: PLC0415

    files = []
    count = max(1, -(-table.num_rows // rows_per_file))
    for index in range(count):
        part = table.slice(index * rows_per_file, rows_per_file)
        name = f"part-{index:05d}.parquet"
        pq.write_table(part, staging / name)
        files.append(_file_entry(staging / name, name, part.num_rows))
    manifest = {
        "format": FORMAT,
        "task_id": task_id,
        "rows": table.num_rows,
        "schema": [{"name": f.name, "type": str(f.type)} for f in table.schema],
        "files": files,
    }
    _write_durably(staging / MANIFEST, json.dumps(manifest, indent=1).encode())
    return manifest


def _file_entry(file: Path, name: str, rows: int) -> dict[str, Any]:
    with open(file, "rb+") as handle:
        os.fsync(handle.fileno())
    return {"path": name, "rows": rows, "bytes": file.stat().st_size, "sha256": _sha256(file)}


def _same_content(target: Path, manifest: dict[str, Any]) -> bool:
    """Whether the bundle at `target` holds what `manifest` describes (its files and rows)."""
    try:
        current = read_manifest(target)
    except (BundleError, OSError):
        return False
    keys = ("format", "rows", "schema", "files")
    return all(current.get(key) == manifest[key] for key in keys)


def _move_into_place(staging: Path, target: Path) -> None:
    parent = target.parent
    if target.exists():
        aside = parent / f".{target.name}.replaced-{uuid.uuid4().hex}"
        os.rename(target, aside)
        os.rename(staging, target)
        _fsync_dir(parent)
        shutil.rmtree(aside, ignore_errors=True)
    else:
        os.rename(staging, target)
        _fsync_dir(parent)


def read_manifest(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The manifest of the bundle at `path`; `BundleError` naming what is wrong."""
    file = Path(path) / MANIFEST
    try:
        manifest = json.loads(file.read_bytes())
    except FileNotFoundError as error:
        raise BundleError(f"{path}: not a bundle (no {MANIFEST})") from error
    except ValueError as error:
        raise BundleError(f"{file}: not JSON ({error})") from error
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise BundleError(f"{file}: not a {FORMAT} manifest")
    files = manifest.get("files")
    if not isinstance(files, list) or not all(_is_entry(entry) for entry in files):
        raise BundleError(
            f"{file}: its files must be a list of {{path, rows, bytes, sha256}}, each path "
            "a file name in the bundle"
        )
    return manifest


def _is_entry(entry: object) -> bool:
    if not isinstance(entry, dict):
        return False
    name, rows, size, digest = (entry.get(k) for k in ("path", "rows", "bytes", "sha256"))
    return (
        isinstance(name, str)
        and name not in ("", ".", "..", MANIFEST)
        and "/" not in name
        and "\\" not in name
        and type(rows) is int
        and type(size) is int
        and isinstance(digest, str)
    )


def open_verified(path: str | os.PathLike[str], entry: dict[str, Any]) -> Any:
    """A `pyarrow.parquet.ParquetFile` of one file of a bundle, read whole into memory and
    checked against its manifest `entry` (size, checksum, rows) first: what is read is what
    the checksum covered."""
    import pyarrow as pa  # noqa: PLC0415
    import pyarrow.parquet as pq  # noqa: PLC0415

    file = Path(path) / entry["path"]
    try:
        data = file.read_bytes()
    except FileNotFoundError as error:
        raise BundleError(f"{file}: listed in the manifest but missing") from error
    if len(data) != entry["bytes"] or hashlib.sha256(data).hexdigest() != entry["sha256"]:
        raise BundleError(f"{file}: its content does not match the manifest's checksum")
    try:
        parquet = pq.ParquetFile(pa.BufferReader(data))
    except (pa.ArrowException, OSError) as error:
        raise BundleError(f"{file}: not a Parquet file ({error})") from error
    if parquet.metadata.num_rows != entry["rows"]:
        raise BundleError(f"{file}: its row count does not match the manifest")
    return parquet


def verify_bundle(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The manifest, once every file it lists is there with its size, checksum and rows."""
    manifest = read_manifest(path)
    for entry in manifest["files"]:
        open_verified(path, entry)
    return manifest


def _sha256(file: Path) -> str:
    digest = hashlib.sha256()
    with open(file, "rb") as handle:
        while chunk := handle.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def _write_durably(file: Path, data: bytes) -> None:
    with open(file, "wb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())


def _fsync_dir(directory: Path) -> None:
    descriptor = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)
