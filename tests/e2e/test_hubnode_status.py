"""A node fed by a hub shows its hub session on its status page: a real hub process and a
real `blockx serve --hub` process, the page's WebSocket read as the page reads it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import trio
from trio_websocket import open_websocket_url

from blockx.autoworker import HubClient
from tests.e2e.hub_process import hub_process, queue_with_credential
from tests.e2e.serve_process import free_port, serve_process

QUEUE = "node-status"
TIMEOUT_S = 90


ADD_TASK = {
    "task_id": "shown-1",
    "builder": "call_list",
    "payload": {"calls": [{"function": "demo.add", "args": [2, 3]}]},
    "plugin": "result",
}
"""A task file's object: the node's task, its value kept by the `result` plugin."""


async def test_a_hub_fed_node_shows_its_session_and_counts_on_its_status_page(
    tmp_path: Path,
) -> None:
    db = str(tmp_path / "hub.sqlite3")
    token = queue_with_credential(db, QUEUE)
    credential_file = tmp_path / "credential"
    credential_file.write_text(token)
    metrics_port = free_port()
    with trio.fail_after(TIMEOUT_S):
        async with hub_process(db) as hub:
            url = f"http://127.0.0.1:{hub.port}"
            hub_args = ("--hub", url, "--hub-queue", QUEUE)
            credential = ("--hub-credential-file", str(credential_file))
            env = {"METRICS_LISTEN": f"127.0.0.1:{metrics_port}"}
            async with serve_process("--slots", "2", *hub_args, *credential, env=env) as node:
                await node.wait_for_line("status page on /")
                async with open_websocket_url(f"ws://127.0.0.1:{metrics_port}/ws") as socket:
                    hub_session = await _hub_where(socket, lambda shown: shown["connected"])
                    assert (hub_session["url"], hub_session["queue"]) == (url, QUEUE)
                    assert (hub_session["started"], hub_session["capacity"]) == (0, 2)
                    producer = HubClient(url=url, credential=token)
                    await producer.submit_task(QUEUE, ADD_TASK)
                    done = await _hub_where(socket, lambda shown: shown["reports_confirmed"])
    assert (done["started"], done["reports_confirmed"], done["running"]) == (1, 1, 0)
    assert (done["reconnects"], done["last_error"]) == (0, "")


async def _hub_where(socket: Any, condition: Any) -> dict[str, Any]:
    """The `hub` part of the first snapshot for which `condition` holds."""
    while True:
        snapshot = json.loads(await socket.get_message())
        assert "hub" in snapshot, snapshot.keys()
        if condition(snapshot["hub"]):
            shown: dict[str, Any] = snapshot["hub"]
            return shown
