"""The status page's task history: per-second points at explicit times."""

from __future__ import annotations

from blockx.observability.history import HISTORY_S, STEP_MS, HistoryWindow, TaskHistory

START_MS = 1_700_000_000_000  # a whole second


def finish(
    history: TaskHistory, at_ms: int, total_ms: int, *, ok: bool = True, calls: int = 1
) -> None:
    history.record(at_ms, succeeded=ok, total_ms=total_ms, calls=calls)


def test_a_new_history_has_no_whole_second_yet() -> None:
    history = TaskHistory(START_MS + 400)
    window = history.window(START_MS + 999)
    assert window == HistoryWindow(
        start_ms=START_MS, succeeded=(), failed=(), calls=(), p50_ms=(), p99_ms=()
    )
    assert window.end_ms == START_MS


def test_each_whole_second_is_one_point_and_the_open_one_is_not_shown() -> None:
    history = TaskHistory(START_MS)
    finish(history, START_MS + 10, 40, calls=3)
    finish(history, START_MS + 900, 60, ok=False, calls=2)
    finish(history, START_MS + 2_500, 7)  # the third second: nothing in the second one
    window = history.window(START_MS + 2_600)
    assert window == HistoryWindow(
        start_ms=START_MS,
        succeeded=(1, 0),
        failed=(1, 0),
        calls=(5, 0),
        p50_ms=(40, None),
        p99_ms=(60, None),
    )
    assert window.end_ms == START_MS + 2 * STEP_MS
    later = history.window(START_MS + 3_000)
    assert (later.succeeded, later.p50_ms, later.p99_ms) == (
        (1, 0, 1),
        (40, None, 7),
        (60, None, 7),
    )


def test_percentiles_are_nearest_rank_over_the_tasks_of_the_second() -> None:
    history = TaskHistory(START_MS)
    for total_ms in reversed(range(1, 201)):  # 200 tasks, 200 ms down to 1 ms
        finish(history, START_MS + 500, total_ms)
    window = history.window(START_MS + 1_000)
    assert (window.succeeded, window.calls) == ((200,), (200,))
    assert (window.p50_ms, window.p99_ms) == ((100,), (198,))


def test_the_window_keeps_the_last_history_s_seconds_and_forgets_older_ones() -> None:
    history = TaskHistory(START_MS)
    finish(history, START_MS, 5)  # second 0
    finish(history, START_MS + 10_000, 6)  # second 10
    now_ms = START_MS + (HISTORY_S + 5) * STEP_MS
    window = history.window(now_ms)
    assert window.start_ms == START_MS + 5 * STEP_MS
    assert len(window.succeeded) == HISTORY_S
    assert window.succeeded[5] == 1  # second 10 is still in
    assert sum(window.succeeded) == 1
    assert window.p50_ms[5] == 6
    # Ten minutes of nothing: the ring holds no second of the old ones.
    quiet = history.window(now_ms + 2 * HISTORY_S * STEP_MS)
    assert sum(quiet.succeeded) == 0
    assert set(quiet.p99_ms) == {None}


def test_a_reused_place_of_the_ring_starts_from_zero() -> None:
    history = TaskHistory(START_MS, seconds=3)  # a ring of four places
    finish(history, START_MS, 10, calls=4)
    finish(history, START_MS + 4 * STEP_MS, 20)  # the same place as second 0
    window = history.window(START_MS + 5 * STEP_MS)
    assert window.start_ms == START_MS + 2 * STEP_MS
    assert (window.succeeded, window.calls, window.p50_ms) == (
        (0, 0, 1),
        (0, 0, 1),
        (None, None, 20),
    )


def test_since_gives_only_the_seconds_not_sent_yet() -> None:
    history = TaskHistory(START_MS)
    finish(history, START_MS + 100, 10)
    first = history.window(START_MS + 1_200)
    assert first.succeeded == (1,)
    assert history.window(START_MS + 1_900, since_ms=first.end_ms).succeeded == ()
    finish(history, START_MS + 1_950, 11)
    update = history.window(START_MS + 3_100, since_ms=first.end_ms)
    assert (update.start_ms, update.succeeded, update.p50_ms) == (
        first.end_ms,
        (1, 0),
        (11, None),
    )


def test_time_never_goes_back_a_late_task_counts_in_the_open_second() -> None:
    history = TaskHistory(START_MS)
    finish(history, START_MS + 1_500, 30)
    finish(history, START_MS + 800, 90)  # stamped in a second already over
    window = history.window(START_MS + 2_000)
    assert (window.succeeded, window.p50_ms, window.p99_ms) == ((0, 2), (None, 30), (None, 90))


def test_a_window_read_closes_the_second_a_later_task_does_not_reopen_it() -> None:
    history = TaskHistory(START_MS)
    finish(history, START_MS + 100, 10)
    assert history.window(START_MS + 1_000).p50_ms == (10,)
    finish(history, START_MS + 999, 500)  # late: counts in the second the read opened
    window = history.window(START_MS + 2_000)
    assert (window.succeeded, window.p50_ms) == ((1, 1), (10, 500))
