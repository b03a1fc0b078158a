"""How `blockx autoworker` turns its flags and `module:function` names into options."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from blockx.autoworker import Capability
from blockx.autoworker.command import _options, hub_client
from blockx.cli import _parser
from blockx.settings import FlagError


def parse(
    *argv: str, hub: str = "http://127.0.0.1:8090", credential: str = "unused"
) -> argparse.Namespace:
    base = ["autoworker", "--hub", hub, "--queue", "text"]
    return _parser().parse_args([*base, "--credential-file", credential, *argv])


def test_a_function_declared_with_handles_keeps_its_capability() -> None:
    options = _options(parse("examples.autoworker_handlers:normalize"))
    [handler] = options.handlers
    assert handler.capability == Capability(
        handler="text.normalize", handler_version="v1", payload_version="v1"
    )


def test_an_undeclared_function_is_named_by_its_module_and_the_version_flags() -> None:
    args = parse("--handler-version", "v7", "--payload-version", "p2", "json:dumps")
    [handler] = _options(args).handlers
    assert handler.capability == Capability(
        handler="json.dumps", handler_version="v7", payload_version="p2"
    )


def test_a_bad_option_names_its_flag() -> None:
    with pytest.raises(FlagError) as raised:
        _options(parse("--capacity", "0", "json:dumps"))
    assert raised.value.field == "--capacity"


def test_a_name_that_is_not_callable_is_refused() -> None:
    with pytest.raises(FlagError) as raised:
        _options(parse("json:__doc__"))
    assert raised.value.field == "json:__doc__"
    assert raised.value.allowed == "a function"


@pytest.mark.parametrize(
    ("hub", "allowed"),
    [
        ("wss://hub.internal", "must be a readable file (No such file or directory)"),
        ("ws://hub.internal", "only for an https or wss url"),
    ],
)
def test_a_ca_file_the_client_cannot_use_names_the_flag(
    tmp_path: Path, hub: str, allowed: str
) -> None:
    (tmp_path / "worker.credential").write_text("bxc_x\n")
    missing = str(tmp_path / "ca.pem")
    args = parse(
        "--ca-file", missing, "json:dumps", hub=hub, credential=str(tmp_path / "worker.credential")
    )
    with pytest.raises(FlagError) as raised:
        hub_client(args)
    assert (raised.value.field, raised.value.value, raised.value.allowed) == (
        "--ca-file",
        missing,
        allowed,
    )
