"""The protocol's JSON rules: which texts a payload, result or details may be, and how
values are written with texts spliced in unchanged.

A JSON text travels as the text its producer wrote: the hub stores and serves it as
received, and a handler gets it as sent, so `1.10` stays `1.10` and a 19-digit integer
is never rounded through a double. `parse_json` decides what is allowed: RFC 8259
JSON only (no NaN or infinities), every number within a double's range, every
integer from `MIN_INT` to `MAX_INT`, whole Unicode characters (no lone surrogate),
arrays and objects nested at most `MAX_NESTING` deep, at most `MAX_JSON_BYTES`. A
refusal (`InvalidJson`) names the path of the offending value: `payload.items[3].price`.

Nothing here recurses without bound: depth is measured by one regular-expression pass
before the C decoder sees a text, and a text the fast way refuses is walked once more,
iteratively, to find where and why. `dumps` writes at most `MAX_NESTING` levels.
"""

from __future__ import annotations

import decimal
import itertools
import json
import math
import re
from typing import Any, Final

import attrs

from blockx.errors import InvalidValue, shown
from blockx.hubwire._messages import MAX_INT, MAX_JSON_BYTES

MAX_NESTING: Final = 64
"""Deepest nesting of arrays and objects in a payload, result or details."""
MIN_INT: Final = -(2**63)
"""The least integer a JSON text may hold (`MAX_INT` the greatest): 64 bits, signed."""

_STRING: Final = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_NOT_BRACKETS: Final = bytes(set(range(256)) - set(b"[]{}"))
_STEP: Final = {ord("["): 1, ord("{"): 1, ord("]"): -1, ord("}"): -1}
_SURROGATE_ESCAPE: Final = re.compile(rb"\\u[dD][89a-fA-F]")
_ESCAPE: Final = re.compile(
    rb"\\(?:u[dD][89abAB][0-9a-fA-F]{2}\\u[dD][c-fC-F][0-9a-fA-F]{2}"
    rb"|(u[dD][89a-fA-F][0-9a-fA-F]{2})|.)",
    re.DOTALL,
)
"""An escape in a string: a surrogate pair, a lone surrogate (group 1), or any other."""
_SURROGATE: Final = re.compile("[\ud800-\udfff]")
_WHITESPACE: Final = re.compile(r"[ \t\n\r]*")
_NUMBER: Final = re.compile(r"-?(?:0|[1-9][0-9]*)(\.[0-9]+)?([eE][-+]?[0-9]+)?")
_SIMPLE: Final = (
    r"(?:-?(?:0|[1-9][0-9]{0,17})(?:\.[0-9]+)?(?:[eE][-+]?[0-9]{1,2})?"
    r'|"[^"\\\x00-\x1f\ud800-\udfff]*"|true|false|null)[ \t\n\r]*,[ \t\n\r]*'
)
"""A value surely sound (a short number, a string without escapes, a literal) and its comma."""
_ITEM: Final = re.compile(_SIMPLE)
_ITEMS: Final = re.compile(f"(?:{_SIMPLE})+")
_MEMBERS: Final = re.compile(rf'(?:"[^"\\\x00-\x1f\ud800-\udfff]*"[ \t\n\r]*:[ \t\n\r]*{_SIMPLE})+')
_LITERALS: Final = {"t": "true", "f": "false", "n": "null"}
_NOT_NUMBERS: Final = ("NaN", "Infinity", "-Infinity")
_NAME: Final = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_INT_DIGITS: Final = len(str(MAX_INT))
_RAW: Final = json.JSONDecoder()
_SHOWN: Final = 24
"""How much of the text at a syntax error a refusal quotes."""


class InvalidJson(InvalidValue, ValueError):
    """A JSON text the protocol does not take: `field` is the path of the offending value
    (`payload.items[3].price`), `value` the offending text, `allowed` the rule.

    A `ValueError` as the standard library's JSON errors are."""

    def describe(self) -> str:
        return f"{self.field or 'the JSON text'}: {self.allowed} (found {shown(self.value)})"


class JsonTooLarge(InvalidJson):
    """A JSON text above its size limit."""


@attrs.frozen
class RawJson:
    """JSON text that `dumps` writes out unchanged: a text the hub stored after checking
    it, or one a handler or producer sends as it is (checked where it is received)."""

    text: str


# ------------------------------------------------------------------------ reading


def parse_json(
    text: str,
    name: str,
    *,
    max_bytes: int = MAX_JSON_BYTES,
    max_nesting: int = MAX_NESTING,
    decimals: bool = False,
) -> Any:
    """The value of `text` if it keeps the protocol's rules, else `InvalidJson` naming
    the offending value's path from `name` (payload, result, details; "" for a document
    whose keys are the names). With `decimals`, numbers with a fraction or an exponent
    are `decimal.Decimal`s, exactly as written; else floats."""
    try:
        encoded: bytes | None = text.encode()
    except UnicodeEncodeError:  # a surrogate out of a pair: the walk finds it
        encoded = None
    size = len(text.encode("utf-8", "surrogatepass") if encoded is None else encoded)
    if size > max_bytes:
        raise JsonTooLarge(
            field=name, value=f"{size} bytes", allowed=f"at most {max_bytes} bytes of JSON text"
        )
    shallow = encoded is not None and _shallow(encoded, max_nesting)
    if shallow and encoded is not None and _whole_characters(encoded):
        unusual = _UNUSUAL.search(encoded) is not None
        try:
            return _DECODERS[decimals, unusual].decode(text)
        except ValueError:
            pass  # the walk says where and why
    refusal = _Walk(text, name, max_nesting, skim=shallow).first_refusal()
    if refusal is not None:
        raise refusal
    return _DECODERS[decimals, True].decode(text)  # a quick look only suspected it


def _shallow(encoded: bytes, max_nesting: int) -> bool:
    """Whether a text (UTF-8) surely nests at most `max_nesting` deep: a look at its
    brackets, then at those outside strings if need be (an unclosed string may make it
    look deeper than it is)."""
    return _depth(encoded) <= max_nesting or _depth(_STRING.sub(b"", encoded)) <= max_nesting


def _whole_characters(encoded: bytes) -> bool:
    """Whether a text (UTF-8) surely has no escaped surrogate out of a pair: a look at its
    escapes only if it has a surrogate's (an escaped backslash may make one look lone)."""
    if _SURROGATE_ESCAPE.search(encoded) is None:
        return True
    return not any(match[1] for match in _ESCAPE.finditer(encoded))


def _depth(encoded: bytes) -> int:
    """The deepest its brackets nest, strings or not."""
    brackets = encoded.translate(None, _NOT_BRACKETS)
    return max(itertools.accumulate(map(_STEP.__getitem__, brackets)), default=0)


def _checked_int(token: str) -> int:
    if len(token.lstrip("-")) > _INT_DIGITS or not MIN_INT <= (value := int(token)) <= MAX_INT:
        raise ValueError(token)
    return value


def _checked_float(token: str) -> float:
    value = float(token)
    if math.isinf(value):
        raise ValueError(token)
    return value


def _checked_decimal(token: str) -> decimal.Decimal:
    _checked_float(token)
    return decimal.Decimal(token)


def _not_a_number(token: str) -> Any:
    raise ValueError(token)


_UNUSUAL: Final = re.compile(rb"[0-9]{19}|[eE][-+]?[0-9]{3}|NaN|Infinity")
"""What a number out of range or a NaN needs (19 digits, a 3-digit exponent): a text
without it is read without a check per number."""
_DECODERS: Final = {
    (False, False): json.JSONDecoder(),
    (True, False): json.JSONDecoder(parse_float=decimal.Decimal),
    (False, True): json.JSONDecoder(
        parse_float=_checked_float, parse_int=_checked_int, parse_constant=_not_a_number
    ),
    (True, True): json.JSONDecoder(
        parse_float=_checked_decimal, parse_int=_checked_int, parse_constant=_not_a_number
    ),
}
"""By whether numbers are decimals and whether each number is checked."""


def object_members(text: str) -> dict[str, str]:
    """The exact text of each member of the JSON object `text`, which `parse_json` took
    (a key given twice keeps its last text, as parsing keeps its last value)."""
    members: dict[str, str] = {}
    end = _skip(text, 0) + 1  # past "{"
    while text[_skip(text, end)] != "}":
        key, end = _RAW.raw_decode(text, _skip(text, end))
        start = _skip(text, _skip(text, end) + 1)  # past ":"
        end = _RAW.raw_decode(text, start)[1]
        members[key] = text[start:end]
        end = _skip(text, end)
        end += text[end] == ","
    return members


_STRUCTURE: Final = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"|[\[\]{},]', re.DOTALL)
"""A string (skipped whole), a bracket or a comma: what tells where an item ends."""


def array_items(text: str, name: str = "") -> list[str]:
    """The exact text of each item of the JSON array `text`, found by its brackets, commas
    and strings alone: no item is read, however deep or wrong it is, so each can then be
    checked (and refused) on its own. `InvalidJson` if `text` is not an array, or its
    brackets do not close."""
    start = _skip(text, 0)
    if not text.startswith("[", start):
        raise InvalidJson(field=name, value=text[start : start + _SHOWN], allowed="a JSON array")
    items: list[str] = []
    depth, begin = 0, start + 1
    for token in _STRUCTURE.finditer(text, start):
        mark = token[0]
        if mark in "[{":
            depth += 1
        elif mark in "]}":
            depth -= 1
        elif mark == "," and depth == 1:
            items.append(text[begin : token.start()].strip(" \t\n\r"))
            begin = token.end()
        if depth == 0:
            last = text[begin : token.start()].strip(" \t\n\r")
            if last or items:  # "[]" has no item; "[1,]" has an empty second one
                items.append(last)
            if _skip(text, token.end()) != len(text):
                raise InvalidJson(
                    field=name,
                    value=text[token.end() : token.end() + _SHOWN],
                    allowed="nothing after the array",
                )
            return items
    raise InvalidJson(
        field=name, value="the end of the text", allowed="an array whose brackets close"
    )


_SPACING: Final = re.compile(r'("[^"\\]*(?:\\.[^"\\]*)*")|[ \t\n\r]+', re.DOTALL)


def compact(text: str) -> str:
    """A JSON text without the whitespace between its tokens, every other character kept:
    two texts of one document that differ only in their spacing compact equal."""
    return _SPACING.sub(lambda match: match[1] or "", text)


def _skip(text: str, at: int) -> int:
    """Where the first character after any whitespace at `at` is."""
    match = _WHITESPACE.match(text, at)
    assert match is not None  # it matches the empty string
    return match.end()


@attrs.define
class _Frame:
    """An array or object the walk is in: its path and the item it is at."""

    path: str
    closer: str
    index: int = 0
    key: str = ""

    def child(self) -> str:
        if self.closer == "]":
            return f"{self.path}[{self.index}]"
        return _member_path(self.path, self.key)


def _member_path(path: str, key: str) -> str:
    if _NAME.fullmatch(key) is None:
        return f"{path}[{json.dumps(key, ensure_ascii=False)}]"
    return f"{path}.{key}" if path else key


class _Walk:
    """One pass over a text in a loop (no recursion), for the first rule it breaks. Each
    step reads what it expects at `at` and returns the next step, a refusal, or None
    once the whole text was read."""

    def __init__(self, text: str, name: str, max_nesting: int, *, skim: bool) -> None:
        self.text = text
        self.name = name
        self.max_nesting = max_nesting
        self.skim = skim
        """The text nests within bounds: an array or object the C decoder reads whole
        is skipped (the walk goes into one only on the way to what is wrong)."""
        self.frames: list[_Frame] = []
        self.at = 0

    def first_refusal(self) -> InvalidJson | None:
        step: Any = self.value
        while callable(step):
            self.at = _skip(self.text, self.at)
            step = step()
        assert step is None or isinstance(step, InvalidJson)
        return step

    def refuse(
        self, allowed: str, value: str | None = None, path: str | None = None
    ) -> InvalidJson:
        if path is None:
            path = self.frames[-1].child() if self.frames else self.name
        if value is None:
            value = self.text[self.at : self.at + _SHOWN] or "the end of the text"
        return InvalidJson(field=path, value=value, allowed=allowed)

    def value(self) -> Any:
        if self.frames and self.frames[-1].closer == "]":
            self.skip_run(_ITEMS)
        opener = self.text[self.at : self.at + 1]
        if opener in ("[", "{") and self.skim and (end := self.sound_end()):
            self.at = end
            return self.after_value
        if opener in ("[", "{"):
            if len(self.frames) == self.max_nesting:
                return self.refuse(f"arrays and objects nested at most {self.max_nesting} deep")
            path = self.frames[-1].child() if self.frames else self.name
            self.frames.append(_Frame(path, "]" if opener == "[" else "}"))
            self.at += 1
            return self.first_item if opener == "[" else self.first_key
        if opener == '"':
            decoded = self.string()
            return decoded if isinstance(decoded, InvalidJson) else self.after_value
        if (number := _NUMBER.match(self.text, self.at)) is not None:
            return self.number(number)
        word = _LITERALS.get(opener, "")
        if word and self.text.startswith(word, self.at):
            self.at += len(word)
            return self.after_value
        for bad in _NOT_NUMBERS:
            if self.text.startswith(bad, self.at):
                return self.refuse("a JSON number: RFC 8259 has no NaN or infinities", bad)
        return self.refuse("a JSON value (RFC 8259)")

    def sound_end(self) -> int:
        """Where the array or object at `at` ends if it keeps every rule, else 0."""
        try:
            end: int = _DECODERS[False, True].raw_decode(self.text, self.at)[1]
        except ValueError:
            return 0
        return end if _whole_characters(self.text[self.at : end].encode()) else 0

    def number(self, number: re.Match[str]) -> Any:
        token = number[0]
        fraction = number[1] or number[2]
        try:
            _checked_float(token) if fraction else _checked_int(token)
        except ValueError:
            if fraction:
                return self.refuse("a number within a double's range (about ±1.8e308)", token)
            return self.refuse(f"an integer from {MIN_INT} to {MAX_INT} (64 bits)", token)
        self.at = number.end()
        return self.after_value

    def string(self) -> str | InvalidJson:
        """The string at `at`, decoded, and `at` past it; or why it is not one."""
        try:
            decoded, end = _RAW.raw_decode(self.text, self.at)
        except json.JSONDecodeError as error:
            return self.refuse(f"a JSON string (RFC 8259): {error.msg.removesuffix(' at')}")
        if (lone := _SURROGATE.search(decoded)) is not None:
            return self.refuse(
                "whole Unicode characters: a surrogate \\ud800-\\udbff only right before "
                "one of \\udc00-\\udfff",
                f"\\u{ord(lone[0]):04x}",
            )
        self.at = end
        return str(decoded)

    def first_item(self) -> Any:
        return self.close() if self.text.startswith("]", self.at) else self.value

    def first_key(self) -> Any:
        return self.close() if self.text.startswith("}", self.at) else self.key

    def skip_run(self, run: re.Pattern[str]) -> None:
        """Past the items (or members) at `at` that are surely sound, each with its comma:
        a run of them read at the decoder's pace, not one step each."""
        if (match := run.match(self.text, self.at)) is not None:
            self.frames[-1].index += len(_ITEM.findall(match[0])) if run is _ITEMS else 0
            self.at = match.end()

    def key(self) -> Any:
        self.skip_run(_MEMBERS)
        frame = self.frames[-1]
        if not self.text.startswith('"', self.at):
            return self.refuse("an object's key: a JSON string", path=frame.path)
        decoded = self.string()
        if isinstance(decoded, InvalidJson):
            return decoded
        frame.key = decoded
        return self.colon

    def colon(self) -> Any:
        if not self.text.startswith(":", self.at):
            return self.refuse("':' after an object's key")
        self.at += 1
        return self.value

    def close(self) -> Any:
        self.frames.pop()
        self.at += 1
        return self.after_value

    def after_value(self) -> Any:
        if not self.frames:
            return None if self.at == len(self.text) else self.refuse("nothing after the value")
        frame = self.frames[-1]
        if self.text.startswith(frame.closer, self.at):
            return self.close()
        if not self.text.startswith(",", self.at):
            return self.refuse(f"',' or '{frame.closer}' after an item")
        self.at += 1
        frame.index += 1
        return self.value if frame.closer == "]" else self.key


# ------------------------------------------------------------------------ writing


class _Unwritable(Exception):
    """A value `dumps` cannot write (`value` says what it is, never its whole repr, which
    may be huge or fail); `where` gathers its path on the way out."""

    def __init__(self, value: object, allowed: str) -> None:
        self.value = value
        self.allowed = allowed
        self.where: list[str | int] = []


def dumps(value: Any, *, name: str = "", indent: int | None = None) -> str:
    """`value` as JSON text: dicts (string keys), lists, tuples, strings, ints, floats,
    bools, None, `decimal.Decimal`s (exactly as they are) and `RawJson` (its text
    unchanged); `InvalidJson` naming the path from `name` for anything else, NaN or
    infinities, or nesting deeper than `MAX_NESTING`. Compact unless `indent`."""
    out: list[str] = []
    try:
        _write(value, out, 0, None if indent is None else " " * indent)
    except _Unwritable as error:
        path = name
        for step in reversed(error.where):
            path = f"{path}[{step}]" if isinstance(step, int) else _member_path(path, step)
        raise InvalidJson(field=path, value=error.value, allowed=error.allowed) from None
    return "".join(out)


def _write(value: Any, out: list[str], depth: int, indent: str | None) -> None:
    if isinstance(value, str):
        out.append(json.encoder.encode_basestring(value))
    elif value is None or isinstance(value, bool):
        out.append("null" if value is None else "true" if value else "false")
    elif isinstance(value, int):
        out.append(int.__repr__(value))
    elif isinstance(value, float) and math.isfinite(value):
        out.append(float.__repr__(value))
    elif isinstance(value, (dict, list, tuple)):
        if depth == MAX_NESTING:
            raise _Unwritable(
                f"a {type(value).__name__}", f"arrays and objects nested at most {MAX_NESTING} deep"
            )
        _write_items(value, out, depth + 1, indent)
    elif isinstance(value, RawJson):
        out.append(value.text)
    elif isinstance(value, decimal.Decimal) and value.is_finite():
        # A negative zero written "-0" reads back as the integer 0: "-0E+0" keeps its sign.
        negative_zero = value.is_zero() and value.is_signed() and value.as_tuple().exponent == 0
        out.append("-0E+0" if negative_zero else str(value))
    elif isinstance(value, (float, decimal.Decimal)):
        raise _Unwritable(value, "a JSON number: RFC 8259 has no NaN or infinities")
    else:
        raise _Unwritable(
            f"a {type(value).__name__}",
            "a JSON value: dict, list, str, int, float, bool, None, Decimal or RawJson",
        )


def _write_items(
    items: dict[Any, Any] | list[Any] | tuple[Any, ...],
    out: list[str],
    depth: int,
    indent: str | None,
) -> None:
    """The items of an array or object at `depth` (1: the outermost's)."""
    is_object = isinstance(items, dict)
    out.append("{" if is_object else "[")
    closing = None if indent is None else "\n" + indent * (depth - 1)
    pairs = items.items() if isinstance(items, dict) else enumerate(items)
    for index, (key, item) in enumerate(pairs):
        if index:
            out.append(",")
        if closing is not None:
            out.append(closing + indent)  # type: ignore[operator]
        if is_object:
            if not isinstance(key, str):
                raise _Unwritable(f"a {type(key).__name__} key", "an object's key: a string")
            out.append(json.encoder.encode_basestring(key))
            out.append(":" if indent is None else ": ")
        try:
            _write(item, out, depth, indent)
        except _Unwritable as error:
            error.where.append(key)
            raise
    if closing is not None and items:
        out.append(closing)
    out.append("}" if is_object else "]")
