"""The live status page of a real `python -m blockx serve`, in headless Chromium
(`tests.e2e.browser`): it opens the page, reads the page's own rendering (the
slot grid's data attributes, the charts' data, the tables' text), runs tasks,
and reads again; then it saves screenshots at desktop and phone size."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import h11
import trio
from prometheus_client.parser import text_string_to_metric_families

from blockx._proto.blockx.worker import v1 as pb
from tests.e2e.browser import PHONE, Page, chromium, open_page
from tests.e2e.serve_process import ServeProcess, free_port, serve_process

# What the page shows: read the same way for every check.
READ_PAGE = """(() => {
  const text = (id) => document.getElementById(id).innerText;
  const status = window.blockxStatus;
  if (!status || !status.charts) return "null";  // not loaded, or no snapshot yet
  const chart = (name) => {
    const live = status.charts[name];
    const series = live.data.slice(1).map((column) => column.filter((v) => v !== null));
    return {points: Number(live.element.dataset.points), series};
  };
  return JSON.stringify({
    snapshots: status.snapshots,
    connection: document.getElementById("connection").textContent,
    totals: text("totals"),
    slots: [...document.querySelectorAll("#slots > .slot")].map((cell) => ({
      slot: cell.dataset.slot,
      state: cell.dataset.state,
      task: cell.dataset.task,
      focusable: cell.tabIndex === 0 && Boolean(cell.getAttribute("aria-label")),
      title: cell.title,
    })),
    recent: text("recent"),
    executors: text("executors"),
    rate: chart("rate"),
    latency: chart("latency"),
    calls: chart("calls"),
  });
})()"""
# Resolves once two frames have been laid out and drawn (resize observers included).
NEXT_FRAMES = "new Promise((done) => requestAnimationFrame(() => requestAnimationFrame(done)))"
OVERFLOW = "document.documentElement.scrollWidth - window.innerWidth"
ROUNDS = 4
"""Rounds of short tasks before the screenshots: a few seconds of points."""


def call_list(task_id: str, *calls: tuple[str, list[object]]) -> pb.TaskSpec:
    payload = {"calls": [{"function": function, "args": args} for function, args in calls]}
    return pb.TaskSpec(
        task_id=task_id,
        function_call=pb.FunctionCallConfig(type="call_list"),
        payload=json.dumps(payload).encode(),
    )


async def scrape(port: int) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    client = h11.Connection(h11.CLIENT)
    request = h11.Request(method="GET", target="/metrics", headers=[("host", "127.0.0.1")])
    body = b""
    async with await trio.open_tcp_stream("127.0.0.1", port) as stream:
        await stream.send_all(client.send(request) + client.send(h11.EndOfMessage()))
        while True:
            event = client.next_event()
            if event is h11.NEED_DATA:
                client.receive_data(await stream.receive_some())
            elif isinstance(event, h11.Response):
                assert event.status_code == 200
            elif isinstance(event, h11.Data):
                body += event.data
            elif isinstance(event, h11.EndOfMessage):
                break
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(body.decode())
        for sample in family.samples
    }


def cell_of(shown: dict[str, Any], task_id: str) -> dict[str, Any] | None:
    return next((cell for cell in shown["slots"] if cell["task"] == task_id), None)


def succeeded_shown(shown: dict[str, Any]) -> int:
    total: int = sum(shown["rate"]["series"][0])
    return total


async def run_a_few_tasks(worker: ServeProcess) -> int:
    """Short tasks in rounds of three (the worker's slots), one failing each round, so
    the charts have a few seconds of something; how many succeeded."""
    succeeded = 0
    for round_ in range(ROUNDS):
        tasks = [
            call_list(f"short-{round_}-a", ("demo.sleep", [0.15 * (round_ + 1)])),
            call_list(f"short-{round_}-b", ("demo.add", [round_, 1]), ("demo.sleep", [0.4])),
            call_list(f"short-{round_}-c", ("demo.fail", ["on purpose"])),
        ]
        for task in tasks:
            await worker.call(worker.stub.submit_task, pb.SubmitTaskRequest(task=task))
        await worker.watch(*(task.task_id for task in tasks))
        succeeded += 2
    return succeeded


async def follow_one_task(worker: ServeProcess, page: Page) -> None:
    """page-1 shows RUNNING in its slot's cell, then the cell is FREE, the result is in,
    no executor shows its call running any more, and the charts show it."""
    task = call_list("page-1", ("demo.sleep", [1.5]), ("demo.add", [2, 3]))
    await worker.call(worker.stub.submit_task, pb.SubmitTaskRequest(task=task))
    # Reserved inline (ALLOCATED) first, then RUNNING once activated: a snapshot may
    # fall in between, so wait for the running one.
    running = await page.read_until(
        READ_PAGE, lambda shown: (cell_of(shown, "page-1") or {}).get("state") == "RUNNING"
    )
    assert running["recent"] == "no task has finished yet"
    cell = cell_of(running, "page-1")
    assert cell is not None
    assert "page-1" in cell["title"]
    assert "CALLS" in cell["title"] or "PREPARING" in cell["title"]

    done = await page.read_until(READ_PAGE, lambda shown: "page-1" in shown["recent"])
    assert "SUCCEEDED" in done["recent"]
    assert "1\nsucceeded" in done["totals"]
    assert "1\nretained results" in done["totals"]
    (freed,) = (slot for slot in done["slots"] if slot["slot"] == cell["slot"])
    assert (freed["state"], freed["task"]) == ("FREE", "")
    assert [slot["state"] for slot in done["slots"]] == ["FREE"] * 3
    # The executors answer with their calls' results before the task can end.
    assert "page-1" not in done["executors"]

    # Its second closes and is pushed: the charts show it.
    charted = await page.read_until(READ_PAGE, lambda shown: succeeded_shown(shown) == 1)
    assert charted["rate"]["points"] > 0
    assert charted["latency"]["points"] == charted["rate"]["points"]
    (p50,) = charted["latency"]["series"][0]
    assert 1_500 <= p50 < 10_000
    assert sum(charted["calls"]["series"][0]) == 2


async def test_the_status_page_in_chromium_follows_tasks_in_its_grid_and_charts(
    tmp_path: Path,
) -> None:
    metrics_port = free_port()
    env = {"METRICS_LISTEN": f"127.0.0.1:{metrics_port}"}
    with trio.fail_after(120):
        async with (
            serve_process("--executors", "2", "--slots", "3", env=env) as worker,
            chromium(tmp_path / "profile") as browser,
        ):
            await worker.wait_for_line(f"metrics on http://127.0.0.1:{metrics_port}/metrics")
            page = await open_page(browser, f"http://127.0.0.1:{metrics_port}/")
            before = await page.read_until(
                READ_PAGE,
                lambda shown: (
                    shown["connection"] == "live" and shown["executors"].count("READY") == 2
                ),
            )
            assert before["recent"] == "no task has finished yet"
            assert [(s["slot"], s["state"], s["task"]) for s in before["slots"]] == [
                (f"slot-{index}", "FREE", "") for index in range(3)
            ]
            assert all(slot["focusable"] for slot in before["slots"])
            assert "0\nsucceeded" in before["totals"]
            assert succeeded_shown(before) == 0

            await follow_one_task(worker, page)
            succeeded = 1 + await run_a_few_tasks(worker)
            shown = await page.read_until(
                READ_PAGE, lambda shown: succeeded_shown(shown) == succeeded
            )
            assert sum(shown["rate"]["series"][1]) == ROUNDS  # one failed task a round
            assert shown["snapshots"] > before["snapshots"]
            await page.evaluate(NEXT_FRAMES)
            await page.screenshot("worker-status")

            await page.size(*PHONE, mobile=True)
            await page.evaluate(NEXT_FRAMES)
            assert await page.evaluate("window.innerWidth") == PHONE[0]
            assert await page.evaluate(OVERFLOW) <= 0
            await page.screenshot("worker-status-phone")

            await check_the_scrape(metrics_port, succeeded)


async def check_the_scrape(metrics_port: int, succeeded: int) -> None:
    """The same worker, scraped: the executor gauges the in-process tests cannot see."""
    samples = await scrape(metrics_port)
    executors = {
        state: samples["blockx_executors", frozenset({("state", state)})]
        for state in ("READY", "BUSY", "STARTING", "LOST")
    }
    assert executors["READY"] + executors["BUSY"] == 2
    assert samples["blockx_executors_rss_bytes", frozenset()] > 0
    ok = frozenset({("state", "SUCCEEDED"), ("failure_code", "")})
    assert samples["blockx_tasks_finished_total", ok] == succeeded
    # page-1's two calls, and rounds of one, two and one calls (the last one failed).
    assert samples["blockx_calls_total", frozenset({("outcome", "succeeded")})] == 2 + ROUNDS * 3
