"""The pure parts of discovery: heartbeat JSON, the directory view, the placement order.

No etcd here: the directory is fed the snapshots and key events the etcd
client would produce. Every directory test ends with `check_invariants()`.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable

import attrs
import pytest
from hypothesis import given
from hypothesis import strategies as st

from blockx.discovery import (
    JSON_KEYS,
    InvalidEtcdEndpoint,
    KeyEvent,
    KeyEventKind,
    MalformedHeartbeat,
    WorkerDirectory,
    WorkerHeartbeat,
    heartbeat_of,
    parse_endpoint,
    prefix_range_end,
)
from blockx.executors import ExecutorState, ExecutorView
from blockx.identity import WorkerIdentity
from blockx.slots import Heartbeat

PREFIX = "/blockx/workers/"
COUNT = st.integers(min_value=0, max_value=2**53)


def beat(address: str, *, free: int, total: int = 4, draining: bool = False) -> WorkerHeartbeat:
    return WorkerHeartbeat(
        address=address,
        deployment="block",
        slots_total=total,
        reserved_slots=0,
        running_tasks=total - free,
        free_slots=free,
        executors_healthy=2,
        draining=draining,
        version="0.1.0",
        started_at_ms=1_700_000_000_000,
    )


def put(worker: WorkerHeartbeat, revision: int) -> KeyEvent:
    return KeyEvent(
        kind=KeyEventKind.PUT,
        key=PREFIX + worker.address,
        mod_revision=revision,
        value=worker.to_json(),
    )


def delete(address: str, revision: int) -> KeyEvent:
    return KeyEvent(kind=KeyEventKind.DELETE, key=PREFIX + address, mod_revision=revision)


def addresses(workers: tuple[WorkerHeartbeat, ...]) -> list[str]:
    return [worker.address for worker in workers]


# --- heartbeat JSON ------------------------------------------------------------------------


heartbeats = st.builds(
    WorkerHeartbeat,
    address=st.text(min_size=1),
    deployment=st.text(),
    slots_total=COUNT,
    reserved_slots=COUNT,
    running_tasks=COUNT,
    free_slots=COUNT,
    executors_healthy=COUNT,
    draining=st.booleans(),
    version=st.text(),
    started_at_ms=COUNT,
    slots_granted=COUNT,
)


@given(heartbeats)
def test_a_heartbeat_survives_its_json_round_trip(heartbeat: WorkerHeartbeat) -> None:
    assert WorkerHeartbeat.from_json(heartbeat.to_json()) == heartbeat


def test_the_json_has_the_documented_camel_case_keys_in_order() -> None:
    document = json.loads(beat("10.0.0.5:8081", free=3).to_json())

    assert (
        tuple(document)
        == JSON_KEYS
        == (
            "address",
            "deployment",
            "slotsTotal",
            "reservedSlots",
            "runningTasks",
            "freeSlots",
            "executorsHealthy",
            "draining",
            "version",
            "startedAtMs",
            "slotsGranted",
        )
    )
    assert document == {
        "address": "10.0.0.5:8081",
        "deployment": "block",
        "slotsTotal": 4,
        "reservedSlots": 0,
        "runningTasks": 1,
        "freeSlots": 3,
        "executorsHealthy": 2,
        "draining": False,
        "version": "0.1.0",
        "startedAtMs": 1_700_000_000_000,
        "slotsGranted": 0,
    }


def test_a_heartbeat_without_the_keys_an_earlier_worker_did_not_write_reads_as_zero() -> None:
    document = json.loads(attrs.evolve(beat("a:1", free=1), slots_granted=5).to_json())
    del document["slotsGranted"]

    assert WorkerHeartbeat.from_json(json.dumps(document).encode()) == beat("a:1", free=1)


def test_unknown_keys_from_a_newer_worker_are_ignored() -> None:
    document = json.loads(beat("a:1", free=1).to_json())
    document["gpuSlots"] = 8

    assert WorkerHeartbeat.from_json(json.dumps(document).encode()) == beat("a:1", free=1)


@pytest.mark.parametrize(
    ("change", "key", "allowed"),
    [
        ({"freeSlots": None}, "freeSlots", "must be an integer >= 0"),
        ({"freeSlots": -1}, "freeSlots", "must be an integer >= 0"),
        ({"freeSlots": True}, "freeSlots", "must be an integer >= 0"),
        ({"freeSlots": "3"}, "freeSlots", "must be an integer >= 0"),
        ({"draining": "no"}, "draining", "must be a boolean"),
        ({"address": 8081}, "address", "must be a string"),
        ({"address": ""}, "address", "must not be empty"),
    ],
)
def test_a_wrong_field_is_named(change: dict[str, object], key: str, allowed: str) -> None:
    document = json.loads(beat("a:1", free=1).to_json())
    document.update(change)

    with pytest.raises(MalformedHeartbeat) as caught:
        WorkerHeartbeat.from_json(json.dumps(document).encode())

    assert (caught.value.field, caught.value.allowed) == (key, allowed)


def test_a_missing_field_is_named() -> None:
    document = json.loads(beat("a:1", free=1).to_json())
    del document["version"]

    with pytest.raises(MalformedHeartbeat) as caught:
        WorkerHeartbeat.from_json(json.dumps(document).encode())

    assert (caught.value.field, caught.value.allowed) == ("version", "is required")


@pytest.mark.parametrize("value", [b"", b"not json", b"\xff\xfe", b"[1, 2]", b'"text"'])
def test_a_value_that_is_not_a_json_object_is_refused(value: bytes) -> None:
    with pytest.raises(MalformedHeartbeat) as caught:
        WorkerHeartbeat.from_json(value)

    assert caught.value.field == "(value)"


def test_the_heartbeat_is_derived_from_the_slot_table_and_the_healthy_executors() -> None:
    capacity = Heartbeat(
        at_ms=5_000,
        slots_total=8,
        reserved_slots=2,
        running_tasks=3,
        free_slots=3,
        active_tasks=3,
        draining=True,
        ready=True,
        slots_granted=17,
    )
    views = [
        ExecutorView(
            executor_id=f"executor-{state.name}",
            state=state,
            pid=None,
            rss_bytes=0,
            calls_served=0,
            restarts=0,
            running_call_id=None,
        )
        for state in ExecutorState
    ]

    identity = WorkerIdentity(
        worker_addr="10.0.0.5:8081", deployment="bundle", version="1.2.3", started_at_ms=1_000
    )

    heartbeat = heartbeat_of(capacity, identity, views)

    assert heartbeat == WorkerHeartbeat(
        address="10.0.0.5:8081",
        deployment="bundle",
        slots_total=8,
        reserved_slots=2,
        running_tasks=3,
        free_slots=3,
        executors_healthy=2,  # READY and BUSY
        draining=True,
        version="1.2.3",
        started_at_ms=1_000,
        slots_granted=17,
    )


# --- the directory -------------------------------------------------------------------------


def test_a_snapshot_then_puts_and_deletes_keep_the_view() -> None:
    directory = WorkerDirectory(prefix=PREFIX)
    rejected = directory.reset(
        revision=10,
        entries=[
            (PREFIX + "a:1", beat("a:1", free=4).to_json(), 7),
            (PREFIX + "b:1", beat("b:1", free=2).to_json(), 9),
        ],
    )
    assert rejected == []
    assert addresses(directory.workers()) == ["a:1", "b:1"]

    directory.apply([put(beat("b:1", free=0), 11), put(beat("c:1", free=1), 11)])
    directory.apply([delete("a:1", 12)])

    assert directory.workers() == (beat("b:1", free=0), beat("c:1", free=1))
    assert directory.revision == 12
    directory.check_invariants()


def test_events_the_view_already_reflects_are_skipped() -> None:
    directory = WorkerDirectory(prefix=PREFIX)
    directory.reset(revision=10, entries=[(PREFIX + "a:1", beat("a:1", free=4).to_json(), 10)])

    directory.apply([delete("a:1", 9), put(beat("a:1", free=0), 10)])

    assert directory.workers() == (beat("a:1", free=4),)
    assert directory.revision == 10
    directory.check_invariants()


def test_a_malformed_value_removes_the_worker_and_is_reported() -> None:
    directory = WorkerDirectory(prefix=PREFIX)
    directory.reset(revision=3, entries=[(PREFIX + "a:1", beat("a:1", free=4).to_json(), 3)])

    rejected = directory.apply(
        [KeyEvent(kind=KeyEventKind.PUT, key=PREFIX + "a:1", mod_revision=4, value=b"{}")]
    )

    assert [(problem.key, problem.error.field) for problem in rejected] == [
        (PREFIX + "a:1", "address")
    ]
    assert directory.workers() == ()
    assert directory.revision == 4
    directory.check_invariants()


def test_a_malformed_value_in_a_snapshot_is_reported_and_the_rest_kept() -> None:
    directory = WorkerDirectory(prefix=PREFIX)
    rejected = directory.reset(
        revision=5,
        entries=[
            (PREFIX + "bad", b"garbage", 4),
            (PREFIX + "a:1", beat("a:1", free=1).to_json(), 5),
        ],
    )

    assert [problem.key for problem in rejected] == [PREFIX + "bad"]
    assert addresses(directory.workers()) == ["a:1"]
    directory.check_invariants()


def test_keys_outside_the_prefix_are_ignored() -> None:
    directory = WorkerDirectory(prefix=PREFIX)
    outside = KeyEvent(
        kind=KeyEventKind.PUT,
        key="/blockx/bundle-workers/a:1",
        mod_revision=2,
        value=beat("a:1", free=1).to_json(),
    )

    assert directory.apply([outside]) == []
    assert directory.workers() == ()
    directory.check_invariants()


# --- the placement order -------------------------------------------------------------------


def fleet(*workers: WorkerHeartbeat, draw: Callable[[], float] = random.random) -> WorkerDirectory:
    directory = WorkerDirectory(prefix=PREFIX, draw=draw)
    directory.reset(
        revision=len(workers),
        entries=[
            (PREFIX + worker.address, worker.to_json(), revision)
            for revision, worker in enumerate(workers, start=1)
        ],
    )
    return directory


def test_most_free_slots_first_skipping_draining_and_full_workers() -> None:
    directory = fleet(
        beat("a:1", free=1),
        beat("b:1", free=3),
        beat("c:1", free=4, draining=True),
        beat("d:1", free=0),
        beat("e:1", free=2),
    )

    assert addresses(directory.placement_order()) == ["b:1", "e:1", "a:1"]
    directory.check_invariants()


def test_ties_go_to_fewer_running_tasks_then_are_drawn() -> None:
    draws = iter([0.9, 0.5, 0.1, 0.2, 0.5, 0.8])
    directory = fleet(
        beat("c:1", free=2, total=4),
        beat("b:1", free=2, total=2),
        beat("a:1", free=2, total=4),
        draw=lambda: next(draws),
    )

    # Drawn in the order the view holds them (c, b, a): c 0.9, b 0.5, a 0.1.
    assert addresses(directory.placement_order()) == ["b:1", "a:1", "c:1"]
    # b runs none and leads whatever it draws; c draws 0.2 and a 0.8 this time.
    assert addresses(directory.placement_order()) == ["b:1", "c:1", "a:1"]


def test_a_placement_counts_against_a_worker_until_its_next_heartbeat() -> None:
    directory = fleet(beat("a:1", free=2), beat("b:1", free=2))

    directory.note_placed("a:1")
    assert addresses(directory.placement_order()) == ["b:1", "a:1"]
    directory.note_placed("b:1")
    directory.note_placed("b:1")
    assert addresses(directory.placement_order()) == ["a:1"]
    directory.check_invariants()

    directory.apply([put(beat("b:1", free=1), 3)])  # b's next heartbeat: the truth again

    assert [(w.address, directory.free_slots(w.address)) for w in directory.workers()] == [
        ("a:1", 1),
        ("b:1", 1),
    ]
    directory.check_invariants()


def test_a_placement_on_a_worker_that_left_is_not_counted() -> None:
    directory = fleet(beat("a:1", free=2))
    directory.apply([delete("a:1", 2)])

    directory.note_placed("a:1")

    assert directory.placement_order() == ()
    directory.check_invariants()


def test_an_empty_or_drained_fleet_has_no_candidates() -> None:
    assert fleet().placement_order() == ()
    assert fleet(beat("a:1", free=4, draining=True)).placement_order() == ()


# --- endpoints and ranges ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("endpoint", "expected"),
    [
        ("127.0.0.1:2379", ("127.0.0.1", 2379)),
        ("http://etcd-0.local:2379/", ("etcd-0.local", 2379)),
        ("[::1]:23790", ("::1", 23790)),
    ],
)
def test_endpoints_parse(endpoint: str, expected: tuple[str, int]) -> None:
    assert parse_endpoint(endpoint) == expected


@pytest.mark.parametrize("endpoint", ["localhost", ":2379", "host:0", "host:x", "https://h:2379"])
def test_a_wrong_endpoint_is_refused(endpoint: str) -> None:
    with pytest.raises(InvalidEtcdEndpoint) as caught:
        parse_endpoint(endpoint)

    assert caught.value.value == endpoint


def test_a_prefix_range_ends_just_past_the_prefix() -> None:
    assert prefix_range_end(b"/blockx/workers/") == b"/blockx/workers0"
    assert prefix_range_end(b"a\xff") == b"b"
    assert prefix_range_end(b"\xff\xff") == b"\0"
