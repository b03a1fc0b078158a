"""Hostile requests for every RPC of the worker's port, and what the worker must answer.

A builder turns choices into a `HostileCall`: the request bodies as a careless or
malicious client could send them (wrong JSON types, huge, empty and padded ids,
unicode, negative and enormous timeouts, unknown builder and writer types, deep
nesting, bodies at and over the size limit, protobuf with unknown fields, bad UTF-8
or a field cut short, bytes that are not protobuf at all), the client's deadline,
the statuses the call may end with, and for each task it may admit the failure codes
its result may carry ("" for success).

Builders draw from `Choices`: `hostile_calls()` draws through Hypothesis (so that a
failure shrinks), `RandomChoices` from a seeded `random.Random` for the volume run.
Both run the same builders. The expectations hold for a worker configured with
`WORKER_SETTINGS` and serving `examples/functions`.
"""

from __future__ import annotations

import enum
import itertools
import json
import random
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Final, Protocol, TypeVar

import attrs
from google.protobuf import message_factory  # type: ignore[import-untyped]  # no stubs
from hypothesis import strategies as st

from blockx._proto.blockx.worker import v1  # noqa: F401  # registers the messages below
from blockx._proto.google_proto_descriptor_pool import default_google_proto_descriptor_pool
from blockx.calls import FailureCode
from blockx.slots import MAX_TASK_ID_CHARS, SHADOW_LABEL

T = TypeVar("T")

MAX_MESSAGE_BYTES: Final = 1024 * 1024
MAX_TASK_TIMEOUT_MS: Final = 60_000
WORKER_SETTINGS: Final[dict[str, object]] = {
    "worker": {
        "taskSlots": 16,
        "defaultTTLMs": 2_000,
        "taskDeadlineMs": 30_000,
        "maxTaskTimeoutMs": MAX_TASK_TIMEOUT_MS,
        # Long enough to read each call's results after it, short enough that the
        # retained results level off early in the volume run.
        "resultRetentionMs": 10_000,
    },
    "grpcMaxMessageBytes": MAX_MESSAGE_BYTES,
    "executorCount": 2,
}
"""The worker's settings (WORKER_CONFIG) the expectations here assume."""

SERVICE: Final = "/blockx.worker.v1.WorkerService/"
DEADLINE_S: Final = 30.0
"""The client's deadline of a call that is not meant to run out of time."""

# gRPC status names (grpc.StatusCode's).
OK: Final = "OK"
INVALID: Final = "INVALID_ARGUMENT"
NOT_FOUND: Final = "NOT_FOUND"
PRECONDITION: Final = "FAILED_PRECONDITION"
EXHAUSTED: Final = "RESOURCE_EXHAUSTED"
ABORTED: Final = "ABORTED"
UNIMPLEMENTED: Final = "UNIMPLEMENTED"
DEADLINE: Final = "DEADLINE_EXCEEDED"
PRECISE_STATUSES: Final = frozenset(
    {OK, INVALID, NOT_FOUND, PRECONDITION, EXHAUSTED, ABORTED, UNIMPLEMENTED, DEADLINE}
)
"""Every status a hostile call may end with: what it did wrong, or a state it met."""

SUCCEEDED: Final = ""
NAMED_CODES: Final = frozenset(code.value for code in FailureCode) | {SUCCEEDED}
"""What a task's result may carry, whatever its spec."""

_BUILDER_FAILED = FailureCode.BUILDER_FAILED.value
_CALL_RAISED = FailureCode.CALL_RAISED.value
_UNKNOWN_FUNCTION = FailureCode.UNKNOWN_FUNCTION.value
_PLUGIN_FAILED = FailureCode.PLUGIN_FAILED.value


def message(name: str, **fields: Any) -> Any:
    """A message of the worker's API, made by the protobuf runtime: it encodes in a
    fraction of betterproto2's time, which counts over 10,000 calls."""
    made: Any = _CLASSES[name](**fields)
    return made


def encoded(name: str, **fields: Any) -> bytes:
    data: bytes = message(name, **fields).SerializeToString()
    return data


def _fields(value: Any) -> str:
    return "none" if value is None else str(value).replace("\n", " ").strip()


_CLASSES: Final = {
    name: message_factory.GetMessageClass(
        default_google_proto_descriptor_pool.FindMessageTypeByName(f"blockx.worker.v1.{name}")
    )
    for name in (
        "TaskSpec",
        "FunctionCallConfig",
        "ResultHandler",
        "CallRetryPolicy",
        "RequestTaskSlotRequest",
        "SubmitTaskRequest",
        "GetTaskResultRequest",
        "WatchTasksRequest",
        "RunTasksRequest",
        "RunTasksItem",
    )
}


class Choices(Protocol):
    """Where a builder's decisions come from."""

    def integer(self, low: int, high: int) -> int: ...

    def pick(self, options: Sequence[T]) -> T: ...

    def text(self, alphabet: str, max_size: int) -> str: ...

    def raw(self, max_size: int) -> bytes: ...

    def serial(self) -> int:
        """A number no earlier call of this run drew: makes task ids unique."""
        ...


@attrs.define
class DrawnChoices:
    """Choices drawn through Hypothesis (`hostile_calls`)."""

    draw: Callable[[st.SearchStrategy[Any]], Any]
    serials: Iterator[int]

    def integer(self, low: int, high: int) -> int:
        value: int = self.draw(st.integers(low, high))
        return value

    def pick(self, options: Sequence[T]) -> T:
        value: T = self.draw(st.sampled_from(options))
        return value

    def text(self, alphabet: str, max_size: int) -> str:
        value: str = self.draw(st.text(alphabet, max_size=max_size))
        return value

    def raw(self, max_size: int) -> bytes:
        value: bytes = self.draw(st.binary(max_size=max_size))
        return value

    def serial(self) -> int:
        return next(self.serials)


@attrs.define
class RandomChoices:
    """Choices from a seeded `random.Random` (the volume run). Like Hypothesis, it
    favours the ends of a range."""

    rng: random.Random
    serials: Iterator[int] = attrs.field(factory=itertools.count)

    def integer(self, low: int, high: int) -> int:
        roll = self.rng.random()
        if roll < 0.1:
            return low
        if roll < 0.2:
            return high
        return self.rng.randint(low, high)

    def pick(self, options: Sequence[T]) -> T:
        return self.rng.choice(options)

    def text(self, alphabet: str, max_size: int) -> str:
        return "".join(self.rng.choices(alphabet, k=self.rng.randint(0, max_size)))

    def raw(self, max_size: int) -> bytes:
        return self.rng.randbytes(self.rng.randint(0, max_size))

    def serial(self) -> int:
        return next(self.serials)


class Shape(enum.Enum):
    UNARY = "unary"
    SERVER_STREAM = "server stream"
    BIDI = "bidi"


@attrs.frozen(kw_only=True)
class TaskExpectation:
    task_id: str
    codes: frozenset[str]
    """The failure codes its result may carry ("" = it may succeed)."""


@attrs.frozen(kw_only=True)
class HostileCall:
    """One call and what may come of it."""

    what: str
    """What the builders made, for a failure's message."""
    method: str
    shape: Shape
    bodies: tuple[bytes, ...] = attrs.field(repr=lambda bodies: f"<{len(bodies)} bodies>")
    statuses: frozenset[str]
    """The statuses the call may end with."""
    answers: tuple[frozenset[str], ...] = ()
    """RunTasks: the statuses each task's answer may have, in order (OK: accepted)."""
    tasks: tuple[TaskExpectation, ...] = ()
    """The tasks it may admit, first spec first (a later duplicate is the same task)."""
    timeout_s: float = DEADLINE_S
    repeat: bool = False
    """Sent twice: the second answer must be the first's (idempotency by task id)."""


@attrs.frozen(kw_only=True)
class Spec:
    """A generated TaskSpec and its verdict."""

    message: Any
    """A TaskSpec (the protobuf runtime's)."""
    what: str
    valid: bool
    """False: SubmitTask must refuse it with INVALID_ARGUMENT."""
    codes: frozenset[str]

    @property
    def task_id(self) -> str:
        task_id: str = self.message.task_id
        return task_id


# --- values --------------------------------------------------------------------------

PLAIN: Final = "abcxyzABC0129-_.:/"
UNICODE: Final = "é中ßЖ😀👩\u200d💻\u0301\u202e\ufeff\x00\x7f\t\n"
"""Letters of other scripts, astral characters, a ZWJ sequence, combining and bidi
marks, a BOM, NUL, DEL and whitespace inside an id (all allowed there)."""
WHITESPACE: Final = " \t\n\r\x0b\x0c\x1c\x85\xa0\u2003\u2028\u3000"
"""What `str.strip` removes: an id may not begin or end with any of it."""


def task_id(c: Choices) -> tuple[str, bool]:
    """(an id, whether the worker takes it)."""
    if c.pick((True, True, True, False)):
        return valid_task_id(c), True
    return invalid_task_id(c), False


def valid_task_id(c: Choices) -> str:
    """An id never used before, of every kind the worker takes."""
    serial = f"{c.serial()}"
    match c.pick(("plain", "plain", "unicode", "longest")):
        case "plain":
            return f"h{serial}-{c.text(PLAIN, 12)}"
        case "unicode":
            return f"h{c.text(UNICODE, 8)}{serial}{c.text(UNICODE, 8)}h"
        case _:
            return serial + c.pick(("x", "é", "😀")) * (MAX_TASK_ID_CHARS - len(serial))


def invalid_task_id(c: Choices) -> str:
    """An id no task can have: too long, padded with whitespace, or empty."""
    serial = f"{c.serial()}"
    match c.pick(("overlong", "padded", "empty")):
        case "overlong":
            size = c.pick((MAX_TASK_ID_CHARS + 1, 10_000, 100_000))
            return serial + "x" * (size - len(serial))
        case "padded":
            space = c.pick(WHITESPACE)
            return c.pick((space + serial, serial + space, space))
        case _:
            return ""


def json_value(c: Choices, depth: int = 0) -> object:
    """A JSON value whose integers msgpack can carry and whose texts are short."""
    kinds = ("int", "float", "text", "bool", "null") + (("list", "object") if depth < 3 else ())
    match c.pick(kinds):
        case "int":
            return c.pick((0, -1, 1, 2**53, -(2**63), 2**64 - 1, c.integer(-1000, 1000)))
        case "float":
            return c.pick((0.5, -0.0, 1e-300, 1.7976931348623157e308))
        case "text":
            return c.text(PLAIN + UNICODE + '"\\', 16)
        case "bool":
            return c.pick((True, False))
        case "null":
            return None
        case "list":
            return [json_value(c, depth + 1) for _ in range(c.integer(0, 3))]
        case _:
            return {c.text(PLAIN + UNICODE, 6): json_value(c, depth + 1) for _ in range(2)}


def dumps(value: object) -> bytes:
    return json.dumps(value, ensure_ascii=False).encode(errors="surrogatepass")


# --- the builder phase and its calls -------------------------------------------------

ADDITIONS: Final = (
    ((1, 2), SUCCEEDED),
    (("ab", "c"), SUCCEEDED),
    (([1], [2]), SUCCEEDED),
    ((True, 1), SUCCEEDED),
    ((0.5, 2), SUCCEEDED),
    (("a", 1), _CALL_RAISED),
    ((None, 1), _CALL_RAISED),
    (({"a": 1}, {"b": 2}), _CALL_RAISED),
    ((2**64 - 1, 1), FailureCode.RESULT_NOT_SERIALIZABLE.value),
    ((-(2**63), -1), FailureCode.RESULT_NOT_SERIALIZABLE.value),
)
"""demo.add's arguments and what adding them ends with."""
MISSING_FUNCTIONS: Final = (
    "demo.nope",
    "nosuch.fn",
    "os.system",
    "builtins.eval",
    "demo.time",
    "demo._private",
    "démo.add",
    "demo.add.x",
)
"""Function references the builders take and the executors cannot call."""
BAD_REFERENCES: Final = ("", "demo", "demo.", ".add", "1.add", "de mo.add", "class.x", 5, None)


@attrs.frozen(kw_only=True)
class Entry:
    """A call entry of a call_list payload: its JSON and what it does."""

    value: object
    codes: frozenset[str] | None
    """How the call may end; None: the builder refuses the entry."""
    call_id: object
    """Its "id" (`_NO_ID`: none, the index is its id)."""


_NO_ID: Final = object()


CALL_KINDS: Final = ("add", "add", "echo", "echo", "fail", "missing", "arity")
REFUSED_KINDS: Final = ("bad ref", "bad args", "extra")


def call_entry(c: Choices) -> Entry:
    """A call, or one time in ten an entry the builder refuses (so that a payload of a
    few entries still gets as far as its calls most of the time)."""
    kind = c.pick(c.pick((CALL_KINDS,) * 9 + (REFUSED_KINDS,)))
    codes: frozenset[str] | None
    match kind:
        case "add":
            args, code = c.pick(ADDITIONS)
            entry: dict[str, object] = {"function": "demo.add", "args": list(args)}
            codes = frozenset({code})
        case "echo":
            entry = {"function": "demo.echo", "args": [json_value(c)]}
            codes = frozenset({SUCCEEDED})
        case "fail":
            entry = {"function": "demo.fail", "args": [c.text(PLAIN + UNICODE, 10)]}
            codes = frozenset({_CALL_RAISED})
        case "missing":
            entry = {"function": c.pick(MISSING_FUNCTIONS), "args": []}
            codes = frozenset({_UNKNOWN_FUNCTION})
        case "arity":
            entry = {"function": "demo.add", "args": c.pick(([], [1], [1, 2, 3]))}
            codes = frozenset({_CALL_RAISED})
        case "bad ref":
            entry = {"function": c.pick(BAD_REFERENCES), "args": []}
            codes = None
        case "bad args":
            bad: object = c.pick(({"a": 1}, "1, 2", 5, None, [2**64]))
            entry = {"function": "demo.add", "args": bad}
            codes = None
        case _:
            entry = {"function": "demo.add", "args": [1, 2], "retries": 3}
            codes = None
    # One id in twenty is one the builder refuses (empty, not a string, or one an
    # entry without an id takes: its index).
    ids = c.pick(((_NO_ID, _NO_ID, f"c{c.serial()}"),) * 19 + (("0", "1", "", 7, None),))
    call_id = c.pick(ids)
    if call_id is not _NO_ID:
        entry["id"] = call_id
    return Entry(value=entry, codes=codes, call_id=call_id)


def calls_codes(entries: Sequence[Entry]) -> frozenset[str]:
    """How a FAIL_FAST calls phase of `entries` may end (BUILDER_FAILED if the builder
    refuses one): any call's failure, or success if every call may succeed."""
    ids = [str(index) if e.call_id is _NO_ID else e.call_id for index, e in enumerate(entries)]
    bad_id = any(not isinstance(i, str) or not i for i in ids) or len(set(map(str, ids))) < len(ids)
    if bad_id or any(e.codes is None for e in entries):
        return frozenset({_BUILDER_FAILED})
    codes = [e.codes for e in entries if e.codes is not None]
    failures = frozenset().union(*codes) - {SUCCEEDED}
    all_may_succeed = all(SUCCEEDED in code for code in codes)
    return failures | ({SUCCEEDED} if all_may_succeed else frozenset())


@attrs.frozen(kw_only=True)
class Phase:
    """What the builder is told, and how the builder and calls phases may end."""

    type: str
    config_json: str = ""
    payload: bytes = b""
    codes: frozenset[str]
    activation: str | None = None
    """The code activation fails with (BUILDER_NOT_FOUND), if it does."""
    what: str


CALL_LIST_CONFIGS: Final = (
    ("", True),
    ("{}", True),
    (" \n", True),
    ('{"calls": []}', False),
    ("[]", False),
    ("{", False),
    ("null", False),
)
"""call_list's config_json values, and whether it takes them (it takes no keys)."""


def call_list_phase(c: Choices) -> Phase:
    config, config_ok = c.pick(CALL_LIST_CONFIGS[:3] * 10 + CALL_LIST_CONFIGS[3:])
    name = c.pick(("call_list", "callList"))
    kind = c.pick(("calls",) * 6 + ("wrong type", "not json", "deep", "digits", "empty"))
    match kind:
        case "calls":
            entries = [call_entry(c) for _ in range(c.integer(0, 4))]
            values = [e.value for e in entries]
            form = c.pick(("array",) * 4 + ("object",) * 3 + ("object with more",))
            document: object = {
                "array": values,
                "object": {"calls": values},
                "object with more": {"calls": values, "x": 1},
            }[form]
            payload = dumps(document)
            codes = calls_codes(entries)
            if form == "object with more":
                codes = frozenset({_BUILDER_FAILED})
        case "wrong type":
            wrong: tuple[object, ...] = (5, "calls", None, True, {}, {"calls": 5}, {"calls": {}})
            payload = dumps(c.pick((*wrong, [[1]], ["demo.add"], [5], [None])))
            codes = frozenset({_BUILDER_FAILED})
        case "not json":
            garbage = (b"{", b"[1,", b"nul", b"\xff\xfe[]", b'[{"function": "demo.add"', b"[1]x")
            payload = c.pick((*garbage, b"}" + c.raw(32)))
            codes = frozenset({_BUILDER_FAILED})
        case "deep":
            depth = c.pick((20_000, 100_000))
            closing = c.pick((b"]", b""))
            payload = b"[" * depth + closing * depth
            codes = frozenset({_BUILDER_FAILED})
        case "digits":  # more digits than Python turns into an int
            payload = b"[" + b"9" * 5_000 + b"]"
            codes = frozenset({_BUILDER_FAILED})
        case _:
            payload = c.pick((b"", b" \n\t"))
            codes = frozenset({_BUILDER_FAILED})
    if not config_ok:
        codes = frozenset({_BUILDER_FAILED})
    return Phase(
        type=name,
        config_json=config,
        payload=payload,
        codes=codes,
        what=f"{name} {kind} (config {config!r})",
    )


def static_phase(c: Choices) -> Phase:
    function, code = c.pick(
        (("demo.add", SUCCEEDED), ("demo.fail", _CALL_RAISED), ("demo.nope", _UNKNOWN_FUNCTION))
    )
    count = c.integer(0, 20)
    good = {"function": function, "count": count, "args": [1, 2]}
    config, ok = c.pick(
        (
            *((json.dumps(good), True),) * 5,
            (json.dumps({**good, "count": c.pick((-1, 100_001, True, 1.5, "3"))}), False),
            (json.dumps({"count": 1}), False),
            (json.dumps({**good, "function": c.pick(BAD_REFERENCES)}), False),
            (json.dumps({**good, "args": "1, 2"}), False),
            (json.dumps({**good, "when": "now"}), False),
            (c.pick(("[]", "5", "{", "")), False),
        )
    )
    codes = frozenset({code if count else SUCCEEDED}) if ok else frozenset({_BUILDER_FAILED})
    return Phase(
        type="static", config_json=config, payload=c.raw(16), codes=codes, what=f"static {config}"
    )


def payload_phase(c: Choices) -> Phase:
    function, code = c.pick(
        (("demo.echo", SUCCEEDED), ("demo.fail", _CALL_RAISED), ("demo.add", _CALL_RAISED))
    )
    config, ok = c.pick(
        (
            *((json.dumps({"function": function}), True),) * 3,
            (json.dumps({"function": 5}), False),
            (json.dumps({"function": function, "count": 2}), False),
            ("[]", False),
        )
    )
    kind = c.pick(("array", "array", "array", "value", "value", "empty", "not json", "big int"))
    match kind:
        case "array":
            values = [json_value(c) for _ in range(c.integer(0, 3))]
            payload, codes = dumps(values), frozenset({code if values else SUCCEEDED})
        case "value":  # an array is one call per element
            value = json_value(c)
            calls = value if isinstance(value, list) else [value]
            payload, codes = dumps(value), frozenset({code if calls else SUCCEEDED})
        case "empty":
            payload, codes = b"", frozenset({SUCCEEDED})
        case "not json":
            payload, codes = b"[1, 2", frozenset({_BUILDER_FAILED})
        case _:  # one past what msgpack carries
            payload, codes = b"[18446744073709551616]", frozenset({_BUILDER_FAILED})
    if not ok:
        codes = frozenset({_BUILDER_FAILED})
    return Phase(type="payload", config_json=config, payload=payload, codes=codes, what=kind)


def scan_phase(c: Choices) -> Phase:
    """dbscan and bundle_scan with configs of the wrong JSON types only: hostile input
    must never name a query or a directory for a test to run."""
    name = c.pick(("dbscan", "bundle_scan", "bundleScan"))
    config = c.pick(("5", "[]", "null", '"select 1"', "{", "{}", '{"query": 5}', '{"path": 5}'))
    return Phase(
        type=name,
        config_json=config,
        payload=c.raw(16),
        codes=frozenset({_BUILDER_FAILED}),
        what=f"{name} {config}",
    )


def unknown_phase(c: Choices) -> Phase:
    name = c.pick(
        (
            "",
            "CALL_LIST",
            "call-list",
            "call_list ",
            "Static",
            "tablescan",
            "x" * 10_000,
            c.text(PLAIN + UNICODE, 12) + "?",
        )
    )
    return Phase(
        type=name,
        payload=b"[]",
        codes=frozenset({FailureCode.BUILDER_NOT_FOUND.value}),
        activation=FailureCode.BUILDER_NOT_FOUND.value,
        what=f"unknown builder {name[:20]!r}",
    )


PHASES: Final = (
    call_list_phase,
    call_list_phase,
    call_list_phase,
    static_phase,
    payload_phase,
    scan_phase,
    unknown_phase,
)


# --- the writer ------------------------------------------------------------------------


@attrs.frozen(kw_only=True)
class Writer:
    handler: Any
    """A ResultHandler, or None."""
    codes: frozenset[str]
    """How the plugin phase may end once it runs."""
    activation: str | None = None
    what: str


def writer(c: Choices) -> Writer:
    fine = frozenset({SUCCEEDED})
    match c.pick(("none", "none", "log", "result", "file", "unknown")):
        case "none":
            return Writer(handler=None, codes=fine, what="no writer")
        case "log":
            config, ok = c.pick((("", True), ("{}", True), ('{"level": 1}', False), ("[]", False)))
            codes = fine if ok else frozenset({_PLUGIN_FAILED})
            return Writer(
                handler=message("ResultHandler", type="log", config_json=config),
                codes=codes,
                what="log",
            )
        case "result":
            limit: object = c.pick((1, 64, 4096, 1024 * 1024, 0, -1, 1024 * 1024 + 1, True, "5"))
            valid = type(limit) is int and 1 <= limit <= 1024 * 1024
            config = c.pick(("", json.dumps({"max_bytes": limit})))
            if not config:
                codes = fine
            elif not valid:
                codes = frozenset({_PLUGIN_FAILED})
            elif isinstance(limit, int) and limit < 65536:  # the outputs take less than 64 KiB
                codes = fine | {FailureCode.OUTPUTS_TOO_LARGE.value}
            else:
                codes = fine
            handler = message("ResultHandler", type="result", config_json=config)
            return Writer(handler=handler, codes=codes, what=f"result {config}")
        case "file":  # configs of the wrong JSON types only: nothing may be written
            name = c.pick(("jsonl", "table_upserts", "tableUpserts", "bundle_write", "bundleWrite"))
            config = c.pick(("5", "[]", "null", '"out.jsonl"'))
            handler = message("ResultHandler", type=name, config_json=config)
            return Writer(handler=handler, codes=frozenset({_PLUGIN_FAILED}), what=name)
        case _:
            name = c.pick(("", "Result", "log ", "test_outputs", "x" * 10_000, c.text(UNICODE, 6)))
            return Writer(
                handler=message("ResultHandler", type=name, config_json="{}"),
                codes=fine,
                activation=FailureCode.PLUGIN_NOT_FOUND.value,
                what=f"unknown writer {name[:20]!r}",
            )


# --- the task ----------------------------------------------------------------------------


MANY_LABELS: Final = {f"k{i}": "v" for i in range(1_000)}
BIG_LABEL: Final = {"big": "v" * 100_000}
SPEC_FIELDS: Final = ("task_id", "task_timeout_ms", "call_failure_policy", "call_retry_policy")


def task_spec(c: Choices) -> Spec:
    """A task whose builder, writer and labels may be anything, and of whose other fields
    at most one is out of range (so that most specs get as far as running)."""
    spoiled = c.pick((*(None,) * 8, *SPEC_FIELDS))
    task_id_ = invalid_task_id(c) if spoiled == "task_id" else valid_task_id(c)
    phase = c.pick(PHASES)(c)
    writes = writer(c)
    if spoiled == "task_timeout_ms":
        timeout_ms = c.pick((MAX_TASK_TIMEOUT_MS + 1, 2**63 - 1, -1, -(2**63)))
    else:
        timeout_ms = c.pick((0, 0, c.integer(1, 50), c.integer(5_000, 30_000), MAX_TASK_TIMEOUT_MS))
    policy = c.pick((3, 2**31 - 1, -1) if spoiled == "call_failure_policy" else (0, 1, 2))
    retry: Any
    if spoiled == "call_retry_policy":
        retry = c.pick(
            (
                message("CallRetryPolicy", max_attempts=0),
                message("CallRetryPolicy", max_attempts=3, jitter_percent=c.pick((6, 2**32 - 1))),
            )
        )
    else:
        retry = c.pick(
            (
                None,
                message("CallRetryPolicy", max_attempts=1),
                message("CallRetryPolicy", max_attempts=2**32 - 1, base_backoff_ms=2**32 - 1),
            )
        )
    labels = c.pick(
        (
            {},
            {},
            {c.text(PLAIN + UNICODE, 8): c.text(PLAIN + UNICODE, 8)},
            MANY_LABELS,
            BIG_LABEL,
            {SHADOW_LABEL: "127.0.0.1:1"},
        )
    )
    shadow = SHADOW_LABEL in labels
    handler = None if shadow else writes.handler  # a shadow never stores outputs
    task = message(
        "TaskSpec",
        task_id=task_id_,
        function_call=message("FunctionCallConfig", type=phase.type, config_json=phase.config_json),
        payload=phase.payload,
        result_handler=writes.handler,
        task_timeout_ms=timeout_ms,
        call_failure_policy=policy,  # numbers the enum lacks, too
        call_retry_policy=retry,
        labels=labels,
    )
    codes = _outcome(phase, writes if handler is not None else None, best_effort=policy == 2)
    if timeout_ms and timeout_ms <= 50:
        codes |= {FailureCode.TIMED_OUT.value}
    valid = spoiled is None and phase.type != ""
    what = (
        f"task {task_id_[:24]!r}: {phase.what}; {writes.what}; timeout {timeout_ms}; "
        f"policy {policy}; retry {_fields(retry)}; {len(labels)} labels"
    )
    return Spec(message=task, what=what, valid=valid, codes=codes)


def _outcome(phase: Phase, writes: Writer | None, *, best_effort: bool) -> frozenset[str]:
    """How a task of `phase` and `writes` (None: no writer) may end."""
    if phase.activation is not None:
        return frozenset({phase.activation})
    if writes is not None and writes.activation is not None:
        return frozenset({writes.activation})
    codes = phase.codes
    if best_effort and codes - {_BUILDER_FAILED}:  # failed calls leave the phase a success
        codes = (codes & {_BUILDER_FAILED}) | {SUCCEEDED}
    plugin = writes.codes if writes is not None else frozenset({SUCCEEDED})
    return (codes - {SUCCEEDED}) | (plugin if SUCCEEDED in codes else frozenset())


# --- the RPCs ------------------------------------------------------------------------------


def request_task_slot(c: Choices) -> HostileCall:
    id_, id_ok = task_id(c)
    ttl_ms, ttl_ok = c.pick(
        (
            (0, True),
            (c.integer(1, 200), True),
            (c.integer(1_000, 5_000), True),
            (MAX_TASK_TIMEOUT_MS, True),
            (MAX_TASK_TIMEOUT_MS + 1, False),
            (2**63 - 1, False),
            (-1, False),
            (-(2**63), False),
        )
    )
    body = encoded("RequestTaskSlotRequest", task_id=id_, ttl_ms=ttl_ms)
    # A reservation lapses: asked again, it may be SlotUncertain (ABORTED) for a moment.
    statuses = {OK, EXHAUSTED, ABORTED} if id_ok and ttl_ok else {INVALID}
    return HostileCall(
        what=f"RequestTaskSlot {id_[:24]!r} ttl {ttl_ms}",
        method=SERVICE + "RequestTaskSlot",
        shape=Shape.UNARY,
        bodies=(body,),
        statuses=frozenset(statuses),
        repeat=c.pick((False, False, True)) and (ttl_ms == 0 or ttl_ms >= 1_000),
    )


def submit_task(c: Choices) -> HostileCall:
    if c.pick((False,) * 9 + (True,)):
        return HostileCall(
            what="SubmitTask without a task",
            method=SERVICE + "SubmitTask",
            shape=Shape.UNARY,
            bodies=(encoded("SubmitTaskRequest", slot_id=c.pick(("", "slot-0"))),),
            statuses=frozenset({INVALID}),
        )
    spec = task_spec(c)
    slot_id = c.pick(("",) * 16 + ("slot-0", "slot-99", " ", "slot-\u00e9", "s" * 100_000))
    tasks: tuple[TaskExpectation, ...] = ()
    if not spec.valid:
        statuses = {INVALID}
    elif slot_id:  # a slot no task of this id reserved
        statuses = {PRECONDITION}
    else:
        statuses = {OK, EXHAUSTED}
        tasks = (TaskExpectation(task_id=spec.task_id, codes=spec.codes),)
    return HostileCall(
        what=f"SubmitTask {spec.what} slot {slot_id[:12]!r}",
        method=SERVICE + "SubmitTask",
        shape=Shape.UNARY,
        bodies=(encoded("SubmitTaskRequest", task=spec.message, slot_id=slot_id),),
        statuses=frozenset(statuses),
        tasks=tasks,
        repeat=c.pick((False, False, True)),
    )


def get_task_result(c: Choices) -> HostileCall:
    id_, id_ok = task_id(c)  # never submitted: fresh or invalid
    return HostileCall(
        what=f"GetTaskResult {id_[:24]!r}",
        method=SERVICE + "GetTaskResult",
        shape=Shape.UNARY,
        bodies=(encoded("GetTaskResultRequest", task_id=id_),),
        statuses=frozenset({NOT_FOUND if id_ok else INVALID}),
    )


def watch_tasks(c: Choices) -> HostileCall:
    kind = c.pick(("never submitted", "never submitted", "none", "too many"))
    drawn: list[tuple[str, bool]] = []
    match kind:
        case "never submitted":
            drawn = [task_id(c) for _ in range(c.integer(1, 4))]
        case "too many":
            drawn = [(f"w{c.serial()}", True) for _ in range(10_001)]
    ids = [id_ for id_, _ in drawn]
    ok = 1 <= len(drawn) <= 10_000 and all(valid for _, valid in drawn)
    status = NOT_FOUND if ok else INVALID
    return HostileCall(
        what=f"WatchTasks {kind} ({len(ids)} ids)",
        method=SERVICE + "WatchTasks",
        shape=Shape.SERVER_STREAM,
        bodies=(encoded("WatchTasksRequest", task_ids=ids),),
        statuses=frozenset({status}),
    )


def get_worker_status(c: Choices) -> HostileCall:
    return HostileCall(
        what="GetWorkerStatus",
        method=SERVICE + "GetWorkerStatus",
        shape=Shape.UNARY,
        bodies=(b"",),
        statuses=frozenset({OK}),
    )


def run_tasks(c: Choices) -> HostileCall:
    bodies: list[bytes] = []
    answers: list[tuple[frozenset[str], ...]] = []
    """Per body: the statuses each of its tasks' answers may have."""
    tasks: dict[str, TaskExpectation] = {}
    whats: list[str] = []
    for _ in range(c.integer(0, 4)):
        kind = c.pick(("spec", "spec", "spec", "bogus slot", "no task", "again", "batch"))
        if kind == "no task":
            bodies.append(encoded("RunTasksRequest"))
            answers.append((frozenset({INVALID}),))
        elif kind == "again" and bodies:
            index = c.integer(0, len(bodies) - 1)
            bodies.append(bodies[index])
            answers.append(answers[index])
        elif kind == "batch":
            items, answered = _run_batch(c, tasks, whats)
            bodies.append(encoded("RunTasksRequest", items=items))
            answers.append(answered or (frozenset({INVALID}),))  # no task at all: refused
        else:
            spec = task_spec(c)
            slot_id = "slot-99" if kind == "bogus slot" else ""
            bodies.append(encoded("RunTasksRequest", task=spec.message, slot_id=slot_id))
            answers.append((_run_answer(spec, slot_id, tasks),))
            whats.append(spec.what)
        whats.append(kind)
    statuses = frozenset({OK})
    if c.pick((False, False, False, True)):  # a body that is not a RunTasksRequest ends it
        at = c.integer(0, len(bodies))
        bodies.insert(at, b"\x0a\x05\x0a\x01")  # its task's task_id runs past the end
        answers = answers[:at]
        statuses = frozenset({INVALID})
        tasks = {
            id_: attrs.evolve(t, codes=t.codes | {FailureCode.WATCH_DISCONNECTED.value})
            for id_, t in tasks.items()
        }
    return HostileCall(
        what=f"RunTasks [{'; '.join(whats)}]",
        method=SERVICE + "RunTasks",
        shape=Shape.BIDI,
        bodies=tuple(bodies),
        statuses=statuses,
        answers=tuple(answer for body in answers for answer in body),
        tasks=tuple(tasks.values()),
    )


def _run_batch(
    c: Choices, tasks: dict[str, TaskExpectation], whats: list[str]
) -> tuple[list[Any], tuple[frozenset[str], ...]]:
    """The items of a batched RunTasks request (some without a task, some naming a slot
    that does not exist) and the statuses each may be answered with."""
    items: list[Any] = []
    answered: list[frozenset[str]] = []
    for _ in range(c.integer(0, 3)):
        if c.pick((False, False, False, True)):
            items.append(message("RunTasksItem"))
            answered.append(frozenset({INVALID}))
            continue
        spec = task_spec(c)
        slot_id = c.pick(("", "", "", "slot-99"))
        items.append(message("RunTasksItem", task=spec.message, slot_id=slot_id))
        answered.append(_run_answer(spec, slot_id, tasks))
        whats.append(spec.what)
    return items, tuple(answered)


def _run_answer(spec: Spec, slot_id: str, tasks: dict[str, TaskExpectation]) -> frozenset[str]:
    """The statuses a RunTasks answer to `spec` may have; a task it may admit goes to
    `tasks`."""
    if not spec.valid:
        return frozenset({INVALID})
    if slot_id:
        return frozenset({PRECONDITION})
    tasks.setdefault(spec.task_id, TaskExpectation(task_id=spec.task_id, codes=spec.codes))
    return frozenset({OK})


def other_method(c: Choices) -> HostileCall:
    """Methods the port does not serve, and the health check of services it does not know."""
    if c.pick((False, True)):
        service = c.pick(("", "blockx.worker.v1.WorkerService", "nope", c.text(PLAIN + UNICODE, 8)))
        known = service in ("", "blockx.worker.v1.WorkerService")
        return HostileCall(
            what=f"Health.Check {service!r}",
            method="/grpc.health.v1.Health/Check",
            shape=Shape.UNARY,
            bodies=(_string_field(1, service.encode()),),
            statuses=frozenset({OK if known else NOT_FOUND}),
        )
    path = c.pick(
        (
            SERVICE + "ReleaseTaskSlot",
            SERVICE + "submitTask",
            "/blockx.worker.v2.WorkerService/SubmitTask",
            "/grpc.health.v1.Health/Nope",
            "/" + c.text(PLAIN, 20),
        )
    )
    return HostileCall(
        what=f"unknown method {path!r}",
        method=path,
        shape=Shape.UNARY,
        bodies=(c.raw(32),),
        statuses=frozenset({UNIMPLEMENTED}),
    )


RPCS: Final = (
    request_task_slot,
    submit_task,
    submit_task,
    submit_task,
    get_task_result,
    watch_tasks,
    get_worker_status,
    run_tasks,
    run_tasks,
    other_method,
)


# --- the wire ------------------------------------------------------------------------------


def _varint(value: int) -> bytes:
    value &= (1 << 64) - 1
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _string_field(number: int, data: bytes) -> bytes:
    return _varint(number << 3 | 2) + _varint(len(data)) + data


def _padded(body: bytes, size: int) -> bytes:
    """`body` with an unknown field (number 999) that makes it exactly `size` bytes."""
    room = size - len(body) - len(_string_field(999, b""))
    filler = max(room - 4, 0)
    while len(body) + len(_string_field(999, b"x" * filler)) < size:
        filler += 1
    padded = body + _string_field(999, b"x" * filler)
    assert len(padded) == size, (len(padded), size)
    return padded


NO_REQUEST: Final = {
    SERVICE + "RequestTaskSlot": INVALID,
    SERVICE + "SubmitTask": INVALID,
    SERVICE + "GetTaskResult": INVALID,
    SERVICE + "WatchTasks": INVALID,
    SERVICE + "GetWorkerStatus": OK,
    "/grpc.health.v1.Health/Check": OK,
}
"""What an empty body (every field at its default) is answered with, by method."""
FIELD_ONE_IS_TEXT: Final = frozenset(
    {SERVICE + name for name in ("RequestTaskSlot", "SubmitTask", "GetTaskResult", "WatchTasks")}
    | {"/grpc.health.v1.Health/Check"}
)


def with_wire_faults(c: Choices, call: HostileCall) -> HostileCall:
    """`call` with its one body spoiled in one of the ways protobuf allows or forbids,
    and its deadline drawn (tiny ones may end any call with DEADLINE_EXCEEDED)."""
    timeout_s = c.pick((DEADLINE_S,) * 8 + (1e-6, 0.002))
    if timeout_s < DEADLINE_S:
        call = attrs.evolve(call, timeout_s=timeout_s, statuses=call.statuses | {DEADLINE})
    if call.shape is Shape.BIDI or call.method not in NO_REQUEST:
        return call
    (body,) = call.bodies
    fault = c.pick(("none",) * 12 + ("unknown field", "at the limit", "over the limit"))
    if call.method in FIELD_ONE_IS_TEXT:
        fault = c.pick((fault,) * 15 + ("bad utf-8", "cut short", "group", "empty", "garbage"))
    if call.method == SERVICE + "SubmitTask":
        fault = c.pick((fault,) * 19 + ("nested groups",))
    match fault:
        case "unknown field":
            number = c.integer(20, 2**29 - 1)
            return attrs.evolve(call, bodies=(body + _string_field(number, c.raw(8)),))
        case "at the limit" if len(body) < MAX_MESSAGE_BYTES - 16:
            return attrs.evolve(call, bodies=(_padded(body, MAX_MESSAGE_BYTES),))
        case "over the limit":
            size = MAX_MESSAGE_BYTES + c.integer(1, 64)
            return _refused(call, _padded(body, max(size, len(body) + 16)), EXHAUSTED)
        case "bad utf-8":
            # Field 1 again, holding bytes that are not UTF-8: task_id, task_ids[n],
            # or (SubmitTask) a TaskSpec whose task_id merges into the task's.
            bad = c.pick((b"\xff", b"\xc3", b"\xed\xa0\x80"))
            inner = _string_field(1, bad) if call.method == SERVICE + "SubmitTask" else bad
            spoiled = body + _string_field(1, inner)
        case "cut short":
            spoiled = body + _varint(15 << 3 | 2) + _varint(100) + b"x" * c.integer(0, 99)
        case "group":
            spoiled = body + _varint(20 << 3 | 3)
        case "nested groups":
            # Unknown groups nested inside the task: protobuf reads 100 levels deep.
            depth = c.pick((50, 100_000))
            groups = _varint(9 << 3 | 3) * depth + _varint(9 << 3 | 4) * depth
            nested = body + _string_field(1, groups)  # merges into the task
            if depth <= 100:
                return attrs.evolve(call, bodies=(nested,))
            spoiled = nested
        case "empty":
            return _refused(call, b"", NO_REQUEST[call.method])
        case "garbage":  # anything may come of it, but precisely; tasks are read from replies
            return attrs.evolve(
                call, bodies=(c.raw(64),), statuses=PRECISE_STATUSES, tasks=(), repeat=False
            )
        case _:
            return call
    return _refused(call, spoiled, INVALID)


def _refused(call: HostileCall, body: bytes, status: str) -> HostileCall:
    """`call` sending `body` instead, which is answered with `status` and admits nothing."""
    return attrs.evolve(
        call,
        bodies=(body,),
        statuses=frozenset({status}) | (call.statuses & {DEADLINE}),
        tasks=(),
        repeat=False,
    )


def hostile_call(c: Choices) -> HostileCall:
    return with_wire_faults(c, c.pick(RPCS)(c))


def hostile_calls(serials: Iterator[int]) -> st.SearchStrategy[HostileCall]:
    """The Hypothesis strategy: every call's ids are unique within `serials`' run."""
    return st.composite(lambda draw: hostile_call(DrawnChoices(draw, serials)))()
