"""The heartbeat a worker publishes in etcd: its value type and its JSON form.

Owns `WorkerHeartbeat` (what a coordinator learns about one worker), its
JSON encoding (camelCase keys, one object per etcd value) and the strict
parser that coordinators use. The heartbeat is a view derived from the slot
table (`blockx.slots.Heartbeat`) and the executor pool; this module never
reads a clock, a socket or any state of its own.
"""

from __future__ import annotations

import json
from collections.abc import Iterable

import attrs

from blockx.errors import InvalidValue, shown
from blockx.executors import ExecutorState, ExecutorView
from blockx.identity import WorkerIdentity
from blockx.slots import Heartbeat

HEALTHY_EXECUTOR_STATES = frozenset({ExecutorState.READY, ExecutorState.BUSY})


class MalformedHeartbeat(InvalidValue):
    """An etcd value is not a worker heartbeat: `field` is the JSON key at fault."""

    def describe(self) -> str:
        return f"heartbeat {self.field} = {shown(self.value)}: {self.allowed}"


def _non_negative(instance: object, attribute: attrs.Attribute[int], value: int) -> None:
    if value < 0:
        raise ValueError(f"{attribute.name} must be >= 0, not {value}")


@attrs.frozen(kw_only=True)
class WorkerHeartbeat:
    """One worker as its etcd key describes it."""

    address: str
    """host:port that coordinators call; also the suffix of the worker's key."""
    deployment: str
    slots_total: int = attrs.field(validator=_non_negative)
    reserved_slots: int = attrs.field(validator=_non_negative)
    running_tasks: int = attrs.field(validator=_non_negative)
    free_slots: int = attrs.field(validator=_non_negative)
    executors_healthy: int = attrs.field(validator=_non_negative)
    draining: bool
    version: str
    started_at_ms: int = attrs.field(validator=_non_negative)
    slots_granted: int = attrs.field(default=0, validator=_non_negative)
    """Slot reservations granted since the worker started. The registrar puts a heartbeat
    only when it changed, and a coordinator counts its placements against a worker until
    the worker's next put: this makes every placement a change, even one whose task ended
    before the registrar looked. 0 from a worker that does not publish it."""

    def to_json(self) -> bytes:
        """The etcd value: compact JSON with the keys of `JSON_KEYS`."""
        document = {key: getattr(self, name) for key, name, _ in _FIELDS}
        return json.dumps(document, separators=(",", ":")).encode()

    @classmethod
    def from_json(cls, data: bytes) -> WorkerHeartbeat:
        """Parse an etcd value; unknown keys are ignored (a newer worker may add some).

        Raises MalformedHeartbeat naming the key that is missing or wrong.
        """
        try:
            document = json.loads(data)
        except (UnicodeDecodeError, ValueError) as error:
            raise MalformedHeartbeat(
                field="(value)", value=data, allowed=f"must be JSON ({error})"
            ) from error
        if not isinstance(document, dict):
            raise MalformedHeartbeat(field="(value)", value=document, allowed="must be an object")
        values: dict[str, object] = {}
        for key, name, kind in _FIELDS:
            if key not in document:
                if key in _OPTIONAL_KEYS:
                    continue
                raise MalformedHeartbeat(field=key, value=None, allowed="is required")
            value = document[key]
            if kind is int:
                if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                    raise MalformedHeartbeat(
                        field=key, value=value, allowed="must be an integer >= 0"
                    )
            elif not isinstance(value, kind):
                raise MalformedHeartbeat(
                    field=key, value=value, allowed=f"must be a {_NAMES[kind]}"
                )
            values[name] = value
        if not values["address"]:
            raise MalformedHeartbeat(field="address", value="", allowed="must not be empty")
        return cls(**values)  # type: ignore[arg-type]


_FIELDS: tuple[tuple[str, str, type], ...] = (
    ("address", "address", str),
    ("deployment", "deployment", str),
    ("slotsTotal", "slots_total", int),
    ("reservedSlots", "reserved_slots", int),
    ("runningTasks", "running_tasks", int),
    ("freeSlots", "free_slots", int),
    ("executorsHealthy", "executors_healthy", int),
    ("draining", "draining", bool),
    ("version", "version", str),
    ("startedAtMs", "started_at_ms", int),
    ("slotsGranted", "slots_granted", int),
)
JSON_KEYS = tuple(key for key, _, _ in _FIELDS)
"""The keys of a heartbeat's JSON object, in the order they are written."""
_OPTIONAL_KEYS = frozenset({"slotsGranted"})
"""Keys a worker of an earlier version does not write: their field keeps its default."""
_NAMES = {str: "string", bool: "boolean"}


def healthy_executors(views: Iterable[ExecutorView]) -> int:
    """How many executors can take a call now (ready or busy)."""
    return sum(1 for view in views if view.state in HEALTHY_EXECUTOR_STATES)


def heartbeat_of(
    capacity: Heartbeat, identity: WorkerIdentity, executors: Iterable[ExecutorView]
) -> WorkerHeartbeat:
    """The heartbeat of the worker `identity` whose slot table reports `capacity`."""
    return WorkerHeartbeat(
        address=identity.worker_addr,
        deployment=identity.deployment,
        slots_total=capacity.slots_total,
        reserved_slots=capacity.reserved_slots,
        running_tasks=capacity.running_tasks,
        free_slots=capacity.free_slots,
        executors_healthy=healthy_executors(executors),
        draining=capacity.draining,
        version=identity.version,
        started_at_ms=identity.started_at_ms,
        slots_granted=capacity.slots_granted,
    )
