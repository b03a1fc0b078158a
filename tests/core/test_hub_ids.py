"""The hub's task and attempt ids sort in the order they were made (`TimeOrderedIds`)."""

from __future__ import annotations

from blockx.hub._ops import TimeOrderedIds


def maker(times_ms: list[int]) -> TimeOrderedIds:
    readings = iter(times_ms)
    return TimeOrderedIds(lambda: next(readings))


def test_ids_of_one_millisecond_sort_in_the_order_they_were_made() -> None:
    ids = maker([5_000] * 50)
    made = [ids() for _ in range(50)]
    assert made == sorted(made)
    assert len(set(made)) == 50
    assert {made_id[:12] for made_id in made} == {f"{5_000:012x}"}
    assert [int(made_id[12:16], 16) for made_id in made] == list(range(50))


def test_a_new_millisecond_starts_the_counter_again() -> None:
    ids = maker([7, 7, 9])
    first, second, third = ids(), ids(), ids()
    assert (first[:16], second[:16]) == (f"{7:012x}0000", f"{7:012x}0001")
    assert third[:16] == f"{9:012x}0000"
    assert len(third) == 32


def test_a_clock_that_steps_back_still_gives_later_ids() -> None:
    ids = maker([100, 40])
    first, second = ids(), ids()
    assert second > first
    assert second[:16] == f"{100:012x}0001"


def test_a_full_millisecond_borrows_from_the_next() -> None:
    ids = maker([3] * 0x10001)
    made = [ids() for _ in range(0x10001)]
    assert made[-2][:16] == f"{3:012x}ffff"
    assert made[-1][:16] == f"{4:012x}0000"
    assert made == sorted(made)


def test_submission_order_numbers_share_the_ids_time_and_counter() -> None:
    ids = maker([7, 7, 9])
    first, made, third = ids.seq(), ids(), ids.seq()
    assert first == 7 * 65_536
    assert int(made[:16], 16) == first + 1
    assert third == 9 * 65_536
