"""The protocol's JSON rules: which texts pass, what a refusal names, and exact writing."""

from __future__ import annotations

import decimal
import json
import time
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from blockx.hubwire import (
    MAX_INT,
    MAX_JSON_BYTES,
    MAX_NESTING,
    MIN_INT,
    InvalidJson,
    JsonTooLarge,
    RawJson,
    array_items,
    compact,
    dumps,
    object_members,
    parse_json,
)


def nested(depth: int, inner: str = "1") -> str:
    return "[" * depth + inner + "]" * depth


@pytest.mark.parametrize(
    ("text", "path", "found"),
    [
        ('{"x": NaN}', "payload.x", "NaN"),
        ('{"items": [1, 2, 3, {"price": Infinity}]}', "payload.items[3].price", "Infinity"),
        ("[-Infinity]", "payload[0]", "-Infinity"),
        ('{"a": [1e400]}', "payload.a[0]", "1e400"),
        ('{"a b": 18446744073709551616}', 'payload["a b"]', "18446744073709551616"),
        (str(MAX_INT + 1), "payload", str(MAX_INT + 1)),
        (str(MIN_INT - 1), "payload", str(MIN_INT - 1)),
        ('{"s": "\\ud800"}', "payload.s", "\\ud800"),
        ('["ok", "\\udc00 lone low"]', "payload[1]", "\\udc00"),
        ('["\\ud800\\u0041"]', "payload[0]", "\\ud800"),
        ('{"a": [1, 2,, 3]}', "payload.a[2]", ", 3]}"),
        ('{"a": 1,}', "payload", "}"),
        ('{"a" 1}', "payload.a", "1}"),
        ("[1] 2", "payload", "2"),
        ('"no end', "payload", '"no end'),
        ("", "payload", "the end of the text"),
    ],
)
def test_a_refusal_names_the_path_of_the_offending_value(text: str, path: str, found: str) -> None:
    with pytest.raises(InvalidJson) as refused:
        parse_json(text, "payload")
    assert (refused.value.field, refused.value.value) == (path, found)
    assert str(refused.value).startswith(f"{path}: ")


def test_nesting_is_refused_below_the_deepest_allowed_level() -> None:
    assert parse_json(nested(MAX_NESTING), "result") is not None
    with pytest.raises(InvalidJson) as refused:
        parse_json(nested(MAX_NESTING + 1), "result")
    assert refused.value.field == "result" + "[0]" * MAX_NESTING
    assert f"at most {MAX_NESTING} deep" in refused.value.allowed


def test_a_hundred_thousand_levels_are_refused_quickly_without_recursion() -> None:
    deep = nested(100_000, "")
    started = time.perf_counter()
    with pytest.raises(InvalidJson) as refused:
        parse_json(deep, "payload")
    assert time.perf_counter() - started < 1.0
    assert refused.value.field.startswith("payload[0][0]")
    with pytest.raises(InvalidJson):  # a bad value after it, and brackets in strings
        parse_json(f'["{"[" * 100}", {nested(100_000, "")}]', "payload")


def test_brackets_and_escapes_in_strings_are_only_text() -> None:
    text = json.dumps(["[" * 200, "\\ud800 is not an escape here", "\ud83d\ude00"])
    assert parse_json(text, "payload") == json.loads(text)
    assert parse_json('"\\\\ud800"', "payload") == "\\ud800"
    assert parse_json('"\\ud83d\\ude00"', "payload") == "\U0001f600"


def test_a_text_above_its_limit_is_too_large() -> None:
    text = json.dumps("x" * MAX_JSON_BYTES)
    with pytest.raises(JsonTooLarge) as refused:
        parse_json(text, "details")
    assert refused.value.field == "details"
    assert parse_json(text, "details", max_bytes=len(text)) == "x" * MAX_JSON_BYTES


def test_numbers_are_read_exactly_when_asked() -> None:
    value = parse_json(
        '{"a": 1.10, "b": 1E5, "c": 1234567890123456789, "d": -0}', "p", decimals=True
    )
    assert value == {
        "a": decimal.Decimal("1.10"),
        "b": decimal.Decimal("1E5"),
        "c": 1234567890123456789,
        "d": 0,
    }
    assert str(value["a"]) == "1.10"
    assert parse_json("[1.10, 5e-324, 1e-400]", "p") == [1.1, 5e-324, 0.0]  # small is fine


def test_members_are_the_exact_texts_a_key_given_twice_keeps_its_last() -> None:
    text = ' { "a" : [1.10 ,2] , "payload":{"x": 1E5}, "a": 3.0 } '
    assert object_members(text) == {"a": "3.0", "payload": '{"x": 1E5}'}
    assert object_members("{}") == {}


def test_dumps_writes_decimals_and_raw_texts_exactly() -> None:
    value = {"a": [1, 1.5, decimal.Decimal("1.10"), RawJson('{"x": 1E5}'), None, True], "é": "\n"}
    assert dumps(value) == '{"a":[1,1.5,1.10,{"x": 1E5},null,true],"é":"\\n"}'
    assert json.loads(dumps(value, indent=2)) == json.loads(dumps(value))
    assert dumps(value, indent=2).startswith('{\n  "a": [\n    1,')


@pytest.mark.parametrize(
    ("value", "path"),
    [
        ({"a": [1, float("nan")]}, "result.a[1]"),
        ({"a": {1: "x"}}, "result.a"),
        ([[{"x": {1, 2}}]], "result[0][0].x"),
        ({"k k": b""}, 'result["k k"]'),
        (decimal.Decimal("Infinity"), "result"),
        (json.loads(nested(MAX_NESTING + 1)), "result" + "[0]" * MAX_NESTING),
    ],
)
def test_dumps_refuses_what_is_not_json_naming_its_path(value: Any, path: str) -> None:
    with pytest.raises(InvalidJson) as refused:
        dumps(value, name="result")
    assert refused.value.field == path


JSON_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(MIN_INT, MAX_INT)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=20,
)


@given(JSON_VALUES, st.sampled_from([None, 1]))
def test_valid_texts_are_accepted_and_read_as_the_standard_library_reads_them(
    value: Any, indent: int | None
) -> None:
    text = json.dumps(value, indent=indent)
    assert parse_json(text, "payload") == json.loads(text)
    assert json.loads(dumps(value)) == json.loads(text)


def test_compact_drops_the_spacing_between_tokens_and_keeps_strings_whole() -> None:
    text = ' { "a" : [ 1.10 , "x \\" y  " ] ,\n\t"b": null } '
    assert compact(text) == '{"a":[1.10,"x \\" y  "],"b":null}'
    assert compact(compact(text)) == compact(text)


def test_array_items_splits_by_structure_alone_and_keeps_each_text() -> None:
    deep = "[" * 100_000 + "]" * 100_000
    text = f' [1.10, {{"a": "x,]"}}, {deep}, NaN,\n"\\"[" ] '
    assert array_items(text) == ["1.10", '{"a": "x,]"}', deep, "NaN", '"\\"["']
    assert array_items("[ ]") == []
    assert array_items("[1,]") == ["1", ""]  # an empty item, for its own check to refuse
    for bad, allowed in (("{}", "a JSON array"), ("[1", "close"), ("[1] 2", "nothing after")):
        with pytest.raises(InvalidJson) as refused:
            array_items(bad, "tasks")
        assert refused.value.field == "tasks"
        assert allowed in refused.value.allowed


def test_a_negative_zero_decimal_reads_back_as_itself() -> None:
    for token in ("-0e0", "-0.0", "-0e5", "0e0"):
        value = parse_json(f"[{token}]", "payload", decimals=True)
        again = parse_json(dumps(value), "payload", decimals=True)
        # An integral Decimal reads back as an int: the same digits, sign and exponent.
        assert [decimal.Decimal(v).as_tuple() for v in again] == [v.as_tuple() for v in value]
