"""The end-of-run judgement of a simulation: what the worker reported against what happened.

* Exactly once: every accepted task has one terminal result, a refused one
  none, and every terminal snapshot a client was given is that result.
* At most one run: a task's calls ran under one run of its id, whatever was
  submitted again.
* Soundness: a task succeeded only if each of its calls was answered with
  success by an executor; a failure in the calls phase names something an
  executor did (a code it answered, a process that went down under the call,
  a call not answered before its deadline).
* Completeness: a task whose calls all succeeded on their final attempt, in
  time, succeeded (or failed in its plugin, if that was made to fail),
  unless something from outside ended it: its short deadline, its watcher
  going away, the worker's drain timeout, its plugin taking longer than the
  phase IO timeout. Each of those causes is named only when it was possible.
* The test plugin kept exactly the values the executors returned, in call order.
"""

from __future__ import annotations

import itertools

from blockx.calls import CallFailurePolicy, FailureCode
from blockx.executors import DownReason
from blockx.phases.plugins import test_outputs as kept_outputs
from blockx.slots import TaskPhase, TaskResult, TaskSnapshot, TaskState
from tests.sim.world import EPOCH_MS, Attempt, TaskRecord, World

_MAY_HAVE_RUN = frozenset(
    {FailureCode.EXECUTOR_LOST, FailureCode.EXECUTOR_WEDGED, FailureCode.DEADLINE_EXCEEDED}
)
"""Failures of an attempt that may have had effects: never tried again when at most once."""
_RETRYABLE = _MAY_HAVE_RUN | {FailureCode.CALL_RAISED_RETRYABLE}


def judge(world: World) -> None:
    """Record a violation in `world` for each rule of the module docstring it breaks."""
    by_task: dict[str, list[Attempt]] = {}
    for attempt in world.attempts:
        if not attempt.subcall:  # a subcall's end reaches the task through its caller
            by_task.setdefault(attempt.task_id, []).append(attempt)
    for task_id in world.results.keys() - world.tasks.keys():
        world.violation(f"a result for {task_id}, which no client submitted")
    for task_id, record in world.tasks.items():
        attempts = by_task.get(task_id, [])
        results = world.results.get(task_id, [])
        if record.accepted_ms is None and not (record.answer_unknown and results):
            if results or attempts:
                world.violation(f"{task_id} was refused, yet it ran: {results!r}")
            continue
        if len(results) != 1:
            world.violation(f"{task_id} ended {len(results)} times: {results!r}")
            continue
        _judge_task(world, record, results[0], attempts)


def _judge_task(
    world: World, record: TaskRecord, result: TaskResult, attempts: list[Attempt]
) -> None:
    task_id = record.spec.task_id
    for seen in record.terminal_seen:
        if seen != TaskSnapshot.of_result(result):
            world.violation(f"{task_id} was shown {seen!r}, yet it ended {result!r}")
    runs = {attempt.run for attempt in attempts}
    if len(runs) > 1:
        world.violation(f"{task_id} ran {len(runs)} times: {sorted(runs)}")
    epochs = {a.epoch for a in world.attempts if a.task_id == task_id}
    if epochs - {result.task_code_epoch}:
        world.violation(f"{task_id} pinned {result.task_code_epoch}, yet ran {sorted(epochs)}")
    deadline_ms = result.accepted_at_ms + (record.spec.task_timeout_ms or world.task_deadline_ms)
    if result.finished_at_ms > deadline_ms:  # on time: not even a millisecond late
        world.violation(f"{task_id} outlived its deadline {deadline_ms}: {result!r}")
    if result.failure_code is FailureCode.TIMED_OUT and result.finished_at_ms < deadline_ms:
        world.violation(f"{task_id} timed out before its deadline {deadline_ms}: {result!r}")
    outside = _outside_cause(world, record, result)
    if outside is not None:
        if not outside:
            world.violation(f"{task_id} ended {result.failure_code} without a cause: {result!r}")
        return
    _judge_backoff(world, record, attempts)
    if result.phase is TaskPhase.CALLS and result.state is TaskState.FAILED:
        _judge_failed_calls(world, record, result, attempts)
    finals = _final_attempts(attempts)
    all_succeeded = len(finals) == record.call_count and all(
        attempt.succeeded_in_time() for attempt in finals.values()
    )
    plugin_late = record.plugin_delay_ms > world.phase_io_timeout_ms
    if result.state is TaskState.SUCCEEDED:
        _judge_succeeded(world, record, result, attempts)
        if plugin_late:
            world.violation(f"{task_id}'s plugin ran past phaseIoTimeoutMs, yet it succeeded")
    elif all_succeeded and not (record.plugin_fails or plugin_late):
        world.violation(f"{task_id}'s calls all succeeded in time, yet it ended {result!r}")
    elif all_succeeded and result.phase is not TaskPhase.PLUGIN:
        world.violation(f"{task_id}'s plugin was to fail, yet it ended {result!r}")


def _outside_cause(world: World, record: TaskRecord, result: TaskResult) -> bool | None:
    """None: the result has no outside cause; else whether that cause was possible (and
    came on time: the watch grace after a client left, the drain timeout after the drain)."""
    finished_ms = result.finished_at_ms - EPOCH_MS
    match result.failure_code:
        case FailureCode.TIMED_OUT:
            return record.short_timeout
        case FailureCode.WATCH_DISCONNECTED:
            grace_ms = world.watch_grace_ms
            return grace_ms > 0 and any(
                left_ms + grace_ms <= finished_ms for left_ms in record.watch_left_ms
            )
        case FailureCode.WORKER_SHUTDOWN:
            since_ms = world.draining_since_ms
            return (
                world.drain_forced
                and since_ms is not None
                and finished_ms == since_ms + world.drain_timeout_ms
            )
        case FailureCode.PLUGIN_FAILED:
            return record.plugin_fails
        case FailureCode.PHASE_IO_TIMEOUT:  # (a tie goes either way)
            return record.plugin_delay_ms >= world.phase_io_timeout_ms
        case _:
            return None


def _judge_backoff(world: World, record: TaskRecord, attempts: list[Attempt]) -> None:
    """A call that failed retryably (answered in time) runs again only after its back-off:
    `base * 2**(tries - 1)` at least, counting the attempts that were not taken back."""
    policy = record.spec.call_retry_policy or world.default_retry
    by_index: dict[int, list[Attempt]] = {}
    for attempt in attempts:
        by_index.setdefault(attempt.index, []).append(attempt)
    for tried in by_index.values():
        tried.sort(key=lambda attempt: attempt.attempt)
        tries = 0
        for before, after in itertools.pairwise(tried):
            if not _revoked(before):
                tries += 1
            outcome = before.outcome
            if (
                outcome is None
                or outcome.error_code in (None, FailureCode.CALL_REVOKED)
                or not outcome.retryable
                or before.answered_ms is None
                or before.answered_ms >= before.deadline_ms
            ):
                continue
            due_ms = before.answered_ms + (policy.base_backoff_ms << (tries - 1))
            if after.received_ms < due_ms:
                world.violation(
                    f"{after.call_id} attempt {after.attempt} ran at {after.received_ms} ms, "
                    f"before its back-off ended at {due_ms} ms"
                )


def _final_attempts(attempts: list[Attempt]) -> dict[int, Attempt]:
    """Each call's last attempt, by call index."""
    finals: dict[int, Attempt] = {}
    for attempt in attempts:
        if attempt.index not in finals or attempt.attempt > finals[attempt.index].attempt:
            finals[attempt.index] = attempt
    return finals


def _judge_failed_calls(
    world: World, record: TaskRecord, result: TaskResult, attempts: list[Attempt]
) -> None:
    """A failed calls phase names what an executor did to the last attempt of a call, and
    a retryable failure ends a call only once it used up its attempts."""
    code = result.failure_code
    policy = record.spec.call_retry_policy or world.default_retry
    by_index: dict[int, list[Attempt]] = {}
    for attempt in attempts:
        by_index.setdefault(attempt.index, []).append(attempt)
    for tried in by_index.values():
        final = max(tried, key=lambda attempt: attempt.attempt)
        counted = sum(1 for a in tried if not _revoked(a))
        used_up = counted >= policy.max_attempts or (policy.at_most_once and code in _MAY_HAVE_RUN)
        if _did(final, code) and (code not in _RETRYABLE or used_up):
            return
    world.violation(
        f"{record.spec.task_id} failed {code}, which no executor did to a call that "
        f"could not try again: {result!r}"
    )


def _did(attempt: Attempt, code: FailureCode | None) -> bool:
    """Whether what happened to `attempt` is what `code` says."""
    answered = attempt.outcome.error_code if attempt.outcome is not None else None
    match code:
        case FailureCode.CALL_RAISED | FailureCode.CALL_RAISED_RETRYABLE:
            return answered is code
        case FailureCode.EXECUTOR_LOST:
            return attempt.lost in (DownReason.EXITED, DownReason.LOST)
        case FailureCode.EXECUTOR_WEDGED:
            return attempt.lost is DownReason.WEDGED
        case FailureCode.DEADLINE_EXCEEDED:
            return attempt.answered_ms is None or attempt.answered_ms >= attempt.deadline_ms
        case _:
            return False


def _revoked(attempt: Attempt) -> bool:
    outcome = attempt.outcome
    return outcome is not None and outcome.error_code is FailureCode.CALL_REVOKED


def _judge_succeeded(
    world: World, record: TaskRecord, result: TaskResult, attempts: list[Attempt]
) -> None:
    """Success only from executors' successes; the outputs are what they returned."""
    task_id = record.spec.task_id
    succeeded = {
        a.index for a in attempts if a.outcome is not None and a.outcome.error_code is None
    }
    stats = result.call_stats
    fail_fast = record.spec.call_failure_policy is CallFailurePolicy.FAIL_FAST
    if (
        stats.calls_total != record.call_count
        or stats.calls_succeeded > len(succeeded)
        or (fail_fast and stats.calls_succeeded != record.call_count)
    ):
        world.violation(f"{task_id} counts successes no executor gave: {result!r}")
    if record.spec.result_handler is None:
        return
    kept = kept_outputs(task_id)
    wanted = [
        index
        for index, attempt in sorted(_final_attempts(attempts).items())
        if attempt.succeeded_in_time()
    ]
    indices = [_index_of(task_id, value) for value in kept or ()]
    if (
        kept is None
        or len(kept) != stats.calls_succeeded
        or indices != sorted(indices)
        or not set(indices) <= succeeded
        or not set(wanted) <= set(indices)
    ):
        world.violation(f"{task_id}'s plugin kept {kept!r}, not what the calls returned")


def _index_of(task_id: str, value: object) -> int:
    """The call index `value` came from (`call_value`), or -1 if it is not such a value."""
    match value:
        case [str() as of_task, int() as index] if of_task == task_id:
            return index
        case _:
            return -1
