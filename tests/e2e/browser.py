"""Headless Chromium for the browser tests, driven over the DevTools protocol.

Chromium runs with `--remote-debugging-port`; the tests talk to it over its
DevTools WebSocket (trio-websocket as the client): open a tab, evaluate
JavaScript in the page to read what it shows or to act on it (fill a field,
press a button), and take screenshots. Chromium missing is a failure, not a
skip: `tools/test` installs it.

Screenshots go to `artifacts_dir()`: `$BLOCKX_TEST_ARTIFACTS` if set (the
`screenshots` nox session points it at `docs/images`), else
`test-artifacts/` at the repository's root, kept after the run.
"""

from __future__ import annotations

import base64
import itertools
import json
import os
import re
import shutil
import subprocess
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, Final

import attrs
import trio
from trio_websocket import WebSocketConnection, open_websocket_url

CHROMIUM_START_TIMEOUT_S: Final = 30
DEVTOOLS_LINE: Final = re.compile(r"DevTools listening on (ws://\S+)")
ROOT: Final = Path(__file__).resolve().parents[2]
DESKTOP: Final = (1280, 800)
PHONE: Final = (390, 844)
POLL_S: Final = 0.05
NAVIGATED: Final = "Inspected target navigated or closed"
"""What DevTools answers an evaluation the page's navigation cut short."""

_request_ids = itertools.count(1)


class DevToolsError(AssertionError):
    """A DevTools command failed; `message` is DevTools' own."""

    def __init__(self, method: str, error: dict[str, Any]) -> None:
        self.message = str(error.get("message", ""))
        super().__init__(f"DevTools {method} failed: {error}")


def artifacts_dir() -> Path:
    """Where screenshots are saved (made if missing)."""
    directory = Path(os.environ.get("BLOCKX_TEST_ARTIFACTS", ROOT / "test-artifacts"))
    directory.mkdir(parents=True, exist_ok=True)
    return directory


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
            raise DevToolsError(method, reply["error"])
        result: dict[str, Any] = reply["result"]
        return result


@attrs.define
class Page:
    """One Chromium tab, reached through the browser's DevTools socket."""

    socket: WebSocketConnection
    session_id: str

    async def command(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        return await devtools(self.socket, method, params, session_id=self.session_id)

    async def evaluate(self, expression: str) -> Any:
        """The value of JavaScript `expression` in the page (awaited if it is a promise);
        an exception thrown there fails the test with its text."""
        reply = await self.command(
            "Runtime.evaluate",
            {"expression": expression, "returnByValue": True, "awaitPromise": True},
        )
        assert "exceptionDetails" not in reply, reply["exceptionDetails"]
        return reply["result"].get("value")

    async def until(self, expression: str, *, what: str = "") -> Any:
        """Evaluate `expression` until its value is truthy (an exception counts as not yet:
        the page may not have loaded, nor an evaluation that a navigation cut short);
        returns that value."""
        while True:
            try:
                reply = await self.command(
                    "Runtime.evaluate",
                    {"expression": expression, "returnByValue": True, "awaitPromise": True},
                )
            except DevToolsError as error:
                if error.message != NAVIGATED:
                    raise
            else:
                if "exceptionDetails" not in reply and (value := reply["result"].get("value")):
                    return value
            await trio.sleep(POLL_S)

    async def read_until(self, expression: str, condition: Callable[[Any], bool]) -> Any:
        """The JSON text `expression` gives, parsed, once `condition` holds for it."""
        while True:
            text = await self.until(expression)
            shown = json.loads(text)
            if shown is not None and condition(shown):
                return shown
            await trio.sleep(POLL_S)

    async def goto(self, url: str) -> None:
        """Load `url` in this tab and wait until the new document (after any redirect)
        has loaded."""
        await self.evaluate("window.blockxLeaving = true")
        await self.command("Page.navigate", {"url": url})
        await self.until("!window.blockxLeaving && document.readyState === 'complete'")

    async def size(self, width: int, height: int, *, mobile: bool = False) -> None:
        """Lay the page out as a window of `width` by `height` CSS pixels."""
        await self.command(
            "Emulation.setDeviceMetricsOverride",
            {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": mobile},
        )

    async def screenshot(self, name: str) -> Path:
        """Save what the tab shows as `<artifacts_dir>/<name>.png`; returns the path."""
        shot = await self.command("Page.captureScreenshot", {"format": "png"})
        path = artifacts_dir() / f"{name}.png"
        path.write_bytes(base64.b64decode(shot["data"]))
        return path


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
        "--hide-scrollbars",
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
            async with open_websocket_url(match.group(1), max_message_size=2**26) as socket:
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
    """A new tab on `url`, laid out at `DESKTOP` size."""
    target = await devtools(browser, "Target.createTarget", {"url": "about:blank"})
    attached = await devtools(
        browser, "Target.attachToTarget", {"targetId": target["targetId"], "flatten": True}
    )
    page = Page(socket=browser, session_id=attached["sessionId"])
    await page.size(*DESKTOP)
    await page.command("Page.enable", {})
    await page.goto(url)
    return page
