"""The `result` plugin: keeps a task's outputs in its retained result.

The outputs become one JSON array, in call order (bytes inside a value become
`{"$bytes": <base64>}`, as the jsonl plugin writes them), which the result
carries as `outputs_json` for as long as the worker retains it. A retained
result is memory, so the array is bounded: at most `MAX_OUTPUTS_BYTES` of
UTF-8, or the handler's `config_json.max_bytes` when that is lower. Larger
outputs fail the phase with `OUTPUTS_TOO_LARGE`, naming their size and the
limit; nothing is kept. Outputs of at most `INLINE_OUTPUTS_BYTES` (msgpack)
are encoded in the slot table's step (`run_now`, an `InlinePlugin`): a few
small values cost less than a trip to a thread. Larger ones are encoded in a
worker thread so the Trio loop never blocks on them.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Final

import trio

from blockx.calls import FailureCode
from blockx.phases._config import config_integer
from blockx.phases.plugins._model import (
    PluginFailed,
    PluginRequest,
    decoded_output,
    json_ready,
    parse_config,
)
from blockx.slots import PluginResult

NAME: Final = "result"
MAX_OUTPUTS_BYTES: Final = 1024 * 1024
"""The most a retained result keeps of a task's outputs, as UTF-8 JSON: the worker's limit,
which a task's `config_json.max_bytes` may lower but never raise."""
INLINE_OUTPUTS_BYTES: Final = 16 * 1024
"""The most msgpack bytes of outputs `run_now` encodes in the caller's step (well under a
millisecond of work); more go to a worker thread (`run`)."""


def _limit(config_json: str) -> tuple[int, str]:
    """The byte limit of one task's outputs, and what set it (for the refusal)."""
    config = parse_config(NAME, config_json, ("max_bytes",))
    if "max_bytes" not in config:
        return MAX_OUTPUTS_BYTES, ""
    bounds = (MAX_OUTPUTS_BYTES, 1, MAX_OUTPUTS_BYTES)
    max_bytes = config_integer(NAME, config, "max_bytes", bounds, PluginFailed)
    return max_bytes, " (config_json.max_bytes)"


_ENCODER: Final = json.JSONEncoder(allow_nan=False, ensure_ascii=False, separators=(",", ":"))
"""One encoder for every output (`json.dumps` with options makes one per call); an
integer is written as its decimal form, which is its JSON, without it."""


def encode_outputs(outputs: Sequence[bytes], limit: int, set_by: str = "") -> str:
    """`outputs` as one compact JSON array of at most `limit` UTF-8 bytes.

    `PluginFailed` naming the first output that has no JSON form, else
    (`OUTPUTS_TOO_LARGE`) the array's whole size once it passes `limit`: past
    the limit the parts are measured, no longer kept.
    """
    parts: list[str] = []
    size = len("[]") + max(len(outputs) - 1, 0)  # the brackets and the commas
    for index, output in enumerate(outputs):
        value = decoded_output(NAME, index, output)
        try:
            part = str(value) if type(value) is int else _ENCODER.encode(json_ready(value))
        except (TypeError, ValueError, RecursionError) as error:
            raise PluginFailed(
                message=f"{NAME}: output {index} has no JSON form ({error}); nothing was kept"
            ) from error
        size += len(part.encode("utf-8"))
        if size <= limit:
            parts.append(part)
    if size > limit:
        raise PluginFailed(
            message=f"{NAME}: the outputs take {size} bytes as JSON, "
            f"over the limit of {limit} bytes{set_by}",
            code=FailureCode.OUTPUTS_TOO_LARGE,
        )
    return "[" + ",".join(parts) + "]"


class ResultPlugin:
    """Keeps each task's outputs, as a bounded JSON array, in the task's retained result."""

    name: Final = NAME
    usage: Final = (
        "keeps the outputs in the task's result, shown by --watch and `result` "
        f'(optional config {{"max_bytes": N}}, at most {MAX_OUTPUTS_BYTES})'
    )

    async def run(self, request: PluginRequest) -> PluginResult:
        limit, set_by = _limit(request.handler.config_json)
        # Pure computation: a cancelled phase may leave the thread to finish on its own.
        outputs_json = await trio.to_thread.run_sync(
            encode_outputs, request.outputs, limit, set_by, abandon_on_cancel=True
        )
        return _kept(request, outputs_json)

    def run_now(self, request: PluginRequest) -> PluginResult | None:
        """`run` in the caller's step (`InlinePlugin`); declined for outputs of more than
        `INLINE_OUTPUTS_BYTES`."""
        limit, set_by = _limit(request.handler.config_json)
        if sum(map(len, request.outputs)) > INLINE_OUTPUTS_BYTES:
            return None
        return _kept(request, encode_outputs(request.outputs, limit, set_by))


def _kept(request: PluginRequest, outputs_json: str) -> PluginResult:
    return PluginResult(
        plugin_type=NAME,
        ok=True,
        records_written=len(request.outputs),
        outputs_json=outputs_json,
    )
