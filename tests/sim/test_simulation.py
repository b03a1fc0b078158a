"""The whole worker under deterministic simulation (`tests.sim.simulation`).

Every seed must keep every invariant (`tests.sim.checks`, and those the fakes
judge on the spot). A failure names its seed and how to run it again:
`BLOCKX_SIM_SEED=<seed> uv run pytest tests/sim -k test_replay` replays it
exactly, in any process. Hypothesis draws the seeds; its profile sets how
many (half the profile's examples: each is a whole worker's run).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import hypothesis.strategies as st
import pytest
from hypothesis import given, settings

from tests.sim.simulation import RERUN, Shape, SimRun, simulate

ROOT = Path(__file__).resolve().parents[2]
SEED_ENV = "BLOCKX_SIM_SEED"
REPLAYED_SEED = 20_240_611
"""The seed `test_replay` runs when no seed is named."""
EXAMPLES = max(10, settings().max_examples // 2)
FAILED_ONCE = {
    15: "a task's deadline fired a millisecond late (EpochClock's rounding)",
    65: "a task's deadline fired a millisecond late (EpochClock's rounding)",
    3321: "the probe came while the only executor restarted: not ready is right, so it waits",
}
"""Seeds that found a bug, and what it was (each fixed with a test of its own)."""


@settings(max_examples=EXAMPLES)
@given(seed=st.integers(0, 2**32 - 1))
def test_every_seed_keeps_every_invariant(seed: int) -> None:
    simulate(seed).check()


@pytest.mark.parametrize("seed", sorted(FAILED_ONCE))
def test_a_seed_that_found_a_bug_keeps_every_invariant(seed: int) -> None:
    simulate(seed).check()


def test_replay() -> None:
    """The seed named by BLOCKX_SIM_SEED (as a failure prints it), else a fixed one."""
    seed = int(os.environ.get(SEED_ENV, REPLAYED_SEED))
    run = simulate(seed)
    print(f"seed {seed}: {run.shape}; outcomes {run.outcomes}")
    run.check()


def test_a_seed_replays_its_trace_exactly() -> None:
    first = simulate(REPLAYED_SEED)
    assert len(first.trace) > 100
    assert simulate(REPLAYED_SEED).trace == first.trace
    assert simulate(REPLAYED_SEED + 1).trace != first.trace


def test_a_seed_replays_in_a_fresh_process_with_other_string_hashes() -> None:
    """What a failure prints is enough to replay it elsewhere: nothing depends on hashing."""
    digests = {simulate(REPLAYED_SEED).digest}
    for hash_seed in ("1", "2"):
        script = (
            f"from tests.sim.simulation import simulate; print(simulate({REPLAYED_SEED}).digest)"
        )
        env = {**os.environ, "PYTHONHASHSEED": hash_seed}
        done = subprocess.run(
            [sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True, check=True
        )
        digests.add(done.stdout.decode().strip())
    assert len(digests) == 1, digests


def test_without_faults_every_accepted_task_succeeds() -> None:
    for seed in range(5):
        run = simulate(seed, faults=frozenset())
        run.check()
        assert run.outcomes.get("SUCCEEDED", 0) > 0
        assert set(run.outcomes) <= {"SUCCEEDED", "refused"}, run.outcomes


def test_the_faults_reach_the_worker() -> None:
    """Over a few seeds each fault happens, and shows in how tasks end."""
    outcomes: set[str] = set()
    happened: set[str] = set()
    for seed in range(40):
        run = simulate(seed)
        run.check()
        outcomes.update(run.outcomes)
        happened.update(str(event[2]) for event in run.trace)
    assert happened >= {
        "crash",
        "hang",
        "replace",
        "subcall",
        "went away",
        "went away from run tasks",
        "leaves reservation",
        "drain",
        "code",
    }, happened
    assert outcomes >= {
        "CALL_RAISED",
        "CALL_RAISED_RETRYABLE",
        "DEADLINE_EXCEEDED",
        "EXECUTOR_LOST",
        "PHASE_IO_TIMEOUT",
        "PLUGIN_FAILED",
        "TIMED_OUT",
        "WATCH_DISCONNECTED",
        "WORKER_SHUTDOWN",
        "SUCCEEDED",
        "refused",
    }, outcomes


def test_a_failed_run_names_its_seed_and_how_to_rerun_it() -> None:
    shape = Shape(
        task_slots=2,
        executors=1,
        executor_capacity=1,
        clients=2,
        executor_task_slots=1,
        plugin_slots=1,
        phase_io_timeout_ms=300,
        result_retention_ms=1_500,
        watch_grace_ms=0,
        stop_at_ms=None,
    )
    run = SimRun(
        seed=42,
        shape=shape,
        trace=((5, "worker", "finished", "t1", "FAILED", "TIMED_OUT"),),
        violations=("at 5 ms: t1 ended TIMED_OUT without a cause",),
        outcomes={"TIMED_OUT": 1},
    )
    report = run.report()
    assert report.startswith("simulation seed 42 broke 1 invariant(s); rerun: ")
    assert RERUN.format(seed=42) == "BLOCKX_SIM_SEED=42 uv run pytest tests/sim -k test_replay"
    assert RERUN.format(seed=42) in report
    assert "t1 ended TIMED_OUT without a cause" in report
    assert "(5, 'worker', 'finished', 't1', 'FAILED', 'TIMED_OUT')" in report
    with pytest.raises(AssertionError) as raised:
        run.check()
    assert str(raised.value) == report
