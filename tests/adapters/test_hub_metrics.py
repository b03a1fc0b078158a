"""The hub's `/metrics`: scraped and parsed as Prometheus would, checked against what ran
and against the database (SQLite and PostgreSQL), on Trio's virtual clock."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio
import trio.testing
from prometheus_client.parser import text_string_to_metric_families

from blockx.autoworker import WorkerExecution, WorkerFailure
from blockx.hub import Right, Store
from blockx.hub._committer import Committer
from blockx.hub._metrics import HubMetrics
from blockx.hub._store import Tx
from blockx.hubwire import Succeeded
from tests.adapters.autoworker_rig import SQLITE, options, state_of, worker
from tests.adapters.hub_harness import CAPABILITY, QUEUE, TEST_CONFIG, HubRig, running_hub

ENDED = ("SUCCEEDED", "FAILED", "NEEDS_REVIEW")

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def parse(text: str) -> Samples:
    """Every sample of a scrape, by name and labels (the parser Prometheus' own clients use)."""
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, frozenset(labels.items())), 0.0)


async def scrape(rig: HubRig, token: str | None = None) -> Samples:
    status, text = await rig.http_text("GET", "/metrics", token=token)
    assert status == 200, text
    return parse(text)


def from_database(rig: HubRig, sql: str) -> dict[str, int]:
    rows = rig.store.read(lambda tx: tx.rows(sql))
    return {str(key): int(count) for key, count in rows}


async def handle(execution: WorkerExecution) -> Any:
    match execution.payload["do"]:
        case "fail":
            raise WorkerFailure("REJECTED")
        case "retry":
            raise WorkerFailure("BUSY", retryable=True)
        case "error":
            raise RuntimeError("an effect may have happened")
    return {"ok": True}


async def test_the_counters_agree_with_what_ran_and_with_the_database(
    hub_url: str, autojump_clock: trio.testing.MockClock
) -> None:
    async with running_hub(hub_url) as rig:
        token = rig.credential()
        ids = [(await rig.submit(token, payload={"do": "ok"}))["task_id"] for _ in range(3)]
        for do in ("fail", "error"):
            ids.append((await rig.submit(token, payload={"do": do}))["task_id"])
        retried = await rig.submit(token, payload={"do": "retry"}, max_attempts=2)
        ids.append(retried["task_id"])
        again = {**attrs.asdict(CAPABILITY), "payload": {"do": "ok"}, "task_id": "again"}
        path = f"/v1/queues/{QUEUE}/tasks"
        first = await rig.http("POST", path, token=token, body=again)
        repeat = await rig.http("POST", path, token=token, body=again)  # no new submission
        assert (first[0], repeat[0]) == (201, 200)
        ids.append("again")
        auto = worker(rig, token, options(handle, capacity=3))
        async with trio.open_nursery() as nursery:
            nursery.start_soon(auto.run)
            for task_id in ids:
                await state_of(rig, token, task_id, *ENDED)
            await trio.sleep(1)  # the worker's last reports are confirmed
            running = await scrape(rig)
            nursery.cancel_scope.cancel()
        after = await scrape(rig)
        tasks = from_database(rig, "SELECT state, COUNT(*) FROM tasks GROUP BY state")
        attempts = from_database(rig, "SELECT state, COUNT(*) FROM attempts GROUP BY state")
        started = from_database(
            rig, "SELECT queue_id, COUNT(*) FROM attempts JOIN tasks USING (task_id) "
            "WHERE started_at_ms > 0 GROUP BY queue_id"
        )  # fmt: skip

    q = {"queue": QUEUE}
    assert tasks == {"SUCCEEDED": 4, "FAILED": 2, "NEEDS_REVIEW": 1}
    for state in ("QUEUED", "OFFERED", "RUNNING", *ENDED):
        assert value(after, "blockx_hub_tasks", state=state, **q) == tasks.get(state, 0)
    assert value(after, "blockx_hub_submissions_total", **q) == sum(tasks.values()) == 7
    assert value(after, "blockx_hub_grants_total", **q) == started[QUEUE] == 8
    for outcome in ("SUCCEEDED", "FAILED", "UNKNOWN"):
        counted = value(after, "blockx_hub_finishes_total", outcome=outcome, **q)
        assert counted == attempts.get(outcome, 0)
    assert attempts == {"SUCCEEDED": 4, "FAILED": 3, "UNKNOWN": 1}
    assert value(after, "blockx_hub_retries_total", **q) == 1
    assert value(after, "blockx_hub_reviews_total", **q) == 1
    assert value(after, "blockx_hub_lease_expiries_total", **q) == 0
    assert value(after, "blockx_hub_queue_wait_seconds_count", **q) == 8
    assert value(after, "blockx_hub_attempt_duration_seconds_count", **q) == 8
    assert value(after, "blockx_hub_database_errors_total") == 0
    assert value(after, "blockx_hub_commit_batch_size_count") > 0
    assert value(after, "blockx_hub_commit_duration_seconds_count") > 0
    assert value(running, "blockx_hub_sessions", **q) == 1
    assert value(running, "blockx_hub_capacity_declared", **q) == 3
    assert value(running, "blockx_hub_capacity_used", **q) == 0  # all ended
    assert value(after, "blockx_hub_sessions", **q) == 0
    assert value(after, "process_cpu_seconds_total") > 0


async def test_a_lapsed_lease_and_the_time_waited_and_run_are_counted(
    hub_url: str, autojump_clock: trio.testing.MockClock
) -> None:
    async with running_hub(hub_url) as rig:
        token = rig.credential()
        await rig.submit(token)
        await trio.sleep(2)  # queued with nobody to run it
        async with rig.worker(token) as client:
            offer = await client.offer()
            await trio.sleep(0.5)
            await client.start(offer)
            await trio.sleep(TEST_CONFIG.lease_ms / 1000 + 1)  # never renewed: it lapses
            late = await scrape(rig)
            await client.finish(offer, Succeeded(result="1"))  # evidence only
        after = await scrape(rig)
    q = {"queue": QUEUE}
    assert value(late, "blockx_hub_lease_expiries_total", **q) == 1
    assert value(late, "blockx_hub_reviews_total", **q) == 1  # not idempotent: a person decides
    assert value(late, "blockx_hub_tasks", state="NEEDS_REVIEW", **q) == 1
    assert value(after, "blockx_hub_finishes_total", outcome="SUCCEEDED", **q) == 0
    assert value(after, "blockx_hub_lease_expiries_total", **q) == 1
    # Waited 2.5 s (submitted, offered at 2 s, started at 2.5 s); ran 10 s, its lease.
    assert value(after, "blockx_hub_queue_wait_seconds_sum", **q) == pytest.approx(2.5)
    assert value(after, "blockx_hub_queue_wait_seconds_bucket", le="2.5", **q) == 1
    assert value(after, "blockx_hub_queue_wait_seconds_bucket", le="1.0", **q) == 0
    assert value(after, "blockx_hub_attempt_duration_seconds_sum", **q) == pytest.approx(10)


@SQLITE
async def test_with_admin_only_the_metrics_need_an_admin_credential(
    hub_url: str, autojump_clock: trio.testing.MockClock
) -> None:
    config = attrs.evolve(TEST_CONFIG, metrics_admin_only=True)
    async with running_hub(hub_url, config) as rig:
        producer = rig.credential()
        admin = rig.credential(QUEUE, Right.ADMIN)
        anonymous = await rig.http("GET", "/metrics")
        not_admin = await rig.http("GET", "/metrics", token=producer)
        wrong = await rig.http("GET", "/metrics", token="bxc_nobody.secret")
        posted = await rig.http("POST", "/metrics", token=admin)
        samples = await scrape(rig, admin)
    assert anonymous[0] == wrong[0] == 401
    assert not_admin == (403, {"error": "the metrics need an admin credential"})
    assert posted == (405, {"error": "GET only"})
    assert value(samples, "blockx_hub_tasks", queue=QUEUE, state="QUEUED") == 0


@SQLITE
async def test_by_default_anyone_reads_the_metrics_and_every_queue_shows(
    hub_url: str, autojump_clock: trio.testing.MockClock
) -> None:
    async with running_hub(hub_url) as rig:
        samples = await scrape(rig)  # no credential
    for state in ("QUEUED", "OFFERED", "RUNNING", *ENDED):
        assert (("blockx_hub_tasks", frozenset({("queue", QUEUE), ("state", state)}))) in samples
    assert value(samples, "blockx_hub_sessions", queue=QUEUE) == 0


async def test_database_errors_and_batches_are_counted(tmp_path: Path) -> None:
    store = Store(str(tmp_path / "hub.sqlite3"))
    metrics = HubMetrics(lambda: 0)
    committer = Committer(store, use_thread=False, tails=(metrics,), meter=metrics)
    answers: list[object] = []
    async with trio.open_nursery() as nursery:
        for queue_id in ("a", "b", "a"):  # the second "a" is a duplicate key
            committer.submit(
                functools.partial(Tx.create_queue, queue_id=queue_id, now_ms=0), answers.append
            )
        nursery.start_soon(committer.run)
        await committer.idle()
        nursery.cancel_scope.cancel()
    store.close()
    samples = parse(metrics.render("", ([], []), ())[0].decode())
    assert [type(answer).__name__ for answer in answers] == ["NoneType", "NoneType", "StoreError"]
    # The batch of three failed, then each ran alone: two commits of one, one more failure.
    assert value(samples, "blockx_hub_database_errors_total") == 2
    assert value(samples, "blockx_hub_commit_batch_size_count") == 2
    assert value(samples, "blockx_hub_commit_batch_size_sum") == 2
