"""The hub's dashboard (`/ui`) in headless Chromium (`tests.e2e.browser`), against a real
hub process on SQLite and an automatic worker running in this process.

An operator is refused with a credential that is not an admin's, signs in with one
(the session cookie is HttpOnly and SameSite=Strict), follows a task from QUEUED to
SUCCEEDED on its page once a worker comes, sees the overview count it live, retries a
task that needs review from the review page, resolves another in its dialog and
retries a third with the bulk form; a POST without the CSRF token is refused, and
signing out ends the session. Each page is saved as a screenshot (`hub-*.png`) once
it shows data.

Wall-clock time: the hub is another process. Each wait is for a condition the page
shows (or the hub's API answers), under a `fail_after`, never a sleep.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Final

import attrs
import trio

from blockx.autoworker import (
    HubClient,
    OutcomeUnknown,
    Worker,
    WorkerExecution,
    WorkerHandler,
    WorkerOptions,
)
from blockx.hub import Right, Store, create_credential, create_queue
from tests.adapters.hub_harness import CAPABILITY, QUEUE
from tests.e2e.browser import DESKTOP, PHONE, Page, chromium, open_page
from tests.e2e.hub_process import HubProcess, hub_process

ENV: Final = {"HUB_POLL_MS": "20", "HUB_LEASE_MS": "2000", "LOG_FORMAT": "text"}
"""A lease of 2 s: a task that works for 1 s has it renewed (a third of the way)."""
HOLD_MS: Final = 1_000
FAIL_AFTER_S: Final = 120
"""Far above what the test takes (about 6 s), for a loaded machine."""
POLL_S: Final = 0.05
REFUSED: Final = "that is not an admin credential of this hub"
COOKIE: Final = "blockx_hub_session"
TASK_STATE: Final = "document.getElementById('task-state').textContent"
NEXT_FRAMES: Final = (
    "new Promise((done) => requestAnimationFrame(() => requestAnimationFrame(done)))"
)
"""Once two frames are drawn: what a change of size set off (resize observers) is done."""
SUCCEEDED_FIGURE: Final = (
    f'document.querySelector(\'[data-queue="{QUEUE}"][data-figure="SUCCEEDED"]\').textContent'
)


def review_row(task_id: str) -> str:
    """JavaScript: the review page's row of task `task_id` (null while it shows none)."""
    return f'document.querySelector(`tr[data-task-id="${{CSS.escape({json.dumps(task_id)})}}"]`)'


@attrs.frozen
class Tokens:
    work: str
    """May submit tasks to `QUEUE` and work on them."""
    admin: str
    producer: str
    """May submit only: no admin right."""


def prepare(db: str) -> Tokens:
    store = Store(db)
    try:
        create_queue(store, QUEUE, 0)
        return Tokens(
            *(
                create_credential(store, QUEUE, frozenset(rights), 0)
                for rights in ({Right.PRODUCER, Right.WORKER}, {Right.ADMIN}, {Right.PRODUCER})
            )
        )
    finally:
        store.close()


async def handle(execution: WorkerExecution) -> Any:
    """Echo the payload; a task whose payload says `unsure` has a first attempt that cannot
    tell whether it had its effect (so a NON_IDEMPOTENT one waits for review)."""
    if execution.payload.get("unsure") and execution.epoch == 1:
        raise OutcomeUnknown("CONNECTION_RESET")
    await trio.sleep(execution.payload.get("hold_ms", 0) / 1000)  # the task's own work
    return {"echo": execution.payload}


@attrs.define
class Dashboard:
    hub: HubProcess
    page: Page
    tokens: Tokens
    nursery: trio.Nursery

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.hub.port}"

    async def goto(self, path: str) -> None:
        await self.page.goto(self.base + path)

    async def submit(self, **fields: Any) -> str:
        return str((await self.hub.submit(self.tokens.work, **fields))["task_id"])

    async def settled(self, task_id: str, state: str) -> dict[str, Any]:
        """The task, from the hub's API, once it is in `state`."""
        while (task := await self.hub.task(self.tokens.work, task_id))["state"] != state:
            await trio.sleep(POLL_S)
        return task

    def start_worker(self) -> None:
        client = HubClient(url=self.base, credential=self.tokens.work)
        handler = WorkerHandler(capability=CAPABILITY, handle=handle)
        options = WorkerOptions(
            queue_id=QUEUE, handlers=[handler], capacity=2, shutdown_timeout_ms=5_000
        )
        self.nursery.start_soon(Worker(client, options).run)


async def submit_credential(page: Page, token: str) -> str:
    """Fill the sign-in form with `token` and submit it; the path of the page it leads to,
    once loaded."""
    await page.evaluate("window.blockxLeaving = true")
    await page.evaluate(
        f"""(() => {{
          const form = document.querySelector('form[action="/ui/sign-in"]');
          form.credential.value = {json.dumps(token)};
          form.requestSubmit();
        }})()"""
    )
    await page.until("!window.blockxLeaving && document.readyState === 'complete'")
    path: str = await page.evaluate("location.pathname")
    return path


async def check_refused_credentials(board: Dashboard) -> None:
    """A token of the right form with a wrong secret, and a producer's, are refused."""
    prefix, _, secret = board.tokens.admin.rpartition(".")
    wrong = prefix + "." + "".join("b" if c == "a" else "a" for c in secret)
    for token in (wrong, board.tokens.producer):
        assert await submit_credential(board.page, token) == "/ui/sign-in"
        message = await board.page.evaluate("document.getElementById('message').textContent")
        assert message == REFUSED


async def check_sign_in(board: Dashboard) -> None:
    """An admin's token signs in; the session cookie is out of scripts' reach and is not
    sent by other sites' requests."""
    assert await submit_credential(board.page, board.tokens.admin) == "/ui/overview"
    assert COOKIE not in await board.page.evaluate("document.cookie")
    cookies = await board.page.command("Network.getCookies", {"urls": [board.base]})
    [cookie] = [c for c in cookies["cookies"] if c["name"] == COOKIE]
    assert (cookie["httpOnly"], cookie["sameSite"], cookie["path"]) == (True, "Strict", "/")


async def check_a_task_followed_until_a_worker_runs_it(board: Dashboard) -> None:
    """The task page shows a task QUEUED while no worker serves the queue, and then,
    without being reloaded, SUCCEEDED once an automatic worker has run it, with the
    renewal of its lease on the time line."""
    task_id = await board.submit(payload={"n": 1, "hold_ms": HOLD_MS})
    await board.goto(f"/ui/task?id={task_id}")
    assert await board.page.until(TASK_STATE) == "QUEUED"
    await board.page.evaluate("window.blockxSamePage = true")
    board.start_worker()
    await board.page.until(f"{TASK_STATE} === 'SUCCEEDED'")
    assert await board.page.evaluate("window.blockxSamePage")
    shown = await board.page.evaluate("document.getElementById('payload').textContent")
    assert json.loads(shown) == {"n": 1, "hold_ms": HOLD_MS}
    [attempt] = (await board.hub.task(board.tokens.work, task_id))["attempts"]
    assert attempt["renewals"] >= 1
    mark = await board.page.evaluate("document.querySelector('#timeline .renewal').title")
    last = await board.page.evaluate(
        "document.getElementById('attempts').rows[0].cells[6].textContent"
    )
    assert mark == f"lease renewed {attempt['renewals']} times, the last at {last}"


async def check_the_overview_counts_live(board: Dashboard) -> None:
    """The overview's SUCCEEDED figure moves when another task succeeds, without a reload;
    the chart of finishes has points. At phone width nothing overflows sideways."""
    await board.goto("/ui/overview")
    assert await board.page.until(SUCCEEDED_FIGURE) == "1"
    await board.page.evaluate("window.blockxSamePage = true")
    await board.submit(payload={"n": 2})
    await board.page.until(f"{SUCCEEDED_FIGURE} === '2'")
    assert await board.page.evaluate("window.blockxSamePage")
    await board.page.until("Number(document.getElementById('chart-finishes').dataset.points) > 0")
    assert await board.page.evaluate("document.getElementById('live').textContent") == "live"
    await board.page.screenshot("hub-overview")
    await board.page.size(*PHONE, mobile=True)
    await board.page.until(f"innerWidth === {PHONE[0]}")
    await board.page.evaluate(NEXT_FRAMES)  # the charts have followed the new width
    await board.page.screenshot("hub-overview-phone")
    overflow = "document.documentElement.scrollWidth <= innerWidth"
    assert await board.page.evaluate(overflow), await board.page.evaluate(
        "[document.documentElement.scrollWidth, innerWidth]"
    )
    await board.page.size(*DESKTOP)


async def check_a_retry_from_the_review_page(board: Dashboard) -> None:
    """A task whose first attempt's outcome is unknown waits for review; Retry on the
    review page queues it again, and the worker runs it to success."""
    task_id = await board.submit(payload={"unsure": True}, idempotency="NON_IDEMPOTENT")
    await board.settled(task_id, "NEEDS_REVIEW")
    await board.goto(f"/ui/review?queue={QUEUE}")
    row = review_row(task_id)
    await board.page.until(f"{row} !== null")
    await board.page.screenshot("hub-review")
    await board.page.evaluate(f"{row}.querySelector('button[data-action=retry]').click()")
    note = await board.page.until("document.getElementById('action-note').textContent")
    assert note == f"task {task_id}: retry done, it is QUEUED now"
    await board.goto(f"/ui/task?id={task_id}")
    await board.page.until(f"{TASK_STATE} === 'SUCCEEDED'")
    await board.page.until("document.querySelectorAll('#timeline .bar.run').length === 2")
    await board.page.screenshot("hub-task")
    task = await board.settled(task_id, "SUCCEEDED")
    assert [attempt["state"] for attempt in task["attempts"]] == ["UNKNOWN", "SUCCEEDED"]
    assert task["result"] == {"echo": {"unsure": True}}


async def check_resolve_and_bulk_retry(board: Dashboard) -> None:
    """Of two tasks that need review, one is resolved FAILED in the review page's dialog
    (its details kept as typed), the other retried by the bulk form once counted."""
    resolved, retried = [
        await board.submit(payload={"unsure": True, "n": n}, idempotency="NON_IDEMPOTENT")
        for n in (1, 2)
    ]
    for task_id in (resolved, retried):
        await board.settled(task_id, "NEEDS_REVIEW")
    await board.goto(f"/ui/review?queue={QUEUE}")
    await board.page.until(
        "document.querySelectorAll('#review-tasks tr[data-task-id]').length === 2"
    )
    await board.page.evaluate(
        f"""(() => {{
          {review_row(resolved)}.querySelector('button[data-action=resolve]').click();
          const form = document.getElementById('resolve-form');
          form.querySelector('input[value=FAILED]').click();
          form.code.value = 'CHARGED_TWICE';
          form.details.value = '{{"amount": 1.10}}';
          form.requestSubmit();
        }})()"""
    )
    note = await board.page.until("document.getElementById('action-note').textContent")
    assert note == f"task {resolved}: resolve done, it is FAILED now"
    await board.page.until("!document.getElementById('resolve-dialog').open")
    bulk = "document.querySelector('form.bulk[data-action=retry]')"
    await board.page.evaluate(f"{bulk}.requestSubmit()")
    count = await board.page.until(f"{bulk}.querySelector('.count').textContent")
    assert count == f"1 task matches in {QUEUE}"
    await board.page.evaluate(f"{bulk}.querySelector('.confirm').click()")
    await board.page.until(f"{bulk}.querySelector('.count').textContent === '1 retried'")
    status, shown = await board.hub.http_text(
        "GET", f"/v1/tasks/{resolved}", token=board.tokens.work
    )
    assert status == 200
    failure = json.loads(shown, parse_float=str)["failure"]  # numbers as the hub wrote them
    assert failure == {"code": "CHARGED_TWICE", "details": {"amount": "1.10"}}
    await board.settled(retried, "SUCCEEDED")


async def check_the_lists(board: Dashboard) -> None:
    """The tasks page lists the queue's tasks (the five submitted so far), the workers page
    the worker's session."""
    await board.goto(f"/ui/tasks?queue={QUEUE}")
    await board.page.until("document.querySelectorAll('#tasks a').length === 5")
    await board.page.screenshot("hub-tasks")
    await board.goto("/ui/workers")
    queue_cell = "document.querySelector('#workers td:nth-child(2)')"
    await board.page.until(f"{queue_cell} && {queue_cell}.textContent === {json.dumps(QUEUE)}")
    await board.page.screenshot("hub-workers")


async def check_csrf(board: Dashboard) -> None:
    """A POST the session's cookie authenticates needs the CSRF token's header."""
    statuses = await board.page.evaluate(
        f"""(async () => {{
          const post = async (action, headers) => (await fetch(
            `/v1/queues/{QUEUE}:${{action}}`,
            {{method: "POST", credentials: "same-origin", headers}},
          )).status;
          const token = document.querySelector('meta[name="csrf-token"]').content;
          return [
            await post("pause", {{}}),
            await post("pause", {{"X-CSRF-Token": token}}),
            await post("resume", {{"X-CSRF-Token": token}}),
          ];
        }})()"""
    )
    assert statuses == [403, 200, 200]


async def check_sign_out(board: Dashboard) -> None:
    """Signing out ends the session: a page asks to sign in again."""
    await board.page.evaluate("window.blockxLeaving = true")
    await board.page.evaluate("document.querySelector('#sign-out button').click()")
    await board.page.until("!window.blockxLeaving && location.pathname === '/ui/sign-in'")
    await board.goto("/ui/overview")
    assert await board.page.evaluate("location.pathname") == "/ui/sign-in"


async def test_an_operator_signs_in_follows_tasks_and_retries_one_from_review(
    tmp_path: Path,
) -> None:
    db = str(tmp_path / "hub.sqlite3")
    tokens = prepare(db)
    with trio.fail_after(FAIL_AFTER_S):
        async with (
            hub_process(db, ENV) as hub,
            chromium(tmp_path / "profile") as browser,
            trio.open_nursery() as nursery,
        ):
            page = await open_page(browser, f"http://127.0.0.1:{hub.port}/ui/sign-in")
            board = Dashboard(hub=hub, page=page, tokens=tokens, nursery=nursery)
            await check_refused_credentials(board)
            await check_sign_in(board)
            await check_a_task_followed_until_a_worker_runs_it(board)
            await check_the_overview_counts_live(board)
            await check_a_retry_from_the_review_page(board)
            await check_resolve_and_bulk_retry(board)
            await check_the_lists(board)
            await check_csrf(board)
            await check_sign_out(board)
            nursery.cancel_scope.cancel()
