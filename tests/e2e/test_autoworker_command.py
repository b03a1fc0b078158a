"""`blockx autoworker`, in a process of its own, against a real hub process.

It runs `examples/autoworker_handlers.py`'s plain function for a task queued
over HTTP, drains at SIGINT and prints its counts; a credential the hub refuses
ends it with exit status 1 and one line naming the refusal.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Final

import trio

from blockx.autoworker import Capability, HubClient
from tests.e2e.hub_process import hub_process, queue_with_credential
from tests.e2e.serve_process import REPO

RUN_TIMEOUT_S: Final = 60
CAPABILITY: Final = Capability(handler="text.normalize", handler_version="v1", payload_version="v1")


def command(url: str, credential_file: Path) -> list[str]:
    return [
        sys.executable,
        "-m",
        "blockx",
        "autoworker",
        "--hub",
        url,
        "--queue",
        "text",
        "--credential-file",
        str(credential_file),
        "--capacity",
        "2",
        "examples.autoworker_handlers:normalize",
    ]


async def test_the_command_runs_a_plain_handler_and_drains_at_sigint(tmp_path: Path) -> None:
    db = str(tmp_path / "hub.sqlite3")
    token = queue_with_credential(db, "text")
    credential_file = tmp_path / "worker.credential"
    credential_file.write_text(token + "\n")
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    with trio.fail_after(RUN_TIMEOUT_S):
        async with hub_process(db, {"LOG_FORMAT": "text"}) as hub, trio.open_nursery() as nursery:
            url = f"http://127.0.0.1:{hub.port}"
            ended: list[subprocess.CompletedProcess[bytes]] = []

            async def run(task_status: trio.TaskStatus[trio.Process]) -> None:
                ended.append(
                    await trio.run_process(
                        command(url, credential_file),
                        cwd=REPO,
                        env=env,
                        capture_stdout=True,
                        capture_stderr=True,
                        check=False,
                        task_status=task_status,
                    )
                )

            worker = await nursery.start(run)
            client = HubClient(url=url, credential=token)
            task = await client.submit("text", CAPABILITY, {"text": "  hello   hub "})
            while (task := await client.task(task["task_id"], wait_ms=5_000))["state"] not in (
                "SUCCEEDED",
                "FAILED",
                "NEEDS_REVIEW",
            ):
                pass
            worker.send_signal(signal.SIGINT)
    assert task["state"] == "SUCCEEDED"
    assert task["result"] == {"text": "HELLO HUB"}
    [done] = ended
    assert done.returncode == 0, done.stderr.decode()
    stats = json.loads(done.stdout.decode().splitlines()[-1])
    assert (stats["started"], stats["reports_confirmed"], stats["running"]) == (1, 1, 0)


async def test_a_refused_credential_ends_the_command_with_status_1(tmp_path: Path) -> None:
    db = str(tmp_path / "hub.sqlite3")
    queue_with_credential(db, "text")
    credential_file = tmp_path / "worker.credential"
    credential_file.write_text("bxc_not_a_credential\n")
    with trio.fail_after(RUN_TIMEOUT_S):
        async with hub_process(db, {"LOG_FORMAT": "text"}) as hub:
            done = await trio.run_process(
                command(f"http://127.0.0.1:{hub.port}", credential_file),
                cwd=REPO,
                capture_stdout=True,
                capture_stderr=True,
                check=False,
            )
    assert done.returncode == 1, done.stderr.decode()
    errors = [line for line in done.stderr.decode().splitlines() if line.startswith("blockx:")]
    assert len(errors) == 1, done.stderr.decode()
    assert "AUTH_FAILED" in errors[0]
    assert json.loads(done.stdout.decode().splitlines()[-1])["started"] == 0


def test_a_bad_function_name_is_a_usage_error_naming_it(tmp_path: Path) -> None:
    credential_file = tmp_path / "worker.credential"
    credential_file.write_text("bxc_x\n")
    for spec, said in (
        ("examples.autoworker_handlers:nope", "a name defined in examples.autoworker_handlers"),
        ("no_such_module_here:f", "an importable module"),
        ("examples.autoworker_handlers", "module:function"),
    ):
        done = subprocess.run(
            [*command("http://127.0.0.1:1", credential_file)[:-1], spec],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=RUN_TIMEOUT_S,
            check=False,
        )
        assert done.returncode == 1
        assert done.stderr.startswith(f"blockx: error: {spec} "), done.stderr
        assert said in done.stderr
