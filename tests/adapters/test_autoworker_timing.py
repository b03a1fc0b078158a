"""The automatic worker's timing rules, at exact virtual times.

* a heartbeat every third of the session TTL, at most every 5 s;
* a renewal a third of the way through the remaining lease, never sooner than
  20 ms, and the handler cancelled on the lease deadline by its monitor;
* after a lost connection, reconnects after a delay from the minimum up to a
  cap that doubles with each failure and stops at the maximum, drawn at random
  in between, never counted as task attempts.

The worker runs against the in-process hub (tests/adapters/autoworker_rig.py)
through a `TappedLine`, which notes when each message left the worker and can
cut the connection or refuse new ones, all on Trio's virtual clock.
"""

from __future__ import annotations

import itertools
import random
from typing import Any, Final

import attrs
import pytest
import trio
import trio.testing

from blockx.autoworker import Worker, WorkerEvent, WorkerExecution
from blockx.hubwire import Heartbeat, Renew, Start
from tests.adapters.autoworker_rig import (
    SQLITE,
    TappedLine,
    ms,
    options,
    state_of,
    tapped_worker,
)
from tests.adapters.hub_harness import TEST_CONFIG, running_hub

MIN_DELAY_MS: Final = 200
MAX_DELAY_MS: Final = 1_600


async def notice(worker: Worker, type_: str) -> WorkerEvent:
    """The worker's first notice of `type_` (those before it are passed over)."""
    async for event in worker.events():
        if event.type == type_:
            return event
    raise AssertionError(f"the worker stopped before a {type_} notice")


# -------------------------------------------------------------------------- heartbeats


@SQLITE
@pytest.mark.parametrize(
    ("session_ttl_ms", "every_ms"), [(3_000, 1_000), (600_000, 5_000)], ids=["third", "capped"]
)
async def test_heartbeats_go_every_third_of_the_session_ttl_at_most_every_five_seconds(
    hub_url: str, autojump_clock: trio.testing.MockClock, session_ttl_ms: int, every_ms: int
) -> None:
    config = attrs.evolve(TEST_CONFIG, session_ttl_ms=session_ttl_ms)
    async with running_hub(hub_url, config) as rig:
        line = TappedLine(rig=rig)
        worker = tapped_worker(line, rig.credential(), options())
        async with trio.open_nursery() as nursery:
            nursery.start_soon(worker.run)
            await trio.sleep((4 * every_ms + every_ms // 2) / 1000)
            stopped_ms = ms(trio.current_time())
            nursery.cancel_scope.cancel()
    beats = [at for at in line.sent(Heartbeat) if at < stopped_ms]
    assert beats == [every_ms, 2 * every_ms, 3 * every_ms, 4 * every_ms]
    assert len(line.tries) == 1  # the session stayed up throughout


# ---------------------------------------------------------------------------- renewals


@SQLITE
async def test_renewals_come_a_third_of_the_remaining_lease_apart_never_under_20_ms(
    hub_url: str, autojump_clock: trio.testing.MockClock
) -> None:
    """A 3 s lease, granted again on each renewal, but never past the attempt's 4 s
    timeout: what remains of the lease shrinks, and so do the gaps between renewals,
    down to the 20 ms floor; on the deadline the handler is cancelled."""
    cancelled_at: list[float] = []

    async def handle(execution: WorkerExecution) -> Any:
        try:
            await trio.sleep_forever()
        finally:
            cancelled_at.append(trio.current_time())

    config = attrs.evolve(TEST_CONFIG, lease_ms=3_000)
    async with running_hub(hub_url, config) as rig:
        token = rig.credential()
        task = await rig.submit(token, attempt_timeout_ms=4_000, idempotency="NON_IDEMPOTENT")
        line = TappedLine(rig=rig)
        worker = tapped_worker(line, token, options(handle))
        async with trio.open_nursery() as nursery:
            nursery.start_soon(worker.run)
            confirmed = await notice(worker, "confirmed")
            ended = await state_of(rig, token, task["task_id"], "NEEDS_REVIEW")
            nursery.cancel_scope.cancel()
    [started_ms] = line.sent(Start)
    renewals = [at - started_ms for at in line.sent(Renew)]
    # deadline 3000 at first, 4000 from the first renewal on; each gap max(20, left // 3)
    assert renewals == [
        1_000,  # 3000 // 3
        2_000,  # + 3000 // 3 (the deadline is 4000 now)
        2_666,  # + 2000 // 3
        3_110,  # + 1334 // 3
        3_406,
        3_604,
        3_736,
        3_824,
        3_882,
        3_921,
        3_947,  # + 53 // 3 = 17: under the floor from here on
        3_967,
        3_987,  # the next would be at 4007, after the deadline
    ]
    assert [ms(at) - started_ms for at in cancelled_at] == [4_000]
    # The hub ends the lease on the same deadline: the report that follows is evidence.
    assert ended["attempts"][0]["state"] == "LEASE_EXPIRED"
    assert confirmed.detail == "EVIDENCE_ONLY"
    [evidence] = ended["evidence"]
    assert evidence["detail"] == {"reported": "UNKNOWN", "code": "LEASE_LOST"}


# --------------------------------------------------------------------------- reconnects


class Highest(random.Random):
    def uniform(self, a: float, b: float) -> float:
        return b


class Lowest(random.Random):
    def uniform(self, a: float, b: float) -> float:
        return a


@SQLITE
@pytest.mark.parametrize(
    ("rng", "gaps_ms"),
    [
        (Highest(), [200, 400, 800, 1_600, 1_600, 1_600]),
        (Lowest(), [200, 200, 200, 200, 200, 200]),
    ],
    ids=["highest", "lowest"],
)
async def test_reconnects_back_off_exponentially_and_never_count_as_attempts(
    hub_url: str, autojump_clock: trio.testing.MockClock, rng: random.Random, gaps_ms: list[int]
) -> None:
    """The hub goes away one second into a task and refuses connections for five tries;
    the sixth reconnects, the attempt is resumed and succeeds, the only one of its task."""
    release = trio.Event()

    async def handle(execution: WorkerExecution) -> Any:
        await release.wait()
        return {"done": True}

    opts = options(handle, reconnect_min_delay_ms=MIN_DELAY_MS, reconnect_max_delay_ms=MAX_DELAY_MS)
    async with running_hub(hub_url) as rig:
        token = rig.credential()
        task = await rig.submit(token, idempotency="NON_IDEMPOTENT")
        line = TappedLine(rig=rig)
        worker = tapped_worker(line, token, opts, rng)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(worker.run)
            await trio.sleep(1)
            line.down = True
            await line.cut()
            await line.wait_for_tries(1 + 5)
            line.down = False
            await line.wait_for_tries(1 + 6)
            release.set()
            done = await state_of(rig, token, task["task_id"], "SUCCEEDED", "NEEDS_REVIEW")
            nursery.cancel_scope.cancel()
        stats = worker.stats()
    first_ms, *again_ms = [ms(at) for at in line.tries]
    assert first_ms == 0
    assert [b - a for a, b in itertools.pairwise([1_000, *again_ms])] == gaps_ms  # from the cut
    assert done["state"] == "SUCCEEDED"
    assert (done["started_attempts"], len(done["attempts"])) == (1, 1)
    assert stats.reconnects == 1
    assert line.taps[0].closed  # the connection the hub dropped was closed on this side too


@SQLITE
async def test_reconnect_delays_are_drawn_between_the_minimum_and_a_doubling_cap(
    hub_url: str, autojump_clock: trio.testing.MockClock
) -> None:
    opts = options(reconnect_min_delay_ms=MIN_DELAY_MS, reconnect_max_delay_ms=MAX_DELAY_MS)
    async with running_hub(hub_url) as rig:
        line = TappedLine(rig=rig, down=True)
        worker = tapped_worker(line, rig.credential(), opts, random.Random(2))
        async with trio.open_nursery() as nursery:
            nursery.start_soon(worker.run)
            await line.wait_for_tries(12)
            line.down = False  # the drain is acknowledged by the hub
            nursery.cancel_scope.cancel()
    gaps_ms = [ms(b - a) for a, b in itertools.pairwise(line.tries[:12])]
    caps_ms = [min(MIN_DELAY_MS << n, MAX_DELAY_MS) for n in range(len(gaps_ms))]
    assert all(MIN_DELAY_MS <= gap <= cap for gap, cap in zip(gaps_ms, caps_ms, strict=True))
    assert len(set(gaps_ms[4:])) > 1  # at the maximum, still spread out


@SQLITE
async def test_a_connection_closed_before_its_handshake_is_tried_again_after_the_back_off(
    hub_url: str, autojump_clock: trio.testing.MockClock
) -> None:
    """As through a proxy with no hub behind it: each connection is taken and closed at
    once. The worker tries again after its back-off, not after the 10 s a handshake may
    take."""
    opts = options(reconnect_min_delay_ms=MIN_DELAY_MS, reconnect_max_delay_ms=MAX_DELAY_MS)
    async with running_hub(hub_url) as rig:
        line = TappedLine(rig=rig, down=True, closing=True)
        worker = tapped_worker(line, rig.credential(), opts, Lowest())
        async with trio.open_nursery() as nursery:
            nursery.start_soon(worker.run)
            await line.wait_for_tries(4)
            line.down = False  # the fifth try gets through
            await line.wait_for_tries(5)
            nursery.cancel_scope.cancel()
    assert [ms(at) for at in line.tries] == [0, 200, 400, 600, 800]


@SQLITE
async def test_a_line_silent_for_a_session_ttl_is_given_up_and_made_again(
    hub_url: str, autojump_clock: trio.testing.MockClock
) -> None:
    """The hub answers every heartbeat; a line that goes quiet for a whole session TTL
    (3 s here) is dead even if it never errors, and the worker makes a new one."""
    opts = options(reconnect_min_delay_ms=MIN_DELAY_MS, reconnect_max_delay_ms=MIN_DELAY_MS)
    async with running_hub(hub_url, attrs.evolve(TEST_CONFIG, session_ttl_ms=3_000)) as rig:
        line = TappedLine(rig=rig)
        worker = tapped_worker(line, rig.credential(), opts)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(worker.run)
            await trio.sleep(1.5)  # a heartbeat and its answer at 1 s
            line.taps[0].silent = True
            await line.wait_for_tries(2)
            await notice(worker, "reconnected")
            nursery.cancel_scope.cancel()
        stats = worker.stats()
    # The last answer came at 1 s: given up at 4 s, tried again after the 200 ms back-off.
    assert [ms(at) for at in line.tries] == [0, 4_000 + MIN_DELAY_MS]
    assert stats.reconnects == 1
