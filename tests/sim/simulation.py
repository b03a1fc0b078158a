"""A whole worker under deterministic simulation: `simulate(seed)`.

The real actors and pure cores (`blockx.actors.run_actors`: slot table, watch
hub, dispatcher, task actors) run on Trio's `MockClock` with
`autojump_threshold=0`, so simulated time jumps ahead whenever every task
waits. Fake executors (`tests.sim.executors`) stand in for the processes and
fake clients (`tests.sim.clients`) for the coordinators, at the seam the gRPC
handlers use. The run's shape (slots, executors, clients, grace) and every
fault are drawn from one `random.Random(seed)`; Trio's own scheduling order
is seeded from it too (`_deterministic_trio`, the one hack), so a seed
replays exactly: same trace, same verdict.

A run: the clients work for `duration_ms` while faults are injected (the
worker may be stopped at a random time: drain, then the drain timeout).
Then, unless it was stopped, every accepted task must end, a probe task
must succeed, and a drain must find nothing left to end. Once every lease
has run out no slot may be taken; then the worker stops as `blockx.app`
stops it. `tests.sim.checks` judges what happened.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import random
from collections.abc import Iterator

import attrs
import trio
import trio.testing

from blockx.actors import (
    ActorParts,
    CloseAllStreams,
    GetStatus,
    Inbox,
    Inboxes,
    SlotTableMessage,
    SubmitTask,
    WorkerActors,
    WorkerStatus,
    run_actors,
)
from blockx.calls import CallFailurePolicy
from blockx.config import WorkerConfig, load_config
from blockx.executors import ExecutorPoolConfig, PoolEvent
from blockx.functions import FunctionCodeView, FunctionSnapshot
from blockx.identity import WorkerIdentity
from blockx.observability.tracing import TaskTracing
from blockx.process.clock import EpochClock
from blockx.profiles import BLOCK
from blockx.slots import (
    FunctionCall,
    SlotState,
    TaskSnapshot,
    TaskSpec,
    TaskState,
    Unavailable,
    WorkerError,
)
from tests.sim.checks import judge
from tests.sim.clients import SimClient
from tests.sim.executors import SIM_FUNCTION, ExecutorSettings, SimExecutors, sim_code
from tests.sim.world import ALL_FAULTS, EPOCH_MS, Fault, TaskRecord, TraceEvent, World

DURATION_MS = 8_000
"""How long clients make requests (and faults are injected), by default."""
RERUN = "BLOCKX_SIM_SEED={seed} uv run pytest tests/sim -k test_replay"
PROBE_TASK_ID = "probe"
PROBE_READY_WAIT_MS = 60_000
"""How long the probe waits for a worker with no executor up (the pool restarting one)."""
TASK_DEADLINE_MS = 60_000
DRAIN_TIMEOUT_MS = 3_000
CODE_GAP_MS = 2_000
"""The mean time between two publications of function code."""
SETTLE_POLL_MS = 100
SLOT_TABLE_TICK_MS = 500
"""The slot table's longest sleep: a lease's end is acted on within it."""
TRACE_TAIL = 40


@attrs.frozen(kw_only=True)
class Shape:
    """What a run is made of, drawn from its seed."""

    task_slots: int
    executors: int
    executor_capacity: int
    clients: int
    executor_task_slots: int
    """Tasks in the call phase at once (`admission.executorTaskSlots`)."""
    plugin_slots: int
    phase_io_timeout_ms: int
    result_retention_ms: int
    watch_grace_ms: int
    stop_at_ms: int | None
    """When the worker is stopped (the DRAIN fault); None: it serves to the end."""

    @classmethod
    def draw(cls, rng: random.Random, faults: frozenset[Fault], duration_ms: int) -> Shape:
        return cls(
            task_slots=rng.randint(2, 6),
            executors=rng.randint(1, 4),
            executor_capacity=rng.randint(1, 3),
            clients=rng.randint(2, 5),
            executor_task_slots=rng.randint(1, 4),
            plugin_slots=rng.randint(1, 3),
            phase_io_timeout_ms=rng.choice((300, 10_000))
            if Fault.SLOW_PLUGIN in faults
            else 10_000,
            result_retention_ms=rng.choice((1_500, 3_600_000)),
            watch_grace_ms=rng.choice((0, 500)),
            stop_at_ms=rng.randint(0, duration_ms)
            if Fault.DRAIN in faults and rng.random() < 0.3
            else None,
        )

    def config(self) -> WorkerConfig:
        return load_config(
            env={},
            overrides={
                "listenAddr": "127.0.0.1:0",
                "metricsListenAddr": "none",
                "etcdEndpoints": "none",
                "drainTimeoutMs": DRAIN_TIMEOUT_MS,
                "phaseIoTimeoutMs": self.phase_io_timeout_ms,
                "admission.executorTaskSlots": self.executor_task_slots,
                "admission.pluginSlots": self.plugin_slots,
                "worker.taskSlots": self.task_slots,
                "worker.defaultTTLMs": 1_000,
                "worker.taskDeadlineMs": TASK_DEADLINE_MS,
                "worker.maxTaskTimeoutMs": TASK_DEADLINE_MS,
                "functionSnapshotRetentionMs": 60_000,
                "worker.resultRetentionMs": self.result_retention_ms,
                "worker.watchDisconnectGraceMs": self.watch_grace_ms,
                "dispatcher.callDeadlineMs": 2_000,
                "dispatcher.executorCapacity": self.executor_capacity,
                "dispatcher.cancelGraceMs": 500,
                "executorCount": self.executors,
                "executorHeartbeatTimeoutMs": 1_500,
                "executorRestartDelayMs": 300,
            },
        )


@attrs.frozen(kw_only=True)
class SimRun:
    """What a run did (`trace`) and what it broke (`violations`)."""

    seed: int
    shape: Shape
    trace: tuple[TraceEvent, ...]
    violations: tuple[str, ...]
    outcomes: dict[str, int]
    """How many tasks ended how (`SUCCEEDED`, or the failure code), and how many were refused."""

    @property
    def digest(self) -> str:
        """A short fingerprint of the trace, to compare runs made in different processes."""
        return hashlib.sha256(repr(self.trace).encode()).hexdigest()[:16]

    def check(self) -> None:
        """Raise AssertionError naming the seed, how to rerun it and what went wrong."""
        if self.violations:
            raise AssertionError(self.report())

    def report(self) -> str:
        lines = [
            f"simulation seed {self.seed} broke {len(self.violations)} invariant(s); "
            f"rerun: {RERUN.format(seed=self.seed)}",
            f"shape: {self.shape}",
            *(f"  {violation}" for violation in self.violations[:20]),
            f"last {TRACE_TAIL} events of {len(self.trace)}:",
            *(f"  {event}" for event in self.trace[-TRACE_TAIL:]),
        ]
        return "\n".join(lines)


def simulate(
    seed: int, *, duration_ms: int = DURATION_MS, faults: frozenset[Fault] = ALL_FAULTS
) -> SimRun:
    """Run the worker under simulation from `seed`; see the module docstring."""
    rng = random.Random(seed)
    shape = Shape.draw(rng, faults, duration_ms)
    worlds: list[World] = []
    clock = trio.testing.MockClock(autojump_threshold=0)
    try:
        with _deterministic_trio(rng.getrandbits(64)):
            trio.run(_main, rng, shape, faults, duration_ms, worlds, clock=clock)
    except BaseException as error:
        trace = worlds[0].trace[-TRACE_TAIL:] if worlds else []
        tail = "\n".join(f"  {event}" for event in trace)
        raise AssertionError(
            f"simulation seed {seed} raised; rerun: {RERUN.format(seed=seed)}\n{tail}"
        ) from error
    world = worlds[0]
    return SimRun(
        seed=seed,
        shape=shape,
        trace=tuple(world.trace),
        violations=tuple(world.violations),
        outcomes=_outcomes(world),
    )


@contextlib.contextmanager
def _deterministic_trio(seed: int) -> Iterator[None]:
    """The simulation's one reach into Trio's insides.

    Each pass of Trio's run loop runs the tasks that became ready in a random
    order, drawn from `trio._core._run._r`; with `_ALLOW_DETERMINISTIC_SCHEDULING`
    on (Hypothesis's plugin turns it on when Hypothesis is imported) that
    order depends only on `_r`'s state. So: turn it on, seed `_r` from the run's
    seed, and put both back afterwards.
    """
    run_module = trio._core._run
    allowed = run_module._ALLOW_DETERMINISTIC_SCHEDULING
    state = run_module._r.getstate()
    setattr(run_module, "_ALLOW_DETERMINISTIC_SCHEDULING", True)  # noqa: B010 - Final in trio
    run_module._r.seed(seed)
    try:
        yield
    finally:
        run_module._r.setstate(state)
        setattr(run_module, "_ALLOW_DETERMINISTIC_SCHEDULING", allowed)  # noqa: B010


class _StepBudget(trio.abc.Instrument):
    """Cancels `scope` once the run's tasks took `limit` steps: a livelock (tasks that keep
    waking each other) never lets simulated time reach a deadline."""

    def __init__(self, limit: int, scope: trio.CancelScope) -> None:
        self.steps = 0
        self._limit = limit
        self._scope = scope

    def before_task_step(self, task: trio.lowlevel.Task) -> None:
        self.steps += 1
        if self.steps == self._limit:
            self._scope.cancel()


class _ErrorLog(logging.Handler):
    """An error the worker logs (a report a core refused, an actor's failure) is a violation."""

    def __init__(self, world: World) -> None:
        super().__init__(logging.ERROR)
        self._world = world

    def emit(self, record: logging.LogRecord) -> None:
        self._world.violation(f"{record.name} logged: {record.getMessage()}")


async def _main(
    rng: random.Random,
    shape: Shape,
    faults: frozenset[Fault],
    duration_ms: int,
    worlds: list[World],
) -> None:
    snapshot = sim_code(0)
    world = World(
        rng=rng,
        faults=faults,
        clock=EpochClock(epoch_ms=EPOCH_MS),
        faults_until_ms=duration_ms,
        phase_io_timeout_ms=shape.phase_io_timeout_ms,
        task_deadline_ms=TASK_DEADLINE_MS,
        result_retention_ms=shape.result_retention_ms,
        watch_grace_ms=shape.watch_grace_ms,
        drain_timeout_ms=DRAIN_TIMEOUT_MS,
        default_retry=shape.config().worker.slot_config().default_retry_policy,
    )
    worlds.append(world)
    world.record("sim", "shape", *attrs.astuple(shape))
    errors = _ErrorLog(world)
    logging.getLogger("blockx").addHandler(errors)
    with trio.CancelScope() as budget:
        steps = _StepBudget(_step_limit(duration_ms), budget)
        trio.lowlevel.add_instrument(steps)
        try:
            with trio.fail_after(_limit_s(duration_ms)):
                await _run_worker(world, shape, snapshot)
        except trio.TooSlowError:
            world.violation("the run did not end: something waits forever")
        finally:
            trio.lowlevel.remove_instrument(steps)
            logging.getLogger("blockx").removeHandler(errors)
    if budget.cancelled_caught:
        world.violation(f"the run took {steps.steps} task steps: something never rests")
    world.record("sim", "steps", steps.steps)
    judge(world)


async def _run_worker(world: World, shape: Shape, snapshot: FunctionSnapshot) -> None:
    """Start the actors, let the clients work, settle and stop, in `blockx.app`'s order."""
    config = shape.config()
    parts = _parts(world, shape, config, snapshot)
    async with trio.open_nursery() as system:
        async with trio.open_nursery() as watchers:
            async with run_actors(system, parts) as actors:
                await actors.transport.first_healthy.wait()
                async with trio.open_nursery() as clients:
                    for number in range(shape.clients):
                        client = SimClient(
                            world,
                            number,
                            actors.inboxes.slot_table,
                            watchers,
                            watch_grace_ms=shape.watch_grace_ms,
                        )
                        clients.start_soon(client.run, world.faults_until_ms)
                    clients.start_soon(_publish_code, world, actors.inboxes)
                    if shape.stop_at_ms is not None:
                        clients.start_soon(_stop_at, world, actors, config, shape.stop_at_ms)
                await _settle(world, actors, config)
                await _leases_end(world)
            actors.inboxes.slot_table.post(CloseAllStreams())
        await _check_free(world, actors.inboxes.slot_table)
        system.cancel_scope.cancel()


def _parts(
    world: World, shape: Shape, config: WorkerConfig, snapshot: FunctionSnapshot
) -> ActorParts:
    code = FunctionCodeView(config.code_view_config())
    code.observe(snapshot, world.clock.now_ms())
    settings = ExecutorSettings(
        capacity=shape.executor_capacity,
        heartbeat_timeout_ms=config.executor.heartbeat_timeout_ms,
        restart_delay_ms=config.executor.restart_delay_ms,
    )

    def executors(
        pool: ExecutorPoolConfig, events: trio.MemorySendChannel[PoolEvent], clock: EpochClock
    ) -> SimExecutors:
        return SimExecutors(world, pool, events, settings)

    return ActorParts(
        config=config,
        profile=BLOCK,
        inboxes=Inboxes(),
        code=code,
        executors=executors,
        identity=WorkerIdentity(
            worker_addr="sim:1", deployment="block", version="sim", started_at_ms=EPOCH_MS
        ),
        clock=world.clock,
        tracing=TaskTracing.disabled(),
        on_finished=(world.finished,),
        draws=random.Random(world.rng.getrandbits(64)),
    )


async def _publish_code(world: World, inboxes: Inboxes) -> None:
    """New versions of the function code while the clients work (and now and then an
    older one again: a rollback); running tasks keep the epoch they pinned."""
    published = 1
    while True:
        await world.sleep_ms(int(world.rng.expovariate(1 / CODE_GAP_MS)) + 1)
        if world.now_ms() >= world.faults_until_ms:
            return
        version = world.rng.randrange(published + 1)
        published = max(published, version + 1)
        snapshot = sim_code(version)
        world.record("sim", "code", version, snapshot.epoch)
        inboxes.code_loaded(snapshot)


async def _stop_at(world: World, actors: WorkerActors, config: WorkerConfig, at_ms: int) -> None:
    """The DRAIN fault: stop the worker at `at_ms`, as the first signal does."""
    await world.sleep_ms(at_ms)
    world.draining_since_ms = world.now_ms()
    world.record("worker", "drain")
    actors.start_drain()
    world.drain_forced = await actors.finish_drain(config.drain_timeout_ms)
    world.record("worker", "drained", world.drain_forced)


async def _settle(world: World, actors: WorkerActors, config: WorkerConfig) -> None:
    """Every accepted task ends; then, unless stopped, a probe task succeeds and a drain
    finds nothing left to end."""
    slot_table = actors.inboxes.slot_table
    while any(
        record.accepted_ms is not None and task_id not in world.results
        for task_id, record in world.tasks.items()
    ) or await _live_tasks(slot_table):
        await world.sleep_ms(SETTLE_POLL_MS)
    world.record("sim", "settled")
    await _probe(world, actors.inboxes.slot_table)
    if world.draining_since_ms is None:
        world.draining_since_ms = world.now_ms()
        actors.start_drain()
        if await actors.finish_drain(config.drain_timeout_ms):
            world.violation("the final drain had to end tasks, yet none was live")


async def _live_tasks(slot_table: Inbox[SlotTableMessage]) -> int:
    """Tasks the worker still runs or holds (a stream's submit waiting for a slot)."""
    status: WorkerStatus = await slot_table.ask(lambda reply: GetStatus(reply=reply))
    return status.heartbeat.active_tasks + status.waiting_submits


async def _probe(world: World, slot_table: Inbox[SlotTableMessage]) -> None:
    """A last task: it succeeds on a worker that still serves, and is refused on a stopped one."""
    calls = [{"function": SIM_FUNCTION, "args": [i]} for i in range(2)]
    spec = TaskSpec(
        task_id=PROBE_TASK_ID,
        function_call=FunctionCall(type="call_list"),
        payload=json.dumps({"calls": calls}).encode(),
        call_failure_policy=CallFailurePolicy.FAIL_FAST,
    )
    record = TaskRecord(
        spec=spec, call_count=2, short_timeout=False, plugin_fails=False, plugin_delay_ms=0
    )
    world.tasks[PROBE_TASK_ID] = record
    give_up_ms = world.now_ms() + PROBE_READY_WAIT_MS
    while True:
        try:
            answer: TaskSnapshot = await slot_table.ask(
                lambda reply: SubmitTask(spec=spec, slot_id=None, reply=reply)
            )
            break
        except WorkerError as error:
            world.record("sim", "probe refused", error.code.value)
            restarting = isinstance(error, Unavailable) and not error.ready
            if restarting and world.draining_since_ms is None and world.now_ms() < give_up_ms:
                await world.sleep_ms(SETTLE_POLL_MS)  # no executor is up yet: ready soon
                continue
            if world.draining_since_ms is None or not isinstance(error, Unavailable):
                world.violation(f"the probe task was refused: {error!r}")
            return
    record.accepted_ms = world.now_ms()
    world.record("sim", "probe accepted", answer.state.value)
    if world.draining_since_ms is not None:
        world.violation("the probe task was accepted by a stopped worker")
    while PROBE_TASK_ID not in world.results:
        await world.sleep_ms(SETTLE_POLL_MS)
    result = world.results[PROBE_TASK_ID][0]
    if result.state is not TaskState.SUCCEEDED:
        world.violation(f"the probe task did not succeed: {result!r}")


async def _leases_end(world: World) -> None:
    """Wait until every reservation's lease has run out and the slot table has seen it."""
    await world.sleep_ms(max(0, world.last_lease_ms - world.now_ms()) + SLOT_TABLE_TICK_MS + 1)


async def _check_free(world: World, slot_table: Inbox[SlotTableMessage]) -> None:
    """No slot stays taken once every task ended and every lease ran out."""
    status: WorkerStatus = await slot_table.ask(lambda reply: GetStatus(reply=reply))
    taken = [slot for slot in status.slots if slot.state is not SlotState.FREE]
    world.record("sim", "slots", len(status.slots), len(taken))
    if taken or status.tasks or status.heartbeat.active_tasks:
        world.violation(f"slots still taken at the end: {taken!r}, tasks {status.tasks!r}")


def _limit_s(duration_ms: int) -> float:
    """Simulated time a run may take at most: past it, something waits forever."""
    return (duration_ms + 60_000 + 3_000 + 60_000) / 1000


def _step_limit(duration_ms: int) -> int:
    """Task steps a run may take at most: far more than any run that rests between events."""
    return 5 * duration_ms


def _outcomes(world: World) -> dict[str, int]:
    counts: dict[str, int] = {}
    for task_id, record in world.tasks.items():
        results = world.results.get(task_id)
        if record.accepted_ms is None:
            key = "refused"
        elif not results:
            key = "unfinished"
        elif results[0].failure_code is None:
            key = results[0].state.value
        else:
            key = results[0].failure_code.value
        counts[key] = counts.get(key, 0) + 1
    return dict(sorted(counts.items()))
