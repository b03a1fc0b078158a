"""The live status page of a real `python -m blockx serve`, in headless Chromium.

Chromium runs with `--remote-debugging-port`; the test drives it over the
DevTools protocol (trio-websocket as the client): it opens the page, reads the
page's own rendering with `Runtime.evaluate`, runs a task, and reads again.
Chromium missing is a failure, not a skip: CI installs it.
"""

from __future__ import annotations

import itertools
import json
import re
import shutil
import subprocess
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import attrs
import h11
import trio
from prometheus_client.parser import text_string_to_metric_families
from trio_websocket import WebSocketConnection, open_websocket_url

from blockx._proto.blockx.worker import v1 as pb
from tests.e2e.serve_process import free_port, serve_process

CHROMIUM_START_TIMEOUT_S = 30
DEVTOOLS_LINE = re.compile(r"DevTools listening on (ws://\S+)")
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


@attrs.define
class Page:
    """One Chromium tab, reached through the browser's DevTools socket."""

    socket: WebSocketConnection
    session_id: str

    async def read(self) -> dict[str, Any] | None:
        """What the page shows, or None before it has loaded."""
        reply = await devtools(
            self.socket,
            "Runtime.evaluate",
            {"expression": READ_PAGE, "returnByValue": True},
            session_id=self.session_id,
        )
        assert "exceptionDetails" not in reply, reply["exceptionDetails"]
        shown: dict[str, Any] | None = json.loads(reply["result"]["value"])
        return shown

    async def read_until(self, condition: Callable[[dict[str, Any]], bool]) -> dict[str, Any]:
        while (shown := await self.read()) is None or not condition(shown):
            await trio.sleep(0.05)
        return shown


_request_ids = itertools.count(1)


def call_list(task_id: str, *calls: tuple[str, list[object]]) -> pb.TaskSpec:
    payload = {"calls": [{"function": function, "args": args} for function, args in calls]}
    return pb.TaskSpec(
        task_id=task_id,
        function_call=pb.FunctionCallConfig(type="call_list"),
        payload=json.dumps(payload).encode(),
    )


async def devtools(
    socket: WebSocketConnection,
    method: str,
    params: dict[str, Any],
    *,
    session_id: str | None = None,
) -> dict[str, Any]:
    """Send one DevTools command and return its result (events in between are skipped)."""
    request_id = next(_request_ids)
    message: dict[str, Any] = {"id": request_id, "method": method, "params": params}
    if session_id is not None:
        message["sessionId"] = session_id
    await socket.send_message(json.dumps(message))
    while True:
        reply = json.loads(await socket.get_message())
        if reply.get("id") != request_id:
            continue
        if "error" in reply:
            raise AssertionError(f"DevTools {method} failed: {reply['error']}")
        result: dict[str, Any] = reply["result"]
        return result


async def _pump(stream: trio.abc.ReceiveStream, log: list[str], found: trio.Event) -> None:
    buffer = b""
    async for chunk in stream:
        buffer += chunk
        *lines, buffer = buffer.split(b"\n")
        for line in lines:
            log.append(line.decode(errors="replace"))
            if DEVTOOLS_LINE.search(log[-1]):
                found.set()


@asynccontextmanager
async def chromium(profile_dir: Path) -> AsyncIterator[WebSocketConnection]:
    """Headless Chromium; yields the browser's DevTools socket."""
    executable = shutil.which("chromium")
    assert executable is not None, "chromium is not installed (Debian package `chromium`)"
    command = [
        executable,
        "--headless",
        "--disable-gpu",
        "--no-sandbox",
        "--disable-dev-shm-usage",
        "--no-first-run",
        "--no-default-browser-check",
        "--remote-debugging-address=127.0.0.1",
        "--remote-debugging-port=0",
        f"--user-data-dir={profile_dir}",
        "about:blank",
    ]
    log: list[str] = []
    found = trio.Event()
    async with trio.open_nursery() as nursery:
        process = await trio.lowlevel.open_process(
            command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
        )
        assert process.stderr is not None
        nursery.start_soon(_pump, process.stderr, log, found)
        try:
            with trio.move_on_after(CHROMIUM_START_TIMEOUT_S):
                await found.wait()
            if not found.is_set():
                raise AssertionError("chromium did not open DevTools:\n" + "\n".join(log))
            match = next(m for line in log if (m := DEVTOOLS_LINE.search(line)))
            async with open_websocket_url(match.group(1), max_message_size=2**24) as socket:
                yield socket
        finally:
            process.terminate()
            with trio.move_on_after(5, shield=True) as waited:
                await process.wait()
            if waited.cancelled_caught:
                process.kill()
                with trio.CancelScope(shield=True):
                    await process.wait()
            nursery.cancel_scope.cancel()


async def open_page(browser: WebSocketConnection, url: str) -> Page:
    target = await devtools(browser, "Target.createTarget", {"url": url})
    attached = await devtools(
        browser, "Target.attachToTarget", {"targetId": target["targetId"], "flatten": True}
    )
    return Page(socket=browser, session_id=attached["sessionId"])


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
                lambda shown: (
                    shown["connection"] == "live" and shown["executors"].count("READY") == 2
                )
            )
            assert before["recent"] == "no task has finished yet"
            assert before["slots"].count("FREE") == 3
            assert "0\nsucceeded" in before["totals"]

            task = call_list("page-1", ("demo.sleep", [1.5]), ("demo.add", [2, 3]))
            await worker.call(worker.stub.submit_task, pb.SubmitTaskRequest(task=task))
            # Reserved inline (ALLOCATED) first, then RUNNING once activated: a snapshot
            # may fall in between, so wait for the running one.
            running = await page.read_until(
                lambda shown: "page-1" in shown["slots"] and "RUNNING" in shown["slots"]
            )
            assert running["recent"] == "no task has finished yet"

            done = await page.read_until(lambda shown: "page-1" in shown["recent"])
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
