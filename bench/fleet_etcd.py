"""etcd puts per worker: a fleet of registrars against one real etcd, half idle, half busy.

    uv run python -m bench.fleet_etcd [--seconds 60] [--workers 500] [--interval-ms 200]
                                      [--refresh-ms 10000] [--baseline-seconds 10] [--keep]

One run starts one etcd (tests/e2e/etcd_server.py: loopback, free ports, a
temporary data directory) and, in this one Trio process, `--workers`
`Registrar`s, each with its own etcd client as each worker process has its
own: lease, keep-alive, a look at the heartbeat every `--interval-ms` and an
unchanged heartbeat put again every `--refresh-ms` (the defaults of
heartbeatIntervalMs and heartbeatRefreshMs). Half are idle: their heartbeat never changes. Half are
busy: their reserved slots follow a counter that one task advances every
CHANGE_EVERY_S, so their heartbeat differs at every look.

Once every registrar has put its first heartbeat, `--seconds` are measured:

* etcd_puts_per_s_idle_worker, etcd_puts_per_s_busy_worker: the puts each
  registrar counted (`Registrar.puts`) in the window, per second, averaged over
  each half. Targets: idle <= 0.1 (one per refresh), busy <= 1 / interval
  (5 at 200 ms).
* heartbeat_looks_per_s_busy_worker: how often each busy registrar read its
  heartbeat. A look comes an interval after the previous one's put returned,
  so a little under 1 / interval when this process keeps up; a busy worker
  puts at most at every look, so below that the bench set the pace.
* etcd_puts_per_s: every registrar's puts together, per second;
  etcd_revisions_per_s: how fast etcd's revision grew meanwhile (each put is
  one revision, and nothing else writes), the same figure seen from etcd.
* etcd_puts_per_s_every_look_worker, etcd_revisions_per_s_every_look
  (baseline), unless `--baseline-seconds 0`: before the window, for
  `--baseline-seconds`, as many idle registrars whose refresh equals the
  interval, so that they put at every look, as a worker did before puts
  depended on change; per registrar, and etcd's revisions. etcd_puts_idle_to_every_look: an idle
  worker's puts over that baseline's.

One process drives every registrar, and each etcd call costs it about a
millisecond of CPU (grpclib on trio-asyncio): with few cores it cannot look
every interval for 500 registrars, which heartbeat_looks_per_s_busy_worker
shows (and the baseline is capped the same way). `--workers 100` keeps up
far better on two cores.

Prints each figure as `RESULT name=<figure> value=<number>`; asserts nothing timed.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Final

import attrs
import trio
import trio_asyncio

from bench.autoworker import run_in_a_directory
from blockx.config import default_config
from blockx.discovery import EtcdClient, Registrar, WorkerHeartbeat
from tests.e2e.etcd_server import etcd_server

PREFIX: Final = "/bench/workers/"
SLOTS: Final = 1_000_000
"""Slots of each worker: the busy counter never wraps round to a value it had at a look."""
CHANGE_EVERY_S: Final = 0.002
LEASE_TTL_MS: Final = 10_000
REGISTER_TIMEOUT_S: Final = 120.0
REGISTERED_POLL_S: Final = 0.05
"""How often the bench looks whether every registrar has registered (not timed)."""


@attrs.define
class Busyness:
    """The counter busy workers' heartbeats follow, advanced by `run`."""

    ticks: int = 0

    async def run(self) -> None:
        while True:
            await trio.sleep(CHANGE_EVERY_S)
            self.ticks += 1


@attrs.define
class Looks:
    """How often each registrar has read its heartbeat (one read per look)."""

    counts: list[int]

    def tally(self) -> tuple[int, ...]:
        return tuple(self.counts)


def heartbeat_source(
    index: int, busyness: Busyness | None, looks: Looks
) -> Callable[[], Awaitable[WorkerHeartbeat]]:
    """Worker `index`'s heartbeat: constant if `busyness` is None, else following it."""
    constant = WorkerHeartbeat(
        address=f"10.0.{index // 250}.{index % 250}:8081",
        deployment="block",
        slots_total=SLOTS,
        reserved_slots=0,
        running_tasks=0,
        free_slots=SLOTS,
        executors_healthy=8,
        draining=False,
        version="bench",
        started_at_ms=1_700_000_000_000,
    )

    async def heartbeat() -> WorkerHeartbeat:
        looks.counts[index] += 1
        if busyness is None:
            return constant
        reserved = (busyness.ticks + index) % SLOTS
        return attrs.evolve(constant, reserved_slots=reserved, free_slots=SLOTS - reserved)

    return heartbeat


@attrs.frozen(kw_only=True)
class Fleet:
    registrars: list[Registrar]
    looks: Looks


def fleet_of(
    endpoint: str, args: argparse.Namespace, busyness: Busyness, *, refresh_ms: int, busy: bool
) -> Fleet:
    """WORKERS registrars; if `busy`, those of odd index are busy."""
    looks = Looks(counts=[0] * args.workers)
    made = []
    for index in range(args.workers):
        source = heartbeat_source(index, busyness if busy and index % 2 else None, looks)
        made.append(
            Registrar(
                endpoints=[endpoint],
                key=f"{PREFIX}{index:05d}",
                lease_ttl_ms=LEASE_TTL_MS,
                heartbeat_interval_ms=args.interval_ms,
                heartbeat_refresh_ms=refresh_ms,
                heartbeat=source,
            )
        )
    return Fleet(registrars=made, looks=looks)


async def revision(etcd: EtcdClient) -> int:
    return (await etcd.get_prefix(PREFIX)).revision


@attrs.frozen(kw_only=True)
class Window:
    """What the registrars put over `seconds`."""

    seconds: float
    puts: tuple[int, ...]
    """Per registrar, in order."""
    looks: tuple[int, ...]
    revisions: int

    def per_s(self, which: Sequence[int], counts: Sequence[int] | None = None) -> float:
        """Puts (or `counts`) per second, averaged over the registrars `which`."""
        counts = self.puts if counts is None else counts
        return statistics.fmean(counts[index] for index in which) / self.seconds


def since(first: Sequence[int], last: Sequence[int]) -> tuple[int, ...]:
    return tuple(b - a for a, b in zip(first, last, strict=True))


async def measure(fleet: Fleet, etcd: EtcdClient, seconds: float) -> Window:
    """Start `fleet`, wait until each registrar has registered, then count for `seconds`;
    deregisters the fleet after."""
    registrars = fleet.registrars
    async with trio.open_nursery() as nursery:
        for registrar in registrars:
            await nursery.start(registrar.run)
        with trio.fail_after(REGISTER_TIMEOUT_S):
            while not all(registrar.puts for registrar in registrars):
                await trio.sleep(REGISTERED_POLL_S)
        first_puts = [registrar.puts for registrar in registrars]
        first_looks = fleet.looks.tally()
        first_revision = await revision(etcd)
        started = time.perf_counter()
        await trio.sleep(seconds)
        last_puts = [registrar.puts for registrar in registrars]
        last_looks = fleet.looks.tally()
        last_revision = await revision(etcd)
        elapsed = time.perf_counter() - started
        async with trio.open_nursery() as leaving:
            for registrar in registrars:
                leaving.start_soon(registrar.deregister)
        nursery.cancel_scope.cancel()
    return Window(
        seconds=elapsed,
        puts=since(first_puts, last_puts),
        looks=since(first_looks, last_looks),
        revisions=last_revision - first_revision,
    )


def result(name: str, value: float, digits: int = 3) -> None:
    print(f"RESULT name={name} value={value:.{digits}f}", flush=True)


async def run(args: argparse.Namespace, directory: Path) -> None:
    async with (
        etcd_server(directory / "etcd") as server,
        trio_asyncio.open_loop(),
        EtcdClient.connect([server.endpoint]) as etcd,
        trio.open_nursery() as nursery,
    ):
        busyness = Busyness()
        nursery.start_soon(busyness.run)
        baseline = None
        if args.baseline_seconds > 0:
            every_look = fleet_of(
                server.endpoint, args, busyness, refresh_ms=args.interval_ms, busy=False
            )
            baseline = await measure(every_look, etcd, args.baseline_seconds)
        fleet = fleet_of(server.endpoint, args, busyness, refresh_ms=args.refresh_ms, busy=True)
        window = await measure(fleet, etcd, args.seconds)
        nursery.cancel_scope.cancel()
    idle, busy = range(0, args.workers, 2), range(1, args.workers, 2)
    result("etcd_puts_per_s_idle_worker", window.per_s(idle))
    result("etcd_puts_per_s_busy_worker", window.per_s(busy))
    result("heartbeat_looks_per_s_busy_worker", window.per_s(busy, window.looks))
    result("etcd_puts_per_s", sum(window.puts) / window.seconds, 1)
    result("etcd_revisions_per_s", window.revisions / window.seconds, 1)
    if baseline is not None:
        every_look_rate = baseline.per_s(range(args.workers))
        result("etcd_puts_per_s_every_look_worker", every_look_rate)
        result("etcd_revisions_per_s_every_look", baseline.revisions / baseline.seconds, 1)
        result("etcd_puts_idle_to_every_look", window.per_s(idle) / every_look_rate)


def main() -> None:
    defaults = default_config().etcd
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=60.0, help="the measured window")
    parser.add_argument("--workers", type=int, default=500, help="registrars, half of them busy")
    parser.add_argument(
        "--interval-ms",
        type=int,
        default=defaults.heartbeat_interval_ms,
        help="heartbeatIntervalMs",
    )
    parser.add_argument(
        "--refresh-ms", type=int, default=defaults.heartbeat_refresh_ms, help="heartbeatRefreshMs"
    )
    parser.add_argument(
        "--baseline-seconds", type=float, default=10.0, help="the every-look baseline; 0: none"
    )
    parser.add_argument("--keep", action="store_true", help="keep the directory (etcd's log)")
    run_in_a_directory(run, parser.parse_args(), "blockx-bench-fleet-etcd-")


if __name__ == "__main__":
    main()
