"""How `blockx autoworker` turns its flags and `module:function` names into options."""

from __future__ import annotations

import argparse

import pytest

from blockx.autoworker import Capability
from blockx.autoworker.command import _options
from blockx.cli import _parser
from blockx.settings import FlagError


def parse(*argv: str) -> argparse.Namespace:
    base = ["autoworker", "--hub", "http://127.0.0.1:8090", "--queue", "text"]
    return _parser().parse_args([*base, "--credential-file", "unused", *argv])


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
