"""The watch fan-out and its streams: bounded buffers and first/last stream bookkeeping;
the retained snapshots the slot table publishes beside them."""

from __future__ import annotations

import pytest
import trio
import trio.testing

from blockx.actors import (
    Inbox,
    RetainedSnapshots,
    SlotTableMessage,
    TaskStream,
    WatchChanged,
    WatchFanout,
    WatchStream,
    _streams,
)
from blockx.slots import NotFound, TaskPhase, TaskResult, TaskSnapshot, TaskState


def new_fanout() -> tuple[WatchFanout, Inbox[SlotTableMessage]]:
    """A fan-out, and the slot table's inbox it tells."""
    slot_table = Inbox[SlotTableMessage]()
    return WatchFanout(slot_table=slot_table), slot_table


def told(slot_table: Inbox[SlotTableMessage]) -> list[SlotTableMessage]:
    """Everything the fan-out has told the slot table so far."""
    messages: list[SlotTableMessage] = []
    while True:
        try:
            messages.append(slot_table.receive.receive_nowait())
        except trio.WouldBlock:
            return messages


def running(task_id: str, phase: TaskPhase) -> TaskSnapshot:
    return TaskSnapshot(task_id=task_id, slot_id="slot-0", state=TaskState.RUNNING, phase=phase)


def ended(task_id: str) -> TaskSnapshot:
    return TaskSnapshot.of_result(
        TaskResult(
            task_id=task_id, slot_id="slot-0", state=TaskState.SUCCEEDED, phase=TaskPhase.PLUGIN
        )
    )


def test_a_slow_reader_holds_one_pending_update_per_task_and_keeps_the_terminal_one() -> None:
    wakes: list[int] = []
    stream = WatchStream(["a", "b"], wake=lambda: wakes.append(1))
    for _ in range(10_000):
        stream.offer(running("a", TaskPhase.CALLS))
    stream.offer(running("b", TaskPhase.BUILDER))
    stream.offer(ended("b"))
    stream.offer(running("b", TaskPhase.CALLS))  # after the terminal one: ignored
    taken = stream.take()
    assert [(s.task_id, s.state) for s in taken] == [
        ("a", TaskState.RUNNING),
        ("b", TaskState.SUCCEEDED),
    ]
    states = [stream.finished]
    assert stream.following == {"a"}
    stream.offer(ended("a"))
    states.append(stream.finished)  # the terminal update is still to be taken
    assert [s.task_id for s in stream.take()] == ["a"]
    states.append(stream.finished)
    assert states == [False, False, True]
    assert len(wakes) == 10_003


def test_the_hub_reports_first_and_last_streams_per_task() -> None:
    fanout, slot_table = new_fanout()
    one = WatchStream(["t"], wake=lambda: None)
    two = WatchStream(["t", "u"], wake=lambda: None)
    fanout.subscribe(one, (running("t", TaskPhase.CALLS),))
    fanout.subscribe(two, ())
    assert fanout.open_streams == 2
    fanout.unsubscribe(one, broken=True)
    fanout.unsubscribe(two, broken=True)
    assert told(slot_table) == [
        WatchChanged(task_id="t", attached=True),
        WatchChanged(task_id="u", attached=True),
        WatchChanged(task_id="t", attached=False, broken=True),
        WatchChanged(task_id="u", attached=False, broken=True),
    ]
    assert [s.task_id for s in one.take()] == ["t"]
    assert fanout.open_streams == 0


def test_a_terminal_update_ends_the_count_without_a_detach() -> None:
    fanout, slot_table = new_fanout()
    stream = WatchStream(["t"], wake=lambda: None)
    fanout.subscribe(stream, ())
    fanout.publish(ended("t"))
    fanout.unsubscribe(stream, broken=False)
    assert told(slot_table) == [WatchChanged(task_id="t", attached=True)]
    assert stream.take()[0].is_terminal
    assert stream.finished


async def test_a_forgotten_task_fails_its_streams_and_close_all_ends_the_rest() -> None:
    fanout, _ = new_fanout()
    gone = WatchStream(["r"], wake=lambda: None)
    other = WatchStream(["s"], wake=lambda: None)
    fanout.subscribe(gone, ())
    fanout.subscribe(other, ())
    fanout.forget("r")
    fanout.close_all()
    assert isinstance(gone.error, NotFound)
    assert gone.finished
    assert other.closed
    assert other.finished
    async with trio.open_nursery() as nursery:
        nursery.start_soon(fanout.all_closed)
        await trio.testing.wait_all_tasks_blocked()
        assert fanout.open_streams == 1  # still waiting for the last reader
        fanout.unsubscribe(other, broken=False)
    assert fanout.open_streams == 0


def test_a_stream_abandoned_before_it_was_subscribed_is_never_followed() -> None:
    fanout, slot_table = new_fanout()
    stream = WatchStream(["t"], wake=lambda: None)
    # The reader left while its OpenWatch was still queued at the slot table.
    stream.abandoned = True
    fanout.unsubscribe(stream, broken=True)
    fanout.subscribe(stream, (running("t", TaskPhase.CALLS),))
    assert told(slot_table) == []
    assert fanout.open_streams == 0


def test_a_run_stream_ends_each_task_id_once_and_remembers_a_bounded_number(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(_streams, "ENDED_KEPT", 2)
    stream = TaskStream(wake=lambda: None, room=lambda: None, window=64)
    for task_id in ("a", "b", "c"):  # each ends: a terminal answer (already ended elsewhere)
        stream.answer(stream.posted(), task_id, ended(task_id))
    stream.answer(stream.posted(), "c", ended("c"))  # remembered: answered, not ended again
    stream.answer(stream.posted(), "a", ended("a"))  # forgotten (only 2 kept): ends again
    kinds = [(type(event).__name__, event.snapshot.task_id) for event in stream.take()]  # type: ignore[union-attr]
    assert kinds == [
        ("Accepted", "a"),
        ("Finished", "a"),
        ("Accepted", "b"),
        ("Finished", "b"),
        ("Accepted", "c"),
        ("Finished", "c"),
        ("Accepted", "c"),
        ("Accepted", "a"),
        ("Finished", "a"),
    ]


def test_a_run_stream_whose_events_are_not_taken_is_full_until_they_are() -> None:
    # A client that writes submits and never reads its answers: every submit is
    # answered at once, so none stays unanswered, and the events once piled up
    # without end (0.8 KiB a task) while the reader went on reading.
    rooms: list[None] = []
    stream = TaskStream(wake=lambda: None, room=lambda: rooms.append(None), window=4)
    for n in range(2):
        stream.answer(stream.posted(), f"t{n}", running(f"t{n}", TaskPhase.CALLS))
        stream.offer(ended(f"t{n}"))
    assert (stream.unanswered, stream.full, rooms) == (0, True, [])  # 4 events waiting
    assert len(stream.take()) == 4
    assert (stream.full, rooms) == (False, [None])

    for _ in range(4):  # the window of unanswered submits still holds
        stream.posted()
    assert stream.full
    stream.answer(0, "u0", running("u0", TaskPhase.CALLS))
    assert (stream.full, rooms) == (False, [None, None])


def test_retained_snapshots_answer_only_for_every_id_they_hold_in_order_once_each() -> None:
    retained = RetainedSnapshots()
    retained.retained(ended("a"))
    retained.retained(ended("b"))
    assert retained.get("a") == ended("a")
    assert retained.get("c") is None
    assert retained.all_of(["b", "a", "b"]) == [ended("b"), ended("a")]
    assert retained.all_of(["a", "c"]) is None  # one unknown: the actor answers for all
    retained.forgotten("a")
    retained.forgotten("never-held")
    assert retained.get("a") is None
    assert retained.all_of(["b"]) == [ended("b")]


def test_retained_snapshots_keep_the_newest_up_to_their_capacity() -> None:
    retained = RetainedSnapshots(capacity=2)
    for task_id in ("a", "b", "a", "c"):  # "a" again: the newest before "c"
        retained.retained(ended(task_id))
    assert len(retained) == 2
    assert retained.get("b") is None
    assert [retained.get(task_id) for task_id in ("a", "c")] == [ended("a"), ended("c")]
