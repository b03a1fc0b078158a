"""Bundles on disk: written whole or not at all, verified by their manifest; bundle_write
and bundle_scan."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from blockx.calls import decode_args
from blockx.phases.builders import BuilderFailed, BundleScanBuilder
from blockx.phases.bundles import (
    FORMAT,
    MANIFEST,
    BundleError,
    read_manifest,
    verify_bundle,
    write_bundle,
)
from blockx.phases.plugins import BundleWritePlugin, PluginFailed
from blockx.slots import PluginResult
from tests.plugin_runs import run_plugin, run_stream

ROWS = [{"id": index, "word": f"w{index}", "score": index / 2} for index in range(10)]


def read_rows(path: Path) -> list[dict[str, Any]]:
    manifest = verify_bundle(path)
    rows: list[dict[str, Any]] = []
    for entry in manifest["files"]:
        rows.extend(pq.read_table(path / entry["path"]).to_pylist())
    return rows


def test_a_bundle_holds_its_rows_in_files_its_manifest_lists_and_verifies(tmp_path: Path) -> None:
    path = tmp_path / "out" / "b1"
    manifest = write_bundle(path, "t1", ROWS, rows_per_file=4)
    assert manifest == read_manifest(path) == verify_bundle(path)
    assert (manifest["format"], manifest["task_id"], manifest["rows"]) == (FORMAT, "t1", 10)
    assert [(f["path"], f["rows"]) for f in manifest["files"]] == [
        ("part-00000.parquet", 4),
        ("part-00001.parquet", 4),
        ("part-00002.parquet", 2),
    ]
    assert manifest["schema"] == [
        {"name": "id", "type": "int64"},
        {"name": "word", "type": "string"},
        {"name": "score", "type": "double"},
    ]
    assert read_rows(path) == ROWS
    assert sorted(p.name for p in path.parent.iterdir()) == ["b1"]  # no staging left


def test_writing_the_same_rows_again_leaves_the_bundle_as_it_was(tmp_path: Path) -> None:
    path = tmp_path / "b1"
    write_bundle(path, "first", ROWS)
    before = {p.name: p.stat().st_mtime_ns for p in path.iterdir()}
    again = write_bundle(path, "retry", ROWS)
    assert again["task_id"] == "first"
    assert {p.name: p.stat().st_mtime_ns for p in path.iterdir()} == before


def test_other_rows_replace_the_bundle_and_leave_one(tmp_path: Path) -> None:
    path = tmp_path / "b1"
    write_bundle(path, "first", ROWS, rows_per_file=3)
    write_bundle(path, "second", ROWS[:2])
    assert read_manifest(path)["task_id"] == "second"
    assert read_rows(path) == ROWS[:2]
    assert sorted(p.name for p in path.iterdir()) == [MANIFEST, "part-00000.parquet"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["b1"]


def test_rows_without_a_common_schema_write_nothing(tmp_path: Path) -> None:
    with pytest.raises(BundleError, match="no common Parquet schema"):
        write_bundle(tmp_path / "b1", "t1", [{"id": 1}, {"id": "x"}])
    assert list(tmp_path.iterdir()) == []


def test_a_damaged_bundle_fails_verification_naming_the_file(tmp_path: Path) -> None:
    path = tmp_path / "b1"
    write_bundle(path, "t1", ROWS)
    part = path / "part-00000.parquet"
    data = bytearray(part.read_bytes())
    data[len(data) // 2] ^= 0xFF
    part.write_bytes(bytes(data))
    with pytest.raises(BundleError, match=r"part-00000\.parquet: its content does not match"):
        verify_bundle(path)
    os.remove(part)
    with pytest.raises(BundleError, match="listed in the manifest but missing"):
        verify_bundle(path)
    with pytest.raises(BundleError, match="not a bundle"):
        read_manifest(tmp_path)
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / MANIFEST).write_text(json.dumps({"format": "x"}))
    with pytest.raises(BundleError, match="not a blockx-bundle/1 manifest"):
        read_manifest(tmp_path / "other")


async def write(config: dict[str, Any], values: list[object]) -> PluginResult:
    return await run_plugin(BundleWritePlugin(), config, values)


async def test_bundle_write_writes_a_tasks_outputs_as_a_bundle(tmp_path: Path) -> None:
    path = tmp_path / "bundles" / "out"
    result = await write({"path": str(path), "rows_per_file": 5}, list(ROWS))
    assert (result.ok, result.records_written, result.detail) == (True, 10, str(path))
    assert read_rows(path) == ROWS


@pytest.mark.parametrize(
    ("config", "values", "message"),
    [
        ({}, [{"id": 1}], "bundle_write: config_json.path is required"),
        ({"path": "x", "rows_per_file": 0}, [{"id": 1}], "rows_per_file must be an integer"),
        ({"path": "x", "mode": 1}, [{"id": 1}], "mode"),
        ({"path": "x"}, [{"id": 1}, 7], "bundle_write: output 1 must be an object"),
        ({"path": "x"}, [[{"id": 1}, 7]], "bundle_write: output 0 item 1 must be an object"),
        ({"path": "x"}, [{"id": 1}, {"id": "a"}], "bundle_write: the rows have no common"),
    ],
)
async def test_bundle_write_refuses_what_it_cannot_write_naming_it(
    tmp_path: Path, config: dict[str, Any], values: list[object], message: str
) -> None:
    if "path" in config:
        config = {**config, "path": str(tmp_path / config["path"])}
    with pytest.raises(PluginFailed) as raised:
        await write(config, values)
    assert message in raised.value.message
    assert list(tmp_path.iterdir()) == []


def test_a_manifest_whose_files_escape_the_bundle_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "b1"
    write_bundle(path, "t1", ROWS)
    manifest = json.loads((path / MANIFEST).read_text())
    manifest["files"][0]["path"] = "../elsewhere.parquet"
    (path / MANIFEST).write_text(json.dumps(manifest))
    with pytest.raises(BundleError, match="each path a file name in the bundle"):
        read_manifest(path)


async def test_bundle_scan_streams_every_file_s_rows_into_calls_in_order(tmp_path: Path) -> None:
    path = tmp_path / "b1"
    write_bundle(path, "t1", ROWS, rows_per_file=3)  # 4 files: calls span them
    config = {"path": str(path), "function": "m.f", "rows_per_call": 4, "columns": ["word", "id"]}
    batches = await run_stream(BundleScanBuilder(), config)
    calls = [call for batch in batches for call in batch]
    assert [call.call_id for call in calls] == [str(i) for i in range(len(calls))]
    rows = [row for call in calls for row in decode_args(call.args)[0][0]]
    assert rows == [{"word": row["word"], "id": row["id"]} for row in ROWS]
    assert all(len(decode_args(call.args)[0][0]) <= 4 for call in calls)


async def test_bundle_to_bundle_the_scanned_rows_written_again_are_the_same(
    tmp_path: Path,
) -> None:
    source, target = tmp_path / "in", tmp_path / "out"
    write_bundle(source, "t0", ROWS, rows_per_file=4)
    config = {"path": str(source), "function": "m.f", "rows_per_call": 3}
    batches = await run_stream(BundleScanBuilder(), config)
    outputs = [decode_args(call.args)[0][0] for batch in batches for call in batch]
    result = await run_plugin(BundleWritePlugin(), {"path": str(target)}, outputs)
    assert result.records_written == len(ROWS)
    assert read_rows(target) == ROWS


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        ("flip", "part-00001.parquet: its content does not match the manifest's checksum"),
        ("remove", "part-00001.parquet: listed in the manifest but missing"),
        ("manifest", "not a bundle (no manifest.json)"),
    ],
)
async def test_bundle_scan_fails_on_a_damaged_bundle_naming_the_file(
    tmp_path: Path, damage: str, message: str
) -> None:
    path = tmp_path / "b1"
    write_bundle(path, "t1", ROWS, rows_per_file=5)
    part = path / "part-00001.parquet"
    if damage == "flip":
        data = bytearray(part.read_bytes())
        data[len(data) // 2] ^= 0xFF
        part.write_bytes(bytes(data))
    elif damage == "remove":
        part.unlink()
    else:
        (path / MANIFEST).unlink()
    with pytest.raises(BuilderFailed) as raised:
        await run_stream(BundleScanBuilder(), {"path": str(path), "function": "m.f"})
    assert message in raised.value.message
    assert raised.value.message.startswith("bundle_scan: ")


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"function": "m.f"}, "bundle_scan: config_json.path is required"),
        ({"path": "b1"}, "bundle_scan: config_json.function is required"),
        ({"path": "b1", "function": "m.f", "columns": []}, "columns must be a non-empty list"),
        ({"path": "b1", "function": "m.f", "columns": ["nope"]}, "names a column the bundle"),
    ],
)
async def test_bundle_scan_refuses_a_bad_config_naming_it(
    tmp_path: Path, config: dict[str, Any], message: str
) -> None:
    write_bundle(tmp_path / "b1", "t1", ROWS)
    if "path" in config:
        config = {**config, "path": str(tmp_path / config["path"])}
    with pytest.raises(BuilderFailed) as raised:
        await run_stream(BundleScanBuilder(), config)
    assert message in raised.value.message
