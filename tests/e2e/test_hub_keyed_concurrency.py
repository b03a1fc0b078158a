"""Two hubs sharing one PostgreSQL database never have more attempts of one concurrency key
live (offered or running) at once than the key's limit.

Two real `python -m blockx hub` processes on one database, two scripted
workers on each. Tasks of two keys (limits 1 and 2) and of no key are
submitted through both hubs; each worker starts every offer it gets, works a
moment and reports success, until every task has succeeded. Then a log the
database itself kept of every attempt's offer and end, by transaction (the
hubs' clocks may differ by a millisecond), says per key how many attempts were
live at once.
"""

from __future__ import annotations

import itertools
from typing import Any

import trio

from blockx.hub import Store, set_key_limit
from blockx.hub._store import Tx
from blockx.hubwire import Succeeded
from tests.adapters.hub_harness import QUEUE
from tests.e2e.hub_process import HubProcess, hub_process, queue_with_credential

LIMITS = {"one": 1, "two": 2}
TASKS_PER_KEY = 30
ENV = {
    "HUB_LEASE_MS": "30000",
    "HUB_OFFER_TTL_MS": "30000",
    "HUB_POLL_MS": "10",
    "HUB_SESSION_TTL_MS": "60000",
    "LOG_FORMAT": "text",
}
WORK_S = 0.005
"""How long a worker's handler runs: long enough for the other hub's claims to race it."""
FAIL_AFTER_S = 120


async def run_tasks(hub: HubProcess, token: str, name: str, done: dict[str, int]) -> None:
    """Start, work on and finish every offer, until `done` counts every task."""
    async with hub.worker(token, instance_id=name, capacity=3) as worker:
        while True:
            offer = await worker.offer()
            await worker.start(offer)
            await trio.sleep(WORK_S)
            await worker.finish(offer, Succeeded(result="1"))
            done[name] = done.get(name, 0) + 1


async def run_everything(hubs: list[HubProcess], token: str, total: int) -> dict[str, int]:
    """Every task done by the workers of both hubs; how many each worker did."""
    done: dict[str, int] = {}
    async with trio.open_nursery() as nursery:
        for n, hub in enumerate(hubs):
            for m in range(2):
                nursery.start_soon(run_tasks, hub, token, f"hub{n}-w{m}", done)
        while sum(done.values()) < total:
            await trio.sleep(0.02)
        nursery.cancel_scope.cancel()
    return done


LOG_ATTEMPTS = (
    "CREATE TABLE attempt_log (entry BIGSERIAL PRIMARY KEY, tx BIGINT, task_id TEXT, "
    "change INTEGER)",
    """
CREATE FUNCTION log_attempt() RETURNS trigger AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        INSERT INTO attempt_log (tx, task_id, change) VALUES (txid_current(), NEW.task_id, 1);
    ELSIF OLD.state IN ('OFFERED', 'RUNNING') AND NEW.state NOT IN ('OFFERED', 'RUNNING') THEN
        INSERT INTO attempt_log (tx, task_id, change) VALUES (txid_current(), NEW.task_id, -1);
    END IF;
    RETURN NEW;
END $$ LANGUAGE plpgsql
""",
    "CREATE TRIGGER log_attempt AFTER INSERT OR UPDATE ON attempts "
    "FOR EACH ROW EXECUTE FUNCTION log_attempt()",
)
"""Every offer (+1) and end (-1) of an attempt, with its transaction, in the order written."""


def log_attempts(tx: Tx) -> None:
    for statement in LOG_ATTEMPTS:
        tx.run(statement)


def most_live_at_once(rows: list[tuple[Any, ...]]) -> dict[str, int]:
    """Per key, the most attempts live at once, from the log's (entry, transaction, key,
    change) rows.

    A transaction takes effect at its commit, after its last entry, and before any
    transaction that saw its effect writes anything: so transactions are taken in the
    order of their last entries, each with its ends before its offers (it counted the
    live attempts after its ends). An offer counted before another transaction's end
    was committed comes before that end here, as it did in the hub's count."""
    last: dict[int, int] = {}
    for entry, tx, _, _ in rows:
        last[tx] = max(last.get(tx, 0), entry)
    live: dict[str, int] = dict.fromkeys(LIMITS, 0)
    most = dict(live)
    for _, _, key, change in sorted(rows, key=lambda row: (last[row[1]], row[3], row[0])):
        live[key] += change
        most[key] = max(most[key], live[key])
    return most


async def test_two_hubs_keep_every_key_within_its_limit(postgres_url: str) -> None:
    token = queue_with_credential(postgres_url, QUEUE)
    store = Store(postgres_url)
    for key, limit in LIMITS.items():
        set_key_limit(store, QUEUE, key, limit)
    store.read(log_attempts)
    keys = [*LIMITS, ""]
    total = TASKS_PER_KEY * len(keys)
    with trio.fail_after(FAIL_AFTER_S):
        async with (
            hub_process(postgres_url, ENV) as first,
            hub_process(postgres_url, ENV) as second,
        ):
            hubs = [first, second]
            for n, key in zip(range(total), itertools.cycle(keys), strict=False):
                await hubs[n % 2].submit(token, payload=n, concurrency_key=key)
            done = await run_everything(hubs, token, total)
    states = store.read(lambda tx: tx.rows("SELECT state FROM attempts"))
    log = store.read(
        lambda tx: tx.rows(
            "SELECT l.entry, l.tx, t.concurrency_key, l.change FROM attempt_log l "
            "JOIN tasks t ON t.task_id = l.task_id WHERE t.concurrency_key <> '' ORDER BY l.entry"
        )
    )
    store.close()
    assert states == [("SUCCEEDED",)] * total
    assert len(log) == 2 * TASKS_PER_KEY * len(LIMITS)
    assert most_live_at_once(log) == LIMITS
    assert all(done.get(f"hub{n}-w0", 0) + done.get(f"hub{n}-w1", 0) > 0 for n in range(2))
