"""Fake executors for the simulation: the `ExecutorTransport` of a pool, without processes.

Each executor id runs one incarnation (a pretend process, `pid`) at a time.
An incarnation takes the calls of each frame into a queue and runs them one
at a time, in order, as a real executor does: it asks the worker for the code
of an epoch it has not seen (`CodeRequest`), then "runs" the call for a time
drawn from the run's random source and answers with an outcome drawn from it
too. A call may make a subcall and wait for it, running other calls nested
meanwhile. It answers a cancel (at once if queued, by interrupting if
running, unless the call is stuck; a call waiting on a subcall gives up) and
a revoke (only if queued) as the real child does.

Faults come from the run's random seed: a crash ends an incarnation at once (its calls are
never answered; `ExecutorDown(EXITED)` follows after a reap), a hang silences
it until the heartbeat timeout declares it lost (`ExecutorDown(LOST)`), and
`replace` (from the dispatcher) kills it (`ExecutorDown(WEDGED)`). Either way
a new incarnation comes up after the restart delay.

Judged on the spot: the dispatcher never sends to an executor after it was
told that executor is down, never gives it more than its room (its capacity,
plus a call per subcall its calls wait for), numbers a call's attempts one by
one, sends no call of a task after the task ended, never runs again a call
of an `at_most_once` task that may have run, and never cancels a call later
than its deadline.
"""

from __future__ import annotations

import collections
import itertools
from collections.abc import Awaitable, Callable, Iterator

import attrs
import trio

from blockx.calls import CallOutcome, FailureCode, encode_args, encode_value
from blockx.executors import (
    CallRequest,
    CallResults,
    CancelCall,
    CodeReply,
    CodeRequest,
    DownReason,
    ExecutorDown,
    ExecutorMessage,
    ExecutorPoolConfig,
    ExecutorState,
    ExecutorUnavailable,
    ExecutorUp,
    ExecutorView,
    PoolEvent,
    RevokeCall,
    RunCalls,
    Subcall,
    SubcallResult,
    ToExecutor,
    UnknownExecutor,
    decode_payload,
)
from blockx.functions import FunctionSnapshot
from tests.sim.world import Attempt, Fault, World

SIM_MODULE = "sim"
SIM_FUNCTION = f"{SIM_MODULE}.work"
SIM_SOURCE = "def work(index):\n    return index\n"
"""What the calls run, as far as the worker knows; the fakes only pretend to run it (a
run publishes versions of it: `sim_code`)."""

CALL_MS = (5, 300)
"""How long a call takes, when nothing goes wrong."""
FAULT_GAP_MS = 1_500
"""The mean time between executor faults (crash or hang)."""
SUBCALLS = 0.15
"""The share of calls that make a subcall while they run."""
MAX_SUBCALL_DEPTH = 2
REAP_MS = (0, 20)
"""From a crash to `ExecutorDown`: the pool notices the process is gone and reaps it."""


@attrs.frozen(kw_only=True)
class _Plan:
    outcome: CallOutcome
    duration_ms: int
    stuck: bool
    subcall_after_ms: int | None


@attrs.frozen(kw_only=True)
class ExecutorSettings:
    capacity: int
    """Calls the dispatcher may have queued on one executor (`dispatcher.executorCapacity`)."""
    heartbeat_timeout_ms: int
    restart_delay_ms: int


@attrs.define(eq=False)
class _Incarnation:
    executor_id: str
    pid: int
    scope: trio.CancelScope = attrs.Factory(trio.CancelScope)
    queue: collections.deque[Attempt] = attrs.Factory(collections.deque)
    stack: list[Attempt] = attrs.Factory(list)
    """The running call, under the calls waiting on its subcalls (outermost first)."""
    interrupts: dict[tuple[str, int], trio.CancelScope] = attrs.Factory(dict)
    """Interrupts the running call's own code (absent while it runs stuck)."""
    cancelled: set[tuple[str, int]] = attrs.Factory(set)
    """Running attempts the worker cancelled: one waiting on a subcall gives up."""
    pending: dict[str, CallOutcome | None] = attrs.Factory(dict)
    """Subcalls asked for: their results, once they come."""
    subcall_ids: Iterator[int] = attrs.Factory(itertools.count)
    outstanding: dict[tuple[str, int], Attempt] = attrs.Factory(dict)
    """Attempts received and not answered."""
    epochs: set[str] = attrs.Factory(set)
    code_replies: dict[str, CodeReply] = attrs.Factory(dict)
    code_arrived: trio.Event = attrs.Factory(trio.Event)
    wake: trio.Event = attrs.Factory(trio.Event)
    hung: bool = False
    down_reason: DownReason | None = None
    closed: bool = False
    """Its connection is gone: sends to it are refused."""
    reaped: bool = False


@attrs.define(eq=False)
class _Executor:
    executor_id: str
    incarnation: _Incarnation | None = None
    restarts: int = 0
    served: int = 0
    down_since_ms: int | None = None
    """When its `ExecutorDown` went to the dispatcher; None while it is up."""


class SimExecutors:
    """Implements `ExecutorTransport`; made by the simulation's transport factory."""

    def __init__(
        self,
        world: World,
        config: ExecutorPoolConfig,
        events: trio.MemorySendChannel[PoolEvent],
        settings: ExecutorSettings,
    ) -> None:
        self._world = world
        self._events = events
        self._settings = settings
        self._executors = {
            f"sim-{index}": _Executor(executor_id=f"sim-{index}")
            for index in range(config.executor_count)
        }
        self._pids = itertools.count(100)
        self._requests = itertools.count()
        self._nursery: trio.Nursery | None = None
        self._stopped = False
        self._attempts: dict[str, int] = {}
        """Call id -> its last attempt seen."""
        self._may_have_run: set[str] = set()
        self._depth: dict[str, int] = {}
        """Subcall ids (as the dispatcher knows them) -> how deep they are nested."""
        self.first_healthy = trio.Event()

    # ------------------------------------------------------------ the transport

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            for executor in self._executors.values():
                self._start(executor)
            self.first_healthy.set()
            task_status.started()
            nursery.start_soon(self._inject_faults)

    async def stop(self) -> None:
        self._stopped = True
        for executor in self._executors.values():
            incarnation = executor.incarnation
            if incarnation is not None:
                incarnation.closed = True
                incarnation.scope.cancel()
        self._world.record("executors", "stopped")

    def snapshot(self) -> tuple[ExecutorView, ...]:
        return tuple(self._view(executor) for executor in self._executors.values())

    def replace(self, executor_id: str, why: str) -> None:
        executor = self._executors[executor_id]
        incarnation = executor.incarnation
        self._world.record("executors", "replace", executor_id, why)
        if incarnation is None or incarnation.reaped:
            return
        self._kill(executor, incarnation)
        self._spawn(self._reap, executor, incarnation, DownReason.WEDGED, 0)

    def send_frame(self, executor_id: str, frame: bytes, *, at_once: bool = False) -> None:
        executor, incarnation = self._lookup(executor_id, "a frame")
        message = decode_payload(frame[4:])
        assert isinstance(message, RunCalls)
        now_ms = self._world.now_ms()
        for request in message.calls:
            attempt = self._received(executor, incarnation, request, now_ms)
            if incarnation.reaped:
                attempt.lost = incarnation.down_reason
            else:  # lost with the incarnation if it is going down
                incarnation.outstanding[request.call_id, request.attempt] = attempt
            if not incarnation.closed:
                incarnation.queue.append(attempt)
        if incarnation.closed:
            raise ExecutorUnavailable(executor_id=executor_id, state=ExecutorState.EXITED.value)
        room = self._settings.capacity + len(incarnation.pending)
        if len(incarnation.outstanding) > room:
            self._world.violation(
                f"{executor_id} holds {len(incarnation.outstanding)} calls, more than its "
                f"capacity {self._settings.capacity} and a call per subcall awaited"
            )
        incarnation.wake.set()

    def send(self, executor_id: str, message: ToExecutor) -> None:
        executor, incarnation = self._lookup(executor_id, type(message).__name__)
        if incarnation.closed:
            raise ExecutorUnavailable(executor_id=executor_id, state=ExecutorState.EXITED.value)
        if incarnation.hung:
            return  # taken by the socket, never read
        match message:
            case CancelCall(call_id=call_id, attempt=attempt):
                self._cancel(executor, incarnation, (call_id, attempt))
            case RevokeCall(call_id=call_id, attempt=attempt):
                self._revoke(executor, incarnation, (call_id, attempt))
            case CodeReply(request_id=request_id):
                incarnation.code_replies[request_id] = message
                incarnation.code_arrived.set()
            case SubcallResult(outcome=outcome) if outcome.call_id in incarnation.pending:
                incarnation.pending[outcome.call_id] = outcome
                incarnation.wake.set()
            case SubcallResult():
                pass  # its caller gave up on it
            case _:
                self._world.violation(f"{executor_id} was sent {message!r}")

    # ------------------------------------------------------------- incarnations

    def _spawn(self, fn: Callable[..., Awaitable[object]], *args: object) -> None:
        assert self._nursery is not None
        self._nursery.start_soon(fn, *args)

    def _start(self, executor: _Executor) -> None:
        incarnation = _Incarnation(executor_id=executor.executor_id, pid=next(self._pids))
        executor.incarnation = incarnation
        executor.down_since_ms = None
        self._events.send_nowait(ExecutorUp(executor_id=executor.executor_id, pid=incarnation.pid))
        self._world.record("executors", "up", executor.executor_id, incarnation.pid)
        self._spawn(self._serve, executor, incarnation)

    def _kill(self, executor: _Executor, incarnation: _Incarnation) -> None:
        """The process ends now: nothing of it runs or answers any more."""
        incarnation.closed = True
        incarnation.scope.cancel()

    async def _reap(
        self, executor: _Executor, incarnation: _Incarnation, reason: DownReason, after_ms: int
    ) -> None:
        """Tell the dispatcher `incarnation` is gone, `after_ms` from now; restart it."""
        await self._world.sleep_ms(after_ms)
        if incarnation.reaped:
            return  # replaced, or declared lost, already
        incarnation.reaped = True
        incarnation.down_reason = reason
        self._kill(executor, incarnation)
        for attempt in incarnation.outstanding.values():
            attempt.lost = reason
            if attempt.started_ms is not None:
                self._may_have_run.add(attempt.call_id)
        running = incarnation.stack[-1].call_id if incarnation.stack else None
        executor.down_since_ms = self._world.now_ms()
        self._events.send_nowait(
            ExecutorDown(
                executor_id=executor.executor_id,
                pid=incarnation.pid,
                reason=reason,
                running_call_id=running,
            )
        )
        self._world.record("executors", "down", executor.executor_id, reason.value)
        await self._world.sleep_ms(self._settings.restart_delay_ms)
        if not self._stopped:
            executor.restarts += 1
            self._start(executor)

    async def _inject_faults(self) -> None:
        world = self._world
        kinds = [f for f in (Fault.EXECUTOR_CRASH, Fault.EXECUTOR_HANG) if f in world.faults]
        if not kinds:
            return
        while True:
            await world.sleep_ms(int(world.rng.expovariate(1 / FAULT_GAP_MS)) + 1)
            if world.now_ms() >= world.faults_until_ms:
                return
            alive = [
                e
                for e in self._executors.values()
                if e.incarnation is not None and not e.incarnation.closed
            ]
            if not alive:
                continue
            executor = world.rng.choice(alive)
            incarnation = executor.incarnation
            assert incarnation is not None
            if world.rng.choice(kinds) is Fault.EXECUTOR_CRASH:
                world.record("fault", "crash", executor.executor_id, incarnation.pid)
                self._kill(executor, incarnation)
                reap_ms = world.rng.randint(*REAP_MS)
                self._spawn(self._reap, executor, incarnation, DownReason.EXITED, reap_ms)
            elif not incarnation.hung:
                world.record("fault", "hang", executor.executor_id, incarnation.pid)
                incarnation.hung = True
                incarnation.scope.cancel()
                timeout_ms = self._settings.heartbeat_timeout_ms
                self._spawn(self._reap, executor, incarnation, DownReason.LOST, timeout_ms)

    # ------------------------------------------------------------------ calls

    def _lookup(self, executor_id: str, what: str) -> tuple[_Executor, _Incarnation]:
        """The executor and its current incarnation, as the pool's `send` finds them."""
        executor = self._executors.get(executor_id)
        if executor is None or executor.incarnation is None:
            raise UnknownExecutor(executor_id=executor_id, known=tuple(self._executors))
        down_since = executor.down_since_ms
        if down_since is not None and self._world.now_ms() > down_since:
            self._world.violation(f"{what} sent to {executor_id}, reported down at {down_since} ms")
        return executor, executor.incarnation

    def _received(
        self, executor: _Executor, incarnation: _Incarnation, request: CallRequest, now_ms: int
    ) -> Attempt:
        world = self._world
        call_id = request.call_id
        subcall = not call_id.startswith(f"{request.task_id}#")
        index = -1 if subcall else int(call_id.rpartition(":")[2])
        deadline_ms = now_ms + (request.deadline_ms_from_now or 0)
        attempt = Attempt(
            call_id=call_id,
            attempt=request.attempt,
            task_id=request.task_id,
            epoch=request.epoch,
            index=index,
            executor_id=executor.executor_id,
            pid=incarnation.pid,
            received_ms=now_ms,
            deadline_ms=deadline_ms,
        )
        world.attempts.append(attempt)
        world.record("call", "sent", call_id, request.attempt, executor.executor_id)
        last = self._attempts.get(call_id, 0)
        if request.attempt != last + 1:
            world.violation(f"{call_id} attempt {request.attempt} follows attempt {last}")
        self._attempts[call_id] = request.attempt
        record = world.tasks.get(request.task_id)
        ended = world.results.get(request.task_id)
        if ended and world.clock.now_ms() > ended[0].finished_at_ms:
            world.violation(f"{call_id} sent after its task ended")
        policy = record.spec.call_retry_policy if record is not None else None
        if policy is not None and policy.at_most_once and call_id in self._may_have_run:
            world.violation(f"{call_id} of an at-most-once task sent again after it may have run")
        return attempt

    async def _serve(self, executor: _Executor, incarnation: _Incarnation) -> None:
        """Run the incarnation's calls one at a time, in the order they came."""
        with incarnation.scope:
            while True:
                while not incarnation.queue:
                    await incarnation.wake.wait()
                    incarnation.wake = trio.Event()
                await self._run_one(executor, incarnation, incarnation.queue.popleft())

    async def _run_one(
        self, executor: _Executor, incarnation: _Incarnation, attempt: Attempt
    ) -> None:
        """Run `attempt` to its end and answer; a call waiting on a subcall runs others
        meanwhile (nested, as the real executor does)."""
        key = (attempt.call_id, attempt.attempt)
        incarnation.stack.append(attempt)
        outcome = await self._run(executor, incarnation, attempt)
        incarnation.stack.pop()
        incarnation.cancelled.discard(key)
        executor.served += 1
        self._answer(incarnation, attempt, outcome)

    async def _run(
        self, executor: _Executor, incarnation: _Incarnation, attempt: Attempt
    ) -> CallOutcome:
        world = self._world
        if world.now_ms() >= attempt.deadline_ms:
            return _failure(
                attempt, FailureCode.DEADLINE_EXCEEDED, "queued past its deadline", True
            )
        epoch = attempt.epoch
        if epoch not in incarnation.epochs:
            reply = await self._ask_code(incarnation, epoch)
            if reply.source is None:
                return _failure(attempt, FailureCode.CODE_UNAVAILABLE, reply.error or "", True)
            incarnation.epochs.add(epoch)
        attempt.started_ms = world.now_ms()
        plan = self._plan(attempt)
        world.record(
            "call", "start", attempt.call_id, attempt.attempt, plan.duration_ms, plan.stuck
        )
        if plan.subcall_after_ms is None:
            done = await self._work(incarnation, attempt, plan.duration_ms, plan.stuck)
        else:
            done = await self._work(incarnation, attempt, plan.subcall_after_ms, plan.stuck)
            if not done:
                return _failure(attempt, FailureCode.CALL_CANCELLED, "interrupted", False)
            result = await self._subcall(executor, incarnation, attempt)
            if result is None:
                return _failure(
                    attempt, FailureCode.CALL_CANCELLED, "cancelled in a subcall", False
                )
            if result.error_code is not None:
                code = (
                    FailureCode.CALL_RAISED_RETRYABLE
                    if result.retryable
                    else FailureCode.CALL_RAISED
                )
                return _failure(attempt, code, "its subcall failed", result.retryable)
            rest_ms = plan.duration_ms - plan.subcall_after_ms
            done = await self._work(incarnation, attempt, rest_ms, plan.stuck)
        if not done:
            return _failure(attempt, FailureCode.CALL_CANCELLED, "interrupted", False)
        return plan.outcome

    async def _work(
        self, incarnation: _Incarnation, attempt: Attempt, duration_ms: int, stuck: bool
    ) -> bool:
        """The call's own code runs for `duration_ms`; False if a cancel interrupted it."""
        key = (attempt.call_id, attempt.attempt)
        with trio.CancelScope() as interrupt:
            if not stuck:
                incarnation.interrupts[key] = interrupt
            await self._world.sleep_ms(duration_ms)
        incarnation.interrupts.pop(key, None)
        return not interrupt.cancelled_caught

    async def _subcall(
        self, executor: _Executor, incarnation: _Incarnation, parent: Attempt
    ) -> CallOutcome | None:
        """Ask for a subcall and run other calls until its result comes; None if the
        parent was cancelled meanwhile."""
        subcall_id = f"{executor.executor_id}.s{next(incarnation.subcall_ids)}"
        self._depth[f"{executor.executor_id}#{incarnation.pid}:{subcall_id}"] = (
            self._depth.get(parent.call_id, 0) + 1
        )
        self._world.record("call", "subcall", parent.call_id, parent.attempt, subcall_id)
        key = (parent.call_id, parent.attempt)
        incarnation.pending[subcall_id] = None
        subcall = Subcall(
            subcall_id=subcall_id,
            parent_call_id=parent.call_id,
            parent_attempt=parent.attempt,
            function=SIM_FUNCTION,
            args=encode_args((parent.index,)),
        )
        self._events.send_nowait(ExecutorMessage(executor_id=executor.executor_id, message=subcall))
        # No `finally`: a hung or killed incarnation keeps the wait it had (the dispatcher
        # still counts it until it learns the executor is gone).
        while True:
            result = incarnation.pending.get(subcall_id)
            if result is not None or key in incarnation.cancelled:
                del incarnation.pending[subcall_id]
                return result
            if incarnation.queue:
                await self._run_one(executor, incarnation, incarnation.queue.popleft())
                continue
            await incarnation.wake.wait()
            incarnation.wake = trio.Event()

    async def _ask_code(self, incarnation: _Incarnation, epoch: str) -> CodeReply:
        request_id = f"code-{next(self._requests)}"
        request = CodeRequest(request_id=request_id, epoch=epoch, module=SIM_MODULE)
        message = ExecutorMessage(executor_id=incarnation.executor_id, message=request)
        self._events.send_nowait(message)
        while request_id not in incarnation.code_replies:
            incarnation.code_arrived = trio.Event()
            await incarnation.code_arrived.wait()
        return incarnation.code_replies.pop(request_id)

    def _plan(self, attempt: Attempt) -> _Plan:
        """What the attempt will do: how long it takes, what it answers, whether it ignores
        a cancel and whether it makes a subcall (and when)."""
        world = self._world
        rng = world.rng
        duration_ms = rng.randint(*CALL_MS)
        stuck = False
        if world.chance(Fault.SLOW_CALL, 0.06):
            duration_ms = attempt.deadline_ms - world.now_ms() + rng.randint(20, 3_000)
            stuck = world.chance(Fault.STUCK_CALL, 0.4)
        subcall_after_ms = None
        if self._depth.get(attempt.call_id, 0) < MAX_SUBCALL_DEPTH and rng.random() < SUBCALLS:
            subcall_after_ms = rng.randint(0, duration_ms)
        if world.chance(Fault.CALL_FAILURE, 0.06):
            outcome = _failure(attempt, FailureCode.CALL_RAISED, "raised", False)
        elif world.chance(Fault.CALL_FAILURE, 0.12):
            outcome = _failure(attempt, FailureCode.CALL_RAISED_RETRYABLE, "raised", True)
        else:
            value = encode_value(call_value(attempt.task_id, attempt.index))
            outcome = CallOutcome.success(
                call_id=attempt.call_id, attempt=attempt.attempt, value=value
            )
        return _Plan(
            outcome=outcome,
            duration_ms=duration_ms,
            stuck=stuck,
            subcall_after_ms=subcall_after_ms,
        )

    def _cancel(self, executor: _Executor, incarnation: _Incarnation, key: tuple[str, int]) -> None:
        self._world.record("call", "cancel", key[0], key[1], executor.executor_id)
        queued = incarnation.outstanding.get(key)
        if queued is None:
            return  # answered already, or never here
        if self._world.now_ms() > queued.deadline_ms:  # the dispatcher gives up at the deadline
            self._world.violation(f"{key} cancelled after its deadline {queued.deadline_ms}")
        if queued in incarnation.queue:
            incarnation.queue.remove(queued)
            failed = _failure(queued, FailureCode.CALL_CANCELLED, "before it started", False)
            self._answer(incarnation, queued, failed)
        elif queued in incarnation.stack:
            incarnation.cancelled.add(key)  # seen when it waits on a subcall
            incarnation.wake.set()
            interrupt = incarnation.interrupts.get(key)
            if interrupt is not None:  # its own code runs: interrupted at once
                interrupt.cancel()

    def _revoke(self, executor: _Executor, incarnation: _Incarnation, key: tuple[str, int]) -> None:
        self._world.record("call", "revoke", key[0], key[1], executor.executor_id)
        queued = incarnation.outstanding.get(key)
        if queued is not None and queued in incarnation.queue:
            incarnation.queue.remove(queued)
            revoked = _failure(queued, FailureCode.CALL_REVOKED, "taken back", True)
            self._answer(incarnation, queued, revoked)

    def _answer(self, incarnation: _Incarnation, attempt: Attempt, outcome: CallOutcome) -> None:
        world = self._world
        if incarnation.closed or incarnation.hung:
            return
        del incarnation.outstanding[attempt.call_id, attempt.attempt]
        attempt.outcome = outcome
        attempt.answered_ms = world.now_ms()
        if attempt.started_ms is not None and attempt.answered_ms >= attempt.deadline_ms:
            # The dispatcher gave up on it while it ran (its deadline wins a tie).
            self._may_have_run.add(attempt.call_id)
        code = outcome.error_code.value if outcome.error_code else "OK"
        world.record("call", "answer", attempt.call_id, attempt.attempt, code)
        results = CallResults(results=(outcome,))
        message = ExecutorMessage(executor_id=incarnation.executor_id, message=results)
        self._events.send_nowait(message)

    # ----------------------------------------------------------------- views

    def _view(self, executor: _Executor) -> ExecutorView:
        incarnation = executor.incarnation
        if incarnation is None or incarnation.closed:
            state = ExecutorState.RESTARTING
        elif incarnation.stack:
            state = ExecutorState.BUSY
        else:
            state = ExecutorState.READY
        return ExecutorView(
            executor_id=executor.executor_id,
            state=state,
            pid=incarnation.pid if incarnation is not None else None,
            rss_bytes=0,
            calls_served=executor.served,
            restarts=executor.restarts,
            running_call_id=incarnation.stack[-1].call_id
            if incarnation is not None and incarnation.stack
            else None,
        )


def sim_code(version: int) -> FunctionSnapshot:
    """Version `version` of the function code: a new epoch each."""
    return FunctionSnapshot.of({SIM_MODULE: f"{SIM_SOURCE}# version {version}\n"})


def call_value(task_id: str, index: int) -> list[object]:
    """What call `index` of `task_id` returns when it succeeds."""
    return [task_id, index]


def _failure(attempt: Attempt, code: FailureCode, message: str, retryable: bool) -> CallOutcome:
    return CallOutcome.failure(
        call_id=attempt.call_id,
        attempt=attempt.attempt,
        error_code=code,
        error_message=message,
        retryable=retryable,
    )
