"""The live status page of a real `python -m blockx serve`, in headless Chromium
(`tests.e2e.browser`): it opens the page, reads the page's own rendering, runs a
task, and reads again."""

from __future__ import annotations

import json
from pathlib import Path

import h11
import trio
from prometheus_client.parser import text_string_to_metric_families

from blockx._proto.blockx.worker import v1 as pb
from tests.e2e.browser import chromium, open_page
from tests.e2e.serve_process import free_port, serve_process

# What the page shows, as text: read the same way for every check.
READ_PAGE = """(() => {
  const text = (id) => document.getElementById(id).innerText;
  if (!document.getElementById("connection")) return "null";  // not loaded yet
  return JSON.stringify({
    snapshots: window.blockxStatus ? window.blockxStatus.snapshots : 0,
    connection: document.getElementById("connection").textContent,
    totals: text("totals"),
    slots: text("slots"),
    recent: text("recent"),
    executors: text("executors"),
  });
})()"""


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


async def test_the_status_page_in_chromium_follows_a_task_from_running_to_succeeded(
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
            assert before["slots"].count("FREE") == 3
            assert "0\nsucceeded" in before["totals"]

            task = call_list("page-1", ("demo.sleep", [1.5]), ("demo.add", [2, 3]))
            await worker.call(worker.stub.submit_task, pb.SubmitTaskRequest(task=task))
            # Reserved inline (ALLOCATED) first, then RUNNING once activated: a snapshot
            # may fall in between, so wait for the running one.
            running = await page.read_until(
                READ_PAGE, lambda shown: "page-1" in shown["slots"] and "RUNNING" in shown["slots"]
            )
            assert running["recent"] == "no task has finished yet"

            done = await page.read_until(READ_PAGE, lambda shown: "page-1" in shown["recent"])
            assert "SUCCEEDED" in done["recent"]
            assert "1\nsucceeded" in done["totals"]
            assert "page-1" not in done["slots"]
            assert done["slots"].count("FREE") == 3
            assert done["snapshots"] > before["snapshots"]

            # The same worker, scraped: the executor gauges the in-process tests cannot see.
            samples = await scrape(metrics_port)
            executors = {
                state: samples["blockx_executors", frozenset({("state", state)})]
                for state in ("READY", "BUSY", "STARTING", "LOST")
            }
            assert executors["READY"] + executors["BUSY"] == 2
            assert samples["blockx_executors_rss_bytes", frozenset()] > 0
            succeeded = frozenset({("state", "SUCCEEDED"), ("failure_code", "")})
            assert samples["blockx_tasks_finished_total", succeeded] == 1
            assert samples["blockx_calls_total", frozenset({("outcome", "succeeded")})] == 2
