"""Sending `HostileCall`s through grpcio and judging what comes back.

`Judge.run` sends one call, checks the status it ended with against the call's, and
follows every task the call admitted to its one terminal result, whose code the
call must allow. Like a client that reserves in order to submit, it then uses the
slot of every reservation the call made, so the next call finds slots free.
`Judge.settle` brings the worker back to idle and returns its status.
"""

from __future__ import annotations

import collections
from collections.abc import Iterable

import attrs
import grpc
from grpclib.health.v1.health_pb2 import HealthCheckResponse

from blockx._proto.blockx.worker import v1 as pb
from tests.e2e.hostile.strategies import (
    ABORTED,
    DEADLINE,
    NAMED_CODES,
    OK,
    PRECONDITION,
    SERVICE,
    SUCCEEDED,
    HostileCall,
    Shape,
)

STATUS_NAMES = {code.value[0]: code.name for code in grpc.StatusCode}
FOLLOW_TIMEOUT_S = 120.0
WATCH_DISCONNECTED = "WATCH_DISCONNECTED"
SLOT_LOST = "SLOT_LOST"


@attrs.frozen
class Outcome:
    status: str
    details: str
    replies: tuple[bytes, ...]


@attrs.frozen
class Follow:
    """A task to follow to its end: the codes its result may carry, and whether it may
    never have been admitted (its submit ran out of time) or may lapse unsubmitted."""

    codes: frozenset[str]
    may_be_absent: bool = False


class Judge:
    def __init__(self, port: int) -> None:
        self.channel = grpc.insecure_channel(
            f"127.0.0.1:{port}",
            options=[("grpc.max_send_message_length", -1), ("grpc.max_receive_message_length", -1)],
        )
        self.calls = 0
        self.statuses: collections.Counter[str] = collections.Counter()
        self.results: collections.Counter[str] = collections.Counter()
        """Terminal results seen, by failure code ("" = succeeded)."""

    def close(self) -> None:
        self.channel.close()

    # --- sending ---------------------------------------------------------------------

    def send(self, method: str, shape: Shape, bodies: Iterable[bytes], timeout_s: float) -> Outcome:
        replies: list[bytes] = []
        try:
            match shape:
                case Shape.UNARY:
                    (body,) = bodies
                    replies.append(self.channel.unary_unary(method)(body, timeout=timeout_s))
                case Shape.SERVER_STREAM:
                    (body,) = bodies
                    replies.extend(self.channel.unary_stream(method)(body, timeout=timeout_s))
                case Shape.BIDI:
                    call = self.channel.stream_stream(method)
                    replies.extend(call(iter(tuple(bodies)), timeout=timeout_s))
        except grpc.RpcError as error:
            return Outcome(error.code().name, error.details() or "", tuple(replies))
        return Outcome(OK, "", tuple(replies))

    # --- judging ---------------------------------------------------------------------

    def run(self, call: HostileCall) -> None:
        """Send `call` and judge the answer and everything it started; AssertionError
        naming the call if the worker got anything wrong."""
        self.calls += 1
        outcome = self.send(call.method, call.shape, call.bodies, call.timeout_s)
        self._judge_status(call, outcome)
        if call.repeat and outcome.status == OK:
            again = self.send(call.method, call.shape, call.bodies, call.timeout_s)
            self._judge_status(call, again)
            if again.status == OK:
                _judge_repeat(call, outcome.replies[0], again.replies[0])
        expected = {task.task_id: task.codes for task in call.tasks}
        follows: dict[str, Follow] = {}
        match call.method.removeprefix(SERVICE):
            case "RequestTaskSlot" if outcome.status == OK:
                reply = pb.RequestTaskSlotResponse.parse(outcome.replies[0])
                if reply.state == pb.TaskState.ALLOCATED:
                    follows |= self._use_reservation(reply.task_id, reply.slot_id)
            case "SubmitTask" if outcome.status == OK:
                task_id = pb.SubmitTaskResponse.parse(outcome.replies[0]).task_id
                follows[task_id] = Follow(expected.get(task_id, NAMED_CODES))
            case "SubmitTask" if outcome.status == DEADLINE:  # admitted, or not
                follows |= {
                    id_: Follow(codes, may_be_absent=True) for id_, codes in expected.items()
                }
            case "RunTasks":
                follows |= self._judge_stream(call, outcome, expected)
        self._follow(call.what, follows)

    def _judge_status(self, call: HostileCall, outcome: Outcome) -> None:
        self.statuses[outcome.status] += 1
        assert outcome.status in call.statuses, (
            f"{call.what}: ended {outcome.status} ({outcome.details[:300]!r}); "
            f"expected one of {sorted(call.statuses)}"
        )
        if outcome.status != OK:
            assert outcome.details.strip(), f"{call.what}: {outcome.status} without a message"

    def _judge_stream(
        self, call: HostileCall, outcome: Outcome, expected: dict[str, frozenset[str]]
    ) -> dict[str, Follow]:
        """Check a RunTasks stream's events; the tasks it accepted and did not finish."""
        events = [e for reply in outcome.replies for e in pb.RunTasksResponse.parse(reply).events]
        broken = outcome.status != OK
        answered: list[str] = []
        finished: collections.Counter[str] = collections.Counter()
        for event in events:
            if event.accepted is not None or event.refused is not None:
                index = len(answered)
                assert index < len(call.answers), f"{call.what}: more answers than requests"
                if event.accepted is not None:
                    status, task_id = OK, event.accepted.task_id
                else:
                    assert event.refused is not None
                    status, task_id = STATUS_NAMES[event.refused.status], event.refused.task_id
                    assert event.refused.message.strip(), f"{call.what}: refused without a word"
                assert status in call.answers[index], (
                    f"{call.what}: request {index} answered {status}, "
                    f"expected one of {sorted(call.answers[index])}"
                )
                answered.append(task_id if status == OK else "")
            else:
                update = event.finished
                assert update is not None
                assert update.is_terminal
                assert update.result is not None
                assert update.task_id in answered, f"{call.what}: {update.task_id!r} ended unasked"
                finished[update.task_id] += 1
                codes = expected.get(update.task_id, NAMED_CODES)
                self._judge_result(call.what, update.task_id, update.result, codes)
        accepted = {task_id for task_id in answered if task_id}
        assert all(count == 1 for count in finished.values()), f"{call.what}: {finished}"
        if not broken:
            assert len(answered) == len(call.answers), f"{call.what}: {len(answered)} answers"
            assert set(finished) == accepted, f"{call.what}: {sorted(accepted - set(finished))}"
        lost = {WATCH_DISCONNECTED} if broken else set()
        return {
            task_id: Follow(expected.get(task_id, NAMED_CODES) | lost)
            for task_id in accepted - set(finished)
        }

    def _judge_result(
        self, what: str, task_id: str, result: pb.TaskResult, codes: frozenset[str]
    ) -> None:
        code = result.failure_code
        self.results[code] += 1
        assert code in NAMED_CODES, f"{what}: task {task_id!r} ended with code {code!r}"
        assert code in codes, (
            f"{what}: task {task_id[:40]!r} ended {code or 'SUCCEEDED'} "
            f"({result.message[:300]!r}); expected one of {sorted(codes)}"
        )
        succeeded = result.state == pb.TaskState.SUCCEEDED
        assert succeeded == (code == SUCCEEDED), f"{what}: {result.state} with code {code!r}"
        assert succeeded or result.message.strip(), f"{what}: {code} without a message"

    # --- reservations and tasks --------------------------------------------------------

    def _use_reservation(self, task_id: str, slot_id: str) -> dict[str, Follow]:
        """Submit a task that does nothing into a reserved slot (as a client that
        reserved would); the task to follow, or the reservation until it lapses."""
        spec = pb.TaskSpec(
            task_id=task_id, function_call=pb.FunctionCallConfig(type="call_list"), payload=b"[]"
        )
        body = bytes(pb.SubmitTaskRequest(task=spec, slot_id=slot_id))
        outcome = self.send(SERVICE + "SubmitTask", Shape.UNARY, (body,), 30.0)
        # A lease that ran out meanwhile: the slot is taken back (ABORTED while it is).
        assert outcome.status in (OK, PRECONDITION, ABORTED), (task_id, outcome)
        if outcome.status == OK:
            return {task_id: Follow(frozenset({SUCCEEDED, SLOT_LOST}))}
        return {task_id: Follow(frozenset({SUCCEEDED, SLOT_LOST}), may_be_absent=True)}

    def _follow(self, what: str, follows: dict[str, Follow]) -> None:
        """Watch every task to its end: exactly one terminal update each, with a code it
        may have. A task that may be absent may end the watch with NOT_FOUND instead."""
        certain = [task_id for task_id, f in follows.items() if not f.may_be_absent]
        if certain:
            self._watch(what, certain, follows, absent_ok=False)
        for task_id, follow in follows.items():
            if follow.may_be_absent:
                self._watch(what, [task_id], follows, absent_ok=True)

    def _watch(
        self, what: str, task_ids: list[str], follows: dict[str, Follow], *, absent_ok: bool
    ) -> None:
        body = bytes(pb.WatchTasksRequest(task_ids=task_ids))
        outcome = self.send(SERVICE + "WatchTasks", Shape.SERVER_STREAM, (body,), FOLLOW_TIMEOUT_S)
        if absent_ok and outcome.status == "NOT_FOUND":
            return
        assert outcome.status == OK, f"{what}: watching {task_ids[:3]}: {outcome}"
        terminal: collections.Counter[str] = collections.Counter()
        for reply in outcome.replies:
            update = pb.TaskUpdate.parse(reply)
            if update.is_terminal:
                terminal[update.task_id] += 1
                assert update.result is not None, f"{what}: a terminal update without a result"
                codes = follows[update.task_id].codes
                self._judge_result(what, update.task_id, update.result, codes)
        assert terminal == dict.fromkeys(task_ids, 1), f"{what}: terminal updates {terminal}"

    def status(self) -> pb.GetWorkerStatusResponse:
        outcome = self.send(SERVICE + "GetWorkerStatus", Shape.UNARY, (b"",), 30.0)
        assert outcome.status == OK, outcome
        return pb.GetWorkerStatusResponse.parse(outcome.replies[0])

    def health(self) -> int:
        outcome = self.send("/grpc.health.v1.Health/Check", Shape.UNARY, (b"",), 30.0)
        assert outcome.status == OK, outcome
        serving: int = HealthCheckResponse.FromString(outcome.replies[0]).status
        return serving

    def settle(self) -> pb.GetWorkerStatusResponse:
        """Use every slot still reserved and follow every task still running, then the
        worker's status (every slot free, unless something leaked one)."""
        follows: dict[str, Follow] = {}
        for slot in self.status().slots:
            if slot.state == "ALLOCATED":
                follows |= self._use_reservation(slot.task_id, slot.slot_id)
            elif slot.state == "RUNNING":
                follows[slot.task_id] = Follow(NAMED_CODES, may_be_absent=True)
        self._follow("settling", follows)
        return self.status()


def _judge_repeat(call: HostileCall, first: bytes, second: bytes) -> None:
    """The same call twice: the same reservation, or the same task (never a second one)."""
    if call.method == SERVICE + "RequestTaskSlot":
        one, two = pb.RequestTaskSlotResponse.parse(first), pb.RequestTaskSlotResponse.parse(second)
        assert (one.task_id, one.slot_id) == (two.task_id, two.slot_id), (call.what, one, two)
        return
    one_, two_ = pb.SubmitTaskResponse.parse(first), pb.SubmitTaskResponse.parse(second)
    assert one_.task_id == two_.task_id, (call.what, one_, two_)
    if two_.state == pb.TaskState.RUNNING:
        assert two_.slot_id == one_.slot_id, (call.what, one_, two_)
