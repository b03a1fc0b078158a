"""Rows to calls: how the scanning builders (`dbscan`, `bundle_scan`) turn rows into calls.

Config keys they share: `function` (required), `rows_per_call` (default
1000), `rows` (the shape of a call's rows: `records`, a list of objects by
column name, the default; `columns`, an object of column name -> list of
values; `tuples`, a list of value lists in column order) and `args` (fixed
leading arguments, default none). A call's arguments are `[*args, rows]`.
Values msgpack has no form for travel as text: dates, times and timestamps in
ISO 8601, decimals and UUIDs as strings; intervals as seconds (or, read
through Arrow, as [months, days, nanoseconds]). Pure, and
meant for a worker thread: a scan encodes its calls off the Trio thread.
"""

from __future__ import annotations

import datetime
import decimal
import uuid
from collections.abc import Mapping, Sequence
from typing import Any, Final

import attrs

from blockx.calls import CallSpec, encode_args
from blockx.errors import shown
from blockx.phases._config import config_integer
from blockx.phases.builders._json import argument_list, function_ref
from blockx.phases.builders._model import BuilderFailed

ROW_KEYS: Final = ("function", "rows_per_call", "rows", "args")
SHAPES: Final = ("records", "columns", "tuples")
MAX_ROWS_PER_CALL: Final = 1_000_000
READ_ROWS: Final = 8192
"""Rows a scan reads per trip to its worker thread (whole calls: at least one)."""
ROWS_USAGE: Final = (
    '"function": "module.fn", "rows_per_call": 1000, "rows": "records" | "columns" | '
    '"tuples", "args": [...]'
)


def _plain(value: object) -> object:
    """msgpack's hook: a value it lacks a form for, as one it has."""
    if isinstance(value, datetime.date | datetime.time):
        return value.isoformat()
    if isinstance(value, decimal.Decimal | uuid.UUID):
        return str(value)
    if isinstance(value, datetime.timedelta):
        return value.total_seconds()
    raise TypeError(f"a {type(value).__name__} value has no call-argument form")


@attrs.frozen(kw_only=True)
class RowCalls:
    """How one task's rows become its calls."""

    builder: str
    function: str
    rows_per_call: int
    shape: str
    args: tuple[object, ...]

    @classmethod
    def from_config(cls, builder: str, config: Mapping[str, object]) -> RowCalls:
        function = function_ref(builder, "config_json.function", config.get("function"))
        bounds = (1000, 1, MAX_ROWS_PER_CALL)
        rows_per_call = config_integer(builder, config, "rows_per_call", bounds, BuilderFailed)
        shape = config.get("rows", "records")
        if shape not in SHAPES:
            raise BuilderFailed(
                message=f"{builder}: config_json.rows must be one of {', '.join(SHAPES)}, "
                f"got {shown(shape)}"
            )
        args = argument_list(builder, "config_json.args", config.get("args", []))
        return cls(
            builder=builder,
            function=function,
            rows_per_call=rows_per_call,
            shape=str(shape),
            args=tuple(args),
        )

    @property
    def rows_per_read(self) -> int:
        """Rows to read at once: whole calls, about `READ_ROWS`."""
        return self.rows_per_call * max(1, READ_ROWS // self.rows_per_call)

    def calls(
        self, names: Sequence[str], rows: Sequence[Sequence[Any]], first: int
    ) -> list[CallSpec]:
        """The calls of `rows` (value sequences in the order of `names`), numbered from
        `first`; `BuilderFailed` naming the column of a value that cannot be sent."""
        calls: list[CallSpec] = []
        step = self.rows_per_call
        for start in range(0, len(rows), step):
            piece = rows[start : start + step]
            shaped: object
            if self.shape == "records":
                shaped = [dict(zip(names, row, strict=True)) for row in piece]
            elif self.shape == "columns":
                shaped = dict(zip(names, map(list, zip(*piece, strict=True)), strict=True))
            else:
                shaped = piece
            try:
                encoded = encode_args([*self.args, shaped], default=_plain)
            except (TypeError, ValueError, OverflowError) as error:
                raise BuilderFailed(
                    message=f"{self.builder}: {self._culprit(names, piece)} cannot be sent "
                    f"to {self.function}: {error}"
                ) from error
            calls.append(
                CallSpec(call_id=str(first + len(calls)), function=self.function, args=encoded)
            )
        return calls

    def _culprit(self, names: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
        """Which column holds the value that cannot be encoded (config args otherwise)."""
        for row in rows:
            for name, value in zip(names, row, strict=True):
                try:
                    encode_args([value], default=_plain)
                except (TypeError, ValueError, OverflowError):
                    return f"column {name!r} (value {shown(value)})"
        return "config_json.args"
