"""What the metrics port and the logs show of a task: ids, states and numbers, never its
payload, arguments, labels, outputs or the worker's bearer token."""

from __future__ import annotations

import json

import h11
import trio
from trio_websocket import open_websocket_url

from blockx._proto.blockx.worker import v1 as pb
from blockx.client import WorkerClient
from tests.e2e.serve_process import free_port, serve_process

TOKEN = "token-that-must-stay-hidden"
SECRET = "payload-that-must-stay-hidden"


def task(task_id: str, function: str, *args: object) -> pb.TaskSpec:
    payload = {"calls": [{"function": function, "args": list(args)}]}
    return pb.TaskSpec(
        task_id=task_id,
        function_call=pb.FunctionCallConfig(type="call_list"),
        payload=json.dumps(payload).encode(),
        result_handler=pb.ResultHandler(type="result"),
        labels={"owner": SECRET},
    )


async def http_get(port: int, target: str) -> bytes:
    client = h11.Connection(h11.CLIENT)
    request = h11.Request(method="GET", target=target, headers=[("host", "127.0.0.1")])
    body = b""
    async with await trio.open_tcp_stream("127.0.0.1", port) as stream:
        await stream.send_all(client.send(request) + client.send(h11.EndOfMessage()))
        while True:
            event = client.next_event()
            if event is h11.NEED_DATA:
                client.receive_data(await stream.receive_some())
            elif isinstance(event, h11.Response):
                assert event.status_code == 200, target
            elif isinstance(event, h11.Data):
                body += event.data
            elif isinstance(event, h11.EndOfMessage):
                return body


async def test_the_metrics_port_and_the_log_never_show_payloads_or_the_token() -> None:
    metrics_port = free_port()
    env = {"WORKER_AUTH_TOKEN": TOKEN, "METRICS_LISTEN": f"127.0.0.1:{metrics_port}"}
    with trio.fail_after(60):
        async with (
            serve_process("--executors", "1", env=env) as worker,
            WorkerClient.connect(f"127.0.0.1:{worker.port}", token=TOKEN) as client,
        ):
            await client.submit(task("done", "demo.echo", SECRET))
            done = [u async for u in client.watch(["done"])]
            await client.submit(task("running", "demo.sleep", 30))
            await client.request_slot("reserved")
            metrics = await http_get(metrics_port, "/metrics")
            page = await http_get(metrics_port, "/")
            url = f"ws://127.0.0.1:{metrics_port}/ws"
            async with open_websocket_url(url) as socket:
                snapshot = json.loads(await socket.get_message())

    [finished] = [update for update in done if update.is_terminal]
    assert finished.result is not None
    assert json.loads(finished.result.outputs_json) == [SECRET]  # the owner sees it
    assert {entry["task_id"] for entry in snapshot["tasks"]} == {"running", "reserved"}
    assert [entry["task_id"] for entry in snapshot["recent"]] == ["done"]
    assert snapshot["ready"] is True
    assert b"blockx_" in metrics
    shown = [metrics.decode(), page.decode(), json.dumps(snapshot), "\n".join(worker.log)]
    for text in shown:
        assert SECRET not in text
        assert TOKEN not in text
